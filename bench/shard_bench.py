"""Throughput of the sharded design with 1, 2 and 4 shards, in one run.

A shard is one whole deployment (docs/adr/020e-task-hub-shards.md): here one
local stack each (Azurite, Cosmos server, Service Bus emulator, remote
service, a local host on its own task hub OrderProcessingS<i>), all shards'
agents calling shard 0's remote service, as every shard in Azure calls the
same remote services. For each shard count S the bench starts S stacks, routes
each order to the shard `domain.shards.shard_of` names, keeps K orders in
flight per shard (closed loop, as bench/pipeline_bench.py) until every shard
has processed its orders, and prints:

- throughput: all Processed orders / (last Processed - first post), orders/s;
- each shard's throughput, the host CPU seconds per order (all hosts) and the
  whole stacks' CPU per order (every process of every stack and the bench);
- others_cpu: the share of the machine's CPU that processes outside the
  stacks used meanwhile (other people's work on a shared machine);
- cpus: the cores this machine has (os.cpu_count) and the load average;
  with fewer cores than one shard's processes use at full speed, more shards
  cannot go faster: the ratio says how much of the machine one shard left.

The last line:

    shard-bench: throughput_1=X/s throughput_2=Y/s throughput_4=Z/s ratio_4_to_1=R cpus=C

    python bench/shard_bench.py [--shards 1,2,4] [--orders-per-shard 120] [--in-flight 25]

Each shard gets the same number of orders and the same in-flight count, so S
shards carry S times the load of one: the ratio is that of work done per
second. Figures only; no assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline_bench import (
    BENCH_SETTINGS,
    BenchStack,
    closed_loop,
    cpu_seconds,
    host_pids,
    machine_ticks,
    process_tree_cpu,
    remove_run_dir,
    stack_pids,
    stop_stack,
)

from cli.orders import generate
from devstack.process import exit_on_signals
from devstack.stack import Stack
from domain.shards import shard_of


def shard_overrides(index: int, count: int) -> dict[str, str]:
    return {
        **BENCH_SETTINGS,
        "SHARD_COUNT": str(count),
        "SHARD_INDEX": str(index),
        "TASKHUB_NAME": f"OrderProcessingS{index}",
    }


def start_shards(root: Path, count: int) -> list[Stack]:
    stacks: list[Stack] = []
    try:
        for index in range(count):
            overrides = shard_overrides(index, count)
            if stacks:  # one remote service for every shard: shard 0's
                overrides["REMOTE_SERVICE_URL"] = stacks[0].settings["REMOTE_SERVICE_URL"]
            stack = BenchStack(root / f"shard{index}", overrides=overrides)
            stack.start()
            stacks.append(stack)
    except BaseException:
        for stack in reversed(stacks):
            stop_stack(stack)
        raise
    return stacks


def orders_for(count: int, per_shard: int, prefix: str) -> list[list]:
    """`per_shard` orders for each of `count` shards, routed by shard_of."""
    out: list[list] = [[] for _ in range(count)]
    for order in generate("webshop", "replies-webshop", per_shard * count * 4, prefix, seed=1):
        bucket = out[shard_of(order.AppId, order.OrderID, count)]
        if len(bucket) < per_shard:
            bucket.append(order)
        if all(len(b) == per_shard for b in out):
            return out
    raise RuntimeError("not enough orders generated for every shard")  # pragma: no cover


async def run(count: int, per_shard: int, in_flight: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"shard-bench-{count}-"))
    stacks = await asyncio.to_thread(start_shards, root, count)
    try:
        batches = orders_for(count, per_shard, f"SB-{uuid.uuid4().hex[:4]}")
        await asyncio.sleep(3)  # let the hosts settle
        hosts = [p for s in stacks for p in host_pids(s)]
        ours = [*(p for s in stacks for p in stack_pids(s)), os.getpid()]
        host0 = [cpu_seconds(p) for p in hosts]
        ours0 = process_tree_cpu(ours)
        machine0 = machine_ticks()
        timeout = max(600, per_shard * 4)
        results = await asyncio.gather(
            *(closed_loop(s, b, in_flight, timeout) for s, b in zip(stacks, batches, strict=True))
        )
        host_cpu = sum(cpu_seconds(p) for p in hosts) - sum(host0)
        ours_cpu = process_tree_cpu(ours) - ours0
        machine1 = machine_ticks()
        start = min(r[2] for r in results)
        done = [t for r in results for t in r[1].values()]
        n = max(1, len(done))
        ticks = os.sysconf("SC_CLK_TCK")
        all_s = (machine1[0] - machine0[0]) / ticks
        busy_s = all_s - (machine1[1] - machine0[1]) / ticks
        return {
            "shards": count,
            "processed": len(done),
            "orders": per_shard * count,
            "throughput": len(done) / (max(done) - start) if done else float("nan"),
            "per_shard": [
                len(r[1]) / (max(r[1].values()) - r[2]) if r[1] else float("nan") for r in results
            ],
            "host_cpu": host_cpu / n,
            "stack_cpu": ours_cpu / n,
            "others_cpu": max(0.0, busy_s - ours_cpu) / all_s if all_s > 0 else float("nan"),
            "routed": dict(Counter(len(b) for b in batches)),
        }
    finally:
        for stack in reversed(stacks):
            stop_stack(stack)
        remove_run_dir(root)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--orders-per-shard", type=int, default=120)
    parser.add_argument("--in-flight", type=int, default=25, help="per shard")
    args = parser.parse_args()
    exit_on_signals()
    results = []
    for count in (int(s) for s in args.shards.split(",")):
        r = asyncio.run(run(count, args.orders_per_shard, args.in_flight))
        results.append(r)
        print(
            f"shard-bench-run: shards={r['shards']} orders={r['processed']}/{r['orders']} "
            f"throughput={r['throughput']:.2f}/s per_shard="
            + "/".join(f"{x:.2f}" for x in r["per_shard"])
            + f" host_cpu_s_per_order={r['host_cpu']:.3f} "
            f"stack_cpu_s_per_order={r['stack_cpu']:.3f} others_cpu={100 * r['others_cpu']:.0f}%",
            flush=True,
        )
    by = {r["shards"]: r["throughput"] for r in results}
    ratio = f"{by[4] / by[1]:.2f}" if 1 in by and 4 in by and by[1] > 0 else "n/a"
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        "shard-bench: "
        + " ".join(f"throughput_{s}={t:.2f}/s" for s, t in by.items())
        + f" ratio_4_to_1={ratio} cpus={os.cpu_count()} loadavg={load}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
