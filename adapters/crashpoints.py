"""Crash points for fault-injection tests: `crash_point("starter.after_claim")`
kills the process on the spot (as `kill -9` would: no cleanup, no settlement)
when the environment names that point.

A no-op unless CRASH_POINTS is set (it never is in Azure). Each point fires
once per marker directory (CRASH_POINTS_DIR), so the restarted process runs
on past it, as a process that crashed once would."""

from __future__ import annotations

import os
from pathlib import Path


def crash_point(name: str) -> None:
    points = os.environ.get("CRASH_POINTS")
    if not points or name not in points.split(","):
        return
    marker = Path(os.environ.get("CRASH_POINTS_DIR", ".")) / f"crashed-{name}"
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        return
    os._exit(137)
