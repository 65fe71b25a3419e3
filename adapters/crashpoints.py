"""Crash points for fault-injection tests: a `CrashPoint` hook
(orchestrators.hooks) that kills the process on the spot, as `kill -9` would,
at the points CRASH_POINTS names (never set in Azure). Each fires once per
marker directory, so the restarted process runs on past it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


class EnvCrashPoints:
    """Kills the process at each of `points` the first time it is reached
    (a marker file in `marker_dir` records that it was)."""

    def __init__(self, points: frozenset[str], marker_dir: Path) -> None:
        self.points = points
        self.marker_dir = marker_dir

    def __call__(self, name: str) -> None:
        if name not in self.points:
            return
        try:
            (self.marker_dir / f"crashed-{name}").touch(exist_ok=False)
        except FileExistsError:
            return
        os._exit(137)


def from_environment(environ: Mapping[str, str] = os.environ) -> EnvCrashPoints | None:
    """CRASH_POINTS (comma-separated point names) and CRASH_POINTS_DIR (where
    the markers go, default the working directory)."""
    points = frozenset(p for p in environ.get("CRASH_POINTS", "").split(",") if p)
    if not points:
        return None
    return EnvCrashPoints(points, Path(environ.get("CRASH_POINTS_DIR", ".")))
