"""The order workflow's plan: its steps, in execution order.

Submit writes a state record with these steps, the Scheduler runs them in this
order (and compensates in reverse order of completion), and the Agents map each
name to the remote operation that does or undoes it (agents/steps.py)."""

from __future__ import annotations

STEP_NAMES: tuple[str, ...] = ("reserve-inventory", "charge-payment", "arrange-shipment")
