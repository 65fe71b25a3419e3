"""Imported at start-up by the host processes bench/pipeline_bench.py starts
(its PYTHONPATH names this folder, then the repository): with
COSMOS_CALL_STATS_DIR set, every Cosmos request the product records
(adapters.cosmos_client.RequestCharges.record) is counted by its caller and
kind, and the counts written to <dir>/<pid>.json at most once a second. The
product carries none of this."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

# Frames in these files are the plumbing, not the caller.
_PLUMBING = (
    "adapters/cosmos_client.py",
    "adapters/state_store.py",
    "adapters/recovery_index.py",
    "adapters/orders_db.py",
    "adapters/console_reads.py",
    "bench/probe/",
    "/site-packages/",
    "/asyncio/",
    "/lib/python3",
)


class CallerCounts:
    def __init__(self, directory: str) -> None:
        self._path = Path(directory) / f"{os.getpid()}.json"
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._counts: Counter[str] = Counter()
        self._written = 0.0

    def count(self, kind: str) -> None:
        callers: list[str] = []
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and len(callers) < 2:
            name = frame.f_code.co_filename
            if not any(p in name for p in _PLUMBING):
                callers.append(f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}")
            frame = frame.f_back
        self._counts[f"{' < '.join(callers) or '?'} [{kind}]"] += 1
        now = time.monotonic()
        if now - self._written >= 1.0:
            self._written = now
            tmp = self._path.with_suffix(".tmp")
            tmp.write_text(json.dumps(dict(self._counts)))
            tmp.replace(self._path)


def _install(directory: str) -> None:
    from adapters.cosmos_client import RequestCharges

    counts = CallerCounts(directory)
    record = RequestCharges.record

    def counted(self: Any, kind: str, *args: Any, **kwargs: Any) -> float:
        counts.count(kind)
        return record(self, kind, *args, **kwargs)

    RequestCharges.record = counted  # type: ignore[method-assign]


if os.environ.get("COSMOS_CALL_STATS_DIR"):
    _install(os.environ["COSMOS_CALL_STATS_DIR"])
