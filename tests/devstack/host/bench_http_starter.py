"""Prints how long the official quickstart takes on devstack.host, end to end over HTTP.

`.venv/bin/python -m tests.devstack.host.bench_http_starter [N]`: starts a host on
official_app/, then N times POSTs the HTTP starter and polls statusQueryGetUri (every
20 ms) until Completed. Figures only; nothing is asserted.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.devstack.host.conftest import OFFICIAL_APP, HostProcess


async def one(session: aiohttp.ClientSession, base: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    async with session.post(f"{base}/api/orchestrators/hello_orchestrator") as r:
        links = await r.json()
    t_start = time.perf_counter() - t0
    while True:
        async with session.get(links["statusQueryGetUri"]) as r:
            if (await r.json())["runtimeStatus"] == "Completed":
                return t_start, time.perf_counter() - t0
        await asyncio.sleep(0.02)


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        host = HostProcess(
            Path(tmp) / "hub",
            out,
            {},
            "real",
            Path(tmp) / "host.log",
            app_dir=OFFICIAL_APP,
            hub="OfficialHub",
            app="function_app:myApp",
        ).start()
        try:
            async with aiohttp.ClientSession() as session:
                await one(session, host.base)  # warm-up
                runs = [await one(session, host.base) for _ in range(n)]
                t0 = time.perf_counter()
                await asyncio.gather(*(one(session, host.base) for _ in range(n)))
                concurrent = time.perf_counter() - t0
        finally:
            host.stop()
    starts = sorted(r[0] * 1000 for r in runs)
    totals = sorted(r[1] * 1000 for r in runs)
    print(f"quickstart (HTTP start + 3 activities + poll), sequential, n={n}")
    print(
        f"  HTTP starter answer: median {statistics.median(starts):.1f} ms, max {starts[-1]:.1f} ms"
    )
    print(
        f"  start to Completed:  median {statistics.median(totals):.1f} ms, max {totals[-1]:.1f} ms"
    )
    print(
        f"  {n} at once: all Completed in {concurrent * 1000:.0f} ms ({n / concurrent:.1f} orchestrations/s)"
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
