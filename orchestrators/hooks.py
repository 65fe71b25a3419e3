"""Hooks the composition root may give the Scheduler's use cases.

`CrashPoint`: called with a point's name at each step boundary a fault test
may kill the process at ("starter.after_claim", "workflow.after_send",
"bridge.after_raise"). Product code only calls it; the root chooses what it
does (bootstrap: adapters.crashpoints when the environment names points, the
no-op otherwise, always in Azure)."""

from __future__ import annotations

from typing import Protocol


class CrashPoint(Protocol):
    def __call__(self, name: str) -> None: ...


def no_crash_point(name: str) -> None:
    """The default hook: no fault injection."""
