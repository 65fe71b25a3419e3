"""Where a local host process spends its CPU per order, from a yappi profile of it.

Record one with the bench's probe (bench/probe/sitecustomize.py; yappi installed apart,
`pip install yappi`, and any other simulation on the machine paused):

    python bench/pipeline_bench.py --configs 1x50 --orders 400 --set HOST_YAPPI=/tmp/prof
    python bench/host_yappi.py /tmp/prof/<pid>.yappi 400

and it prints, per order, each owner's own CPU time: the local host's code (devstack/host),
the product's packages, asyncio, and the SDKs and libraries by package. The standard
library's time (json, sqlite3, threading, ...) and orjson's go to the functions that
called it, in proportion to their calls' time, up the call graph until an owner is met.
Then the local host's functions, each with the standard library it called. The clock is
yappi's CPU clock, which charges no wait for the GIL to the code that waits (py-spy's
samples do: bench/host_profile.py). Under the profiler the host runs about five times
slower, so work done per unit of time (polls, heartbeats) weighs more per order than at
full speed: compare runs recorded the same way. Figures only.
"""

from __future__ import annotations

import argparse
import pstats
import sys
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository's packages by name
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.host_profile import PRODUCT

LOCAL_HOST = "local host"
SDKS = (
    (("azure/servicebus",), "azure-servicebus SDK"),
    (("aiohttp", "azure/core", "yarl", "multidict", "aiohappyeyeballs", "certifi"), "HTTP/TLS"),
    (("azure/cosmos",), "azure-cosmos SDK"),
    (("azure/durable_functions",), "durable SDK"),
    (("opentelemetry", "azure/monitor"), "telemetry"),
    (("azure/functions", "azurefunctions"), "azure-functions library"),
)
# Charged to their callers, as the standard library is.
PASS_THROUGH = ("orjson", "dateutil")

Key = tuple[str, int, str]


def owner(key: Key) -> str | None:
    """Who owns a function's own time; None: its callers do."""
    path, _, name = key
    if "/devstack/host/" in path:
        return f"{LOCAL_HOST}:{path.rsplit('/', 1)[-1]}:{name}"
    if "site-packages/" in path:
        package = path.split("site-packages/", 1)[1]
        if package.startswith(PASS_THROUGH):
            return None
        for prefixes, label in SDKS:
            if package.startswith(prefixes):
                return label
        return "other: " + package.split("/", 1)[0]
    if "/lib/python" not in path and any(f"/{p}" in path for p in PRODUCT):
        return "product"
    if "/asyncio/" in path:
        return "asyncio"
    if path.endswith("/ssl.py"):
        return "HTTP/TLS"
    return None


def shares(stats: dict[Key, Any]) -> Counter[str]:
    """Seconds per owner, the unowned time split among callers up the call graph."""
    memo: dict[Key, dict[str, float]] = {}

    def split(key: Key, path: tuple[Key, ...]) -> dict[str, float]:
        if key in memo:
            return memo[key]
        mine = owner(key)
        if mine is not None:
            memo[key] = {mine: 1.0}
            return memo[key]
        callers = stats.get(key, (0, 0, 0, 0, {}))[4]
        total = sum(v[3] for v in callers.values())
        if key in path or not callers or total <= 0:
            return {"standard library, no owner found": 1.0}
        out: Counter[str] = Counter()
        for caller, v in callers.items():
            for name, fraction in split(caller, (*path, key)).items():
                out[name] += fraction * v[3] / total
        memo[key] = dict(out)
        return memo[key]

    seconds: Counter[str] = Counter()
    for key, v in stats.items():
        if v[2] > 0:
            for name, fraction in split(key, ()).items():
                seconds[name] += v[2] * fraction
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a <pid>.yappi file (pstats format)")
    parser.add_argument("orders", type=int, help="orders the run completed")
    parser.add_argument("--top", type=int, default=30, help="local host functions to list")
    args = parser.parse_args()
    seconds = shares(pstats.Stats(args.profile).stats)  # type: ignore[attr-defined]
    per_order = 1000 / args.orders
    owners: Counter[str] = Counter()
    host: Counter[str] = Counter()
    for name, s in seconds.items():
        if name.startswith(LOCAL_HOST + ":"):
            owners[LOCAL_HOST] += s
            host[name.split(":", 1)[1]] += s
        else:
            owners[name] += s
    whole = sum(owners.values())
    print(f"yappi CPU ms per order ({args.orders} orders)")
    for name, s in owners.most_common():
        if s * per_order >= 0.5:
            print(f"  {name:40s} {s * per_order:8.2f}  {100 * s / whole:5.1f} %")
    print(f"  {'whole process':40s} {whole * per_order:8.2f}")
    print(f"the local host's functions (with the standard library they call), top {args.top}")
    for name, s in host.most_common(args.top):
        print(f"  {name:60s} {s * per_order:6.2f}")


if __name__ == "__main__":
    main()
