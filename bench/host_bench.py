"""What the local host alone does: Durable throughput and CPU with 1 and 2 host processes.

No product code and no Service Bus: the official quickstart orchestration (three
activities in a chain, four episodes, as a three-step order has at best) on
`tests/devstack/host/official_app`, N instances started together through the hosts'
durable HTTP APIs (alternately), on one task hub shared by the hosts. Prints per run the
orchestrations per second (first start to last completion, from the hub), host CPU per
orchestration (all hosts) and each host's share of the CPU. Figures only.

    python bench/host_bench.py [--orchestrations 400] [--hosts 1,2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from pipeline_bench import cpu_seconds

from tests.devstack.host.conftest import OFFICIAL_APP, HostProcess

HUB = "OfficialHub"


def _hub_counts(db_path: Path) -> tuple[int, float | None, float | None, int]:
    with sqlite3.connect(db_path) as db:
        done, first, last = db.execute(
            "SELECT COUNT(*), MIN(created_epoch), MAX(last_updated_time) FROM instances WHERE status='Completed'"
        ).fetchone()
        episodes = db.execute(
            "SELECT COUNT(*) FROM history WHERE json_extract(event, '$.EventType') = 12"
        ).fetchone()[0]
    last_epoch = datetime.fromisoformat(last).timestamp() if last else None
    return done, first, last_epoch, episodes


async def run(n: int, hosts: int) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="host-bench-"))
    (tmp / "out").mkdir()
    procs = [
        HostProcess(
            tmp / "hub",
            tmp / "out",
            {},
            "real",
            tmp / f"host{i}.log",
            ["--lease-seconds", "5"],
            app_dir=OFFICIAL_APP,
            hub=HUB,
            app="function_app:myApp",
        ).start()
        for i in range(hosts)
    ]
    try:
        pids = [p.proc.pid for p in procs if p.proc]
        cpu0 = [cpu_seconds(p) for p in pids]
        async with aiohttp.ClientSession() as http:

            async def start(i: int) -> None:
                base = procs[i % hosts].base
                async with http.post(
                    f"{base}/durabletask/orchestrators/hello_orchestrator/bench-{i}",
                    data=json.dumps(None),
                    headers={"Content-Type": "application/json"},
                ) as r:
                    assert r.status == 202, await r.text()

            await asyncio.gather(*(start(i) for i in range(n)))
        db_path = tmp / "hub" / f"{HUB}.sqlite"
        deadline = time.time() + max(300, n)
        while time.time() < deadline:
            done, first, last, episodes = _hub_counts(db_path)
            if done >= n:
                break
            await asyncio.sleep(0.5)
        cpu = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
        done, first, last, episodes = _hub_counts(db_path)
        rate = done / (last - first) if done and last and first and last > first else float("nan")
        return (
            f"host-bench: hosts={hosts} orchestrations={done}/{n} throughput={rate:.1f}/s "
            f"activities_per_s={3 * rate:.1f} episodes_per_orchestration={episodes / max(1, done):.1f} "
            f"host_cpu_ms_per_orchestration={1000 * sum(cpu) / max(1, done):.2f} "
            f"cpu_share={'/'.join(f'{c / max(1e-9, sum(cpu)):.0%}' for c in cpu)}"
        )
    finally:
        for p in procs:
            p.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orchestrations", type=int, default=400)
    parser.add_argument("--hosts", default="1,2")
    args = parser.parse_args()
    for hosts in (int(h) for h in args.hosts.split(",")):
        print(asyncio.run(run(args.orchestrations, hosts)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
