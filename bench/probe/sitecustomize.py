"""Imported at start-up by the host processes bench/pipeline_bench.py starts
(its PYTHONPATH names this folder, then the repository): with
COSMOS_CALL_STATS_DIR set, every Cosmos request the product records
(adapters.cosmos_client.RequestCharges.record) is counted by its caller and
kind, and the counts written to <dir>/<pid>.json at most once a second; with
HOST_TIMINGS=1, `Timings` too; with HOST_YAPPI=DIR, a CPU-clock profile of each host
into DIR (`_install_yappi`). The product carries none of this."""

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


class Timings:
    """With HOST_TIMINGS=1 (`pipeline_bench.py --set HOST_TIMINGS=1`): where an
    order's time goes inside a host, written to <dir>/<pid>.timing (JSON) at most
    once a second and summed by `python bench/host_timings.py RUN_DIR`: each
    Scheduler activity and each Service Bus send (count, seconds, and how
    often a send found its link busy), Submit's handler, and the admission
    document's takes (slots wanted and granted) and counts (limit, rate)."""

    def __init__(self, directory: str) -> None:
        self._path = Path(directory) / f"{os.getpid()}.timing"
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self.sums: Counter[str] = Counter()
        self.counts: list[dict[str, Any]] = []
        self._written = 0.0

    def add(self, name: str, seconds: float, n: int = 1) -> None:
        self.sums[f"{name} n"] += n
        self.sums[f"{name} s"] += seconds
        self.flush()

    def flush(self) -> None:
        now = time.monotonic()
        if now - self._written >= 1.0:
            self._written = now
            tmp = self._path.with_suffix(".timing-tmp")
            tmp.write_text(json.dumps({"sums": dict(self.sums), "counts": self.counts}))
            tmp.replace(self._path)


def _install_timings(directory: str) -> None:
    from activities import scheduler_activities as sa
    from adapters import servicebus as sb
    from domain import admission
    from submit import handler as submit

    t = Timings(directory)

    def timed(owner: Any, method: str, label: Any) -> None:
        original = getattr(owner, method)

        async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return await original(self, *args, **kwargs)
            finally:
                t.add(label(*args), time.perf_counter() - began)

        setattr(owner, method, wrapper)

    timed(sa.SchedulerActivities, "run", lambda name, *_: f"activity {name}")
    timed(submit.SubmitHandler, "handle", lambda *_: "submit handle")

    send = sb.ServiceBusPublisher._send

    async def timed_send(self: Any, queue: str, message: Any) -> None:
        busy = all(self._busy.get((queue, k), 0) for k in range(self._links))
        began = time.perf_counter()
        try:
            await send(self, queue, message)
        finally:
            t.add(f"send {queue}", time.perf_counter() - began)
            t.sums[f"send {queue} found every link busy"] += busy

    sb.ServiceBusPublisher._send = timed_send  # type: ignore[method-assign]
    take, recount = admission.take, admission.recount

    def counted_take(state: Any, want: int, now: Any, retries: int = 0) -> Any:
        new, granted = take(state, want, now, retries)
        t.sums["admission take n"] += 1
        t.sums["admission slots wanted"] += want
        t.sums["admission slots granted"] += granted
        t.sums["admission take refused"] += granted == 0
        t.flush()
        return new, granted

    def counted_recount(state: Any, counted: int, began: Any, **kwargs: Any) -> Any:
        new = recount(state, counted, began, **kwargs)
        t.counts.append(
            {
                "at": time.time(),
                "counted": counted,
                "limit": new.limit,
                "rate": round(new.rate, 2),
                "leased": sum(lease.slots for lease in new.leases),
            }
        )
        t.flush()
        return new

    admission.take, admission.recount = counted_take, counted_recount


def _install_yappi(directory: str) -> None:
    """With HOST_YAPPI=DIR (`pipeline_bench.py --set HOST_YAPPI=DIR`, yappi installed apart:
    `pip install yappi`): the host process runs under yappi's CPU clock, builtins and every
    thread included, and writes DIR/<pid>.yappi (pstats format) when the stack stops it
    (its SIGTERM, before the drain) or on SIGUSR1. `python bench/host_yappi.py FILE ORDERS`
    sums it by owner per order. Under the profiler the host runs about five times slower,
    so work done per unit of time (polls, heartbeats) weighs more per order."""
    import asyncio.unix_events
    import signal

    try:
        import yappi
    except ImportError:
        raise SystemExit("HOST_YAPPI=DIR needs yappi in the venv: pip install yappi") from None
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True, profile_threads=True)
    written: list[bool] = []

    def dump(*_: Any) -> None:
        if written:
            return
        written.append(True)
        yappi.stop()
        Path(directory).mkdir(parents=True, exist_ok=True)
        yappi.get_func_stats().save(str(Path(directory) / f"{os.getpid()}.yappi"), type="pstat")

    signal.signal(signal.SIGUSR1, dump)
    loop_class = asyncio.unix_events._UnixSelectorEventLoop
    add = loop_class.add_signal_handler

    def add_signal_handler(self: Any, sig: int, callback: Any, *args: Any) -> None:
        if sig != signal.SIGTERM:
            return add(self, sig, callback, *args)

        def first_dump(*a: Any) -> None:
            dump()
            callback(*a)

        return add(self, sig, first_dump, *args)

    loop_class.add_signal_handler = add_signal_handler  # type: ignore[method-assign]


if os.environ.get("COSMOS_CALL_STATS_DIR"):
    _install(os.environ["COSMOS_CALL_STATS_DIR"])
    if os.environ.get("HOST_TIMINGS") == "1":
        _install_timings(os.environ["COSMOS_CALL_STATS_DIR"])
    # sys.argv does not name the module yet at this point; the interpreter's own argv does.
    if os.environ.get("HOST_YAPPI") and "devstack.host" in sys.orig_argv:
        _install_yappi(os.environ["HOST_YAPPI"])
