"""Where a local host process spends its CPU, from a py-spy profile of it.

Reads py-spy's raw (collapsed-stack) output of one `devstack.host` process, for example
recorded while `bench/pipeline_bench.py --configs 1x50 --orders 400` runs:

    py-spy record --pid HOST_PID --rate 100 --format raw --duration 25 --nonblocking -o host.raw
    python bench/host_profile.py host.raw

and prints each owner's share of the busy samples. A sample belongs to the innermost
frame that names an owner: the local host's own code (devstack/host: the task hub, the
dispatch loops, the triggers, the durable HTTP API), the product's packages, or one of
the SDKs and libraries they call. Samples py-spy counts as active while the thread waits
(epoll, a condition, an idle executor worker) are left out and counted apart. py-spy
samples threads that are runnable, not only running: on a machine with more runnable
threads than cores the shares hold, the sample counts do not. Figures only.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

PRODUCT = (
    "domain/",
    "adapters/",
    "activities/",
    "agents/",
    "orchestrators/",
    "submit/",
    "supervisor/",
    "reporting/",
    "triggers/",
    "bootstrap.py",
    "function_app.py",
)
WAITS = (
    "EpollSelector.select",
    "Condition.wait",
    "_worker (concurrent/futures/thread.py:81)",
    "Event.wait",
    "Thread.join",
)
LOCAL_HOST = "local host (devstack/host)"
LOOP = "asyncio event loop itself"


def _file(frame: str) -> str:
    m = re.search(r"\(([^()]+):\d+\)$", frame)
    return m.group(1) if m else ""


def owner(frames: list[str]) -> str:
    for frame in reversed(frames):
        f = _file(frame)
        if f.startswith("devstack/host/__main__.py"):
            return LOOP  # the loop's own scheduling, reached from the host's main()
        if f.startswith("devstack/host/"):
            return LOCAL_HOST
        if f.startswith(PRODUCT):
            return "product code"
        if "durable_functions/" in f:
            return "durable SDK (replay, client)"
        if "servicebus/" in f:
            return "azure-servicebus SDK"
        if "cosmos/" in f:
            return "azure-cosmos SDK"
        if "aiohttp/" in f or f.startswith("ssl") or "core/pipeline" in f or "sslproto" in f:
            return "HTTP/TLS (aiohttp, azure-core, ssl)"
        if "opentelemetry" in f or "trace/" in f:
            return "telemetry"
    return "other"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", help="py-spy --format raw output of one host process")
    parser.add_argument("--top", type=int, default=12, help="local-host functions to list")
    args = parser.parse_args()
    owners: Counter[str] = Counter()
    host_functions: Counter[str] = Counter()
    busy = waits = 0
    with open(args.raw, encoding="utf-8") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(count)
            frames = stack.split(";")
            if any(w in frames[-1] for w in WAITS):
                waits += n
                continue
            busy += n
            who = owner(frames)
            owners[who] += n
            if who == LOCAL_HOST:
                inner = [fr for fr in frames if _file(fr).startswith("devstack/host/")][-1]
                host_functions[re.sub(r" \((.*):\d+\)$", r" [\1]", inner)] += n
    if not busy:
        print("host-profile: no busy samples")
        return 1
    for who, n in owners.most_common():
        print(f"{100 * n / busy:5.1f}%  {n:6d}  {who}")
    print(f"busy samples {busy}, waiting samples left out {waits}")
    print(f"innermost local-host functions (of {owners[LOCAL_HOST]} samples):")
    for fn, n in host_functions.most_common(args.top):
        print(f"  {n:6d}  {fn}")
    print(f"host-profile: local_host_share={100 * owners[LOCAL_HOST] / busy:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
