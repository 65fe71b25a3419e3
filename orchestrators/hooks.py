"""Hooks the composition root may give the Scheduler's use cases.

`CrashPoint`: called with a point's name ("starter.after_claim", ...) at each
step boundary a fault test may kill the process at; the root chooses what it
does (adapters.crashpoints when the environment names points, else a no-op)."""

from __future__ import annotations

from typing import Protocol


class CrashPoint(Protocol):
    def __call__(self, name: str) -> None: ...


def no_crash_point(name: str) -> None:
    """The default hook: no fault injection."""
