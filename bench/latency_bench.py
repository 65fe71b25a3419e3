"""Submit-to-Processed latency of lone orders and of a burst of 20, on the local stack.

Starts the whole local stack with one host and the app's own settings (the
template's starter schedule unless --starter-schedule says otherwise), posts one
warm-up order, then `--singles` orders one at a time (each waits for the previous
one's `Processed`; a random pause before each spreads the posts over the
starter's tick, so the figures are not phase-locked to it), then `--burst` orders
together. Latency is the `Processed` status's timestamp minus the post time.
The last line is

    bench-latency: single_p50=S s single_p95=T s burst20_p50=U s

    python bench/latency_bench.py [--singles 10] [--burst 20] [--starter-schedule "*/5 * * * * *"]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver, ServiceBusSender
from pipeline_bench import cpu_seconds, host_pids, remove_run_dir, start_stack, stop_stack

from cli.orders import generate
from devstack.process import exit_on_signals
from domain.codec import encode


async def post_and_wait(
    sender: ServiceBusSender, receiver: ServiceBusReceiver, orders: list, timeout: float
) -> list[float]:
    """Post `orders` together; the latency of each, in seconds, once all are Processed."""
    await sender.send_messages(
        [ServiceBusMessage(encode(o), message_id=f"submit/{o.OrderID}") for o in orders]
    )
    posted = time.time()
    want = {o.OrderID for o in orders}
    done: dict[str, float] = {}
    deadline = posted + timeout
    while len(done) < len(want) and time.time() < deadline:
        for m in await receiver.receive_messages(max_message_count=100, max_wait_time=0.5):
            update = json.loads(b"".join(m.body))
            if update["Status"] == "Processed" and update["OrderID"] in want:
                done[update["OrderID"]] = (
                    datetime.fromisoformat(update["Timestamp"]).timestamp() - posted
                )
    if len(done) < len(want):
        raise RuntimeError(
            f"{len(want) - len(done)} of {len(want)} orders not Processed within {timeout:.0f}s"
        )
    return sorted(done.values())


def pct(values: list[float], q: float) -> float:
    return sorted(values)[int(q * (len(values) - 1))]


async def run(singles: int, burst: int, overrides: dict[str, str], pause: float) -> int:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    # In a worker thread: starting the stack blocks, and it creates the Cosmos
    # containers with an asyncio.run of its own, which cannot run inside this loop.
    stack = await asyncio.to_thread(start_stack, run_dir, 1, overrides)
    try:
        prefix = f"LAT-{uuid.uuid4().hex[:4]}"
        batch = list(generate("webshop", "replies-webshop", 1 + singles + burst, prefix, seed=2))
        rng = random.Random(7)
        await asyncio.sleep(3)  # let the host create containers and settle
        async with ServiceBusClient.from_connection_string(
            stack.settings["ServiceBusConnection"]
        ) as bus:
            sender = bus.get_queue_sender("orders-webshop")  # the webshop's ingress queue
            receiver = bus.get_queue_receiver(
                "replies-webshop", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            )
            async with sender, receiver:
                warm = await post_and_wait(sender, receiver, batch[:1], timeout=120)
                pid = host_pids(stack)[0]
                cpu0 = cpu_seconds(pid)
                single: list[float] = []
                for order in batch[1 : 1 + singles]:
                    await asyncio.sleep(rng.uniform(0, pause))
                    single += await post_and_wait(sender, receiver, [order], timeout=120)
                    print(f"single order: {single[-1]:.2f} s", flush=True)
                cpu_single = (cpu_seconds(pid) - cpu0) / max(1, singles)
                await asyncio.sleep(rng.uniform(0, pause))
                together = await post_and_wait(sender, receiver, batch[1 + singles :], timeout=300)
        print(
            f"warm-up order: {warm[0]:.2f} s; host CPU per lone order (idle time included): {cpu_single:.3f} s"
        )
        print(f"singles: {', '.join(f'{x:.2f}' for x in single)}")
        print(
            f"burst of {burst}: min {together[0]:.2f} s, p50 {statistics.median(together):.2f} s, "
            f"max {together[-1]:.2f} s"
        )
        print(
            f"bench-latency: single_p50={statistics.median(single):.2f} s single_p95={pct(single, 0.95):.2f} s "
            f"burst{burst}_p50={statistics.median(together):.2f} s"
        )
        return 0
    finally:
        await asyncio.to_thread(stop_stack, stack)
        remove_run_dir(run_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--singles", type=int, default=10)
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument(
        "--starter-schedule",
        default=None,
        help="STARTER_SCHEDULE for the run (default: the app's template setting)",
    )
    parser.add_argument(
        "--pause",
        type=float,
        default=5.0,
        help="the longest random pause before each lone order (s): one starter period",
    )
    args = parser.parse_args()
    exit_on_signals()
    overrides = {"STARTER_SCHEDULE": args.starter_schedule} if args.starter_schedule else {}
    return asyncio.run(run(args.singles, args.burst, overrides, args.pause))


if __name__ == "__main__":
    sys.exit(main())
