"""A burst against a rate-limited downstream: does the pipeline keep its goodput?

Starts the local stack (one host, as `make bench` does), holds the remote
service to a fixed rate (a `ratelimit` fault rule over every service: calls
over it answer 429 with Retry-After), posts N valid orders at once, and
watches until every order is terminal (or the time runs out). It prints:

- per minute from the first post: orders Processed, the calls that took
  (Processed x steps per order, as calls/s) and that as a share of the
  service's rate (goodput); the minimum leaves out the first minute and the
  drain (minutes that began with less work left than the rate serves in one);
- attempts per order (the records' Attempt at the end: mean and max);
- the peak of Processing: the highest COUNT of Processing records the bench
  saw (it counts every 2 s itself, on the state container) and the highest
  figure the Starter's gauge showed; the cap is MAX_PROCESSING;
- the remote service's calls per order (429s included);
- per minute, the peak of Processing and the admission limit (domain.admission)
  at its end.

The issue's figures (issue 43, "Done when"): after the first minute goodput
every minute at least 70 % of the service's rate; at most 1.2 attempts per
order with no faults injected; Processing never above the cap. The last line:

    burst: orders=N rate=R/s cap=C processed=P minutes=M min_goodput_after_first=G%
           attempts_per_order=A max_attempts=X peak_processing=K peak_gauge=J calls_per_order=Q
           hosts=H

    python bench/burst_bench.py [--orders 2000] [--rate 8] [--cap 500] [--hosts 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from bench.pipeline_bench import BENCH_SETTINGS, remove_run_dir, start_stack, stop_stack
from cli.orders import generate
from devstack.process import exit_on_signals
from domain.codec import encode
from domain.models import ProcessState
from domain.steps import DEFAULT_CATALOG

TERMINAL = {"Processed", "Failed", "Compensated", "CompensationFailed", "Rejected"}


async def _store(stack):
    """The product's own state store over the stack's Cosmos (with its client, to close)."""
    from adapters.cosmos_client import build_client
    from adapters.settings import load_settings
    from adapters.state_store import CosmosStateStore

    cfg = load_settings(stack.settings)
    cosmos = build_client(cfg.state_account)
    container = cosmos.get_database_client(cfg.state_database).get_container_client(
        cfg.state_container
    )
    return cosmos, CosmosStateStore(container)


async def watch_processing(
    store, peaks: dict[str, int], samples: list[tuple[float, int, int | None]], stop: asyncio.Event
) -> None:
    """Count Processing (and read the Starter's gauge and the admission limit)
    every 2 s; keep the peaks and the samples (time, Processing, limit)."""
    while not stop.is_set():
        try:
            processing = await store.count_in_state(ProcessState.PROCESSING)
            peaks["count"] = max(peaks["count"], processing)
            gauge = await store.read_backlog_gauge()
            if gauge is not None and gauge.processing is not None:
                peaks["gauge"] = max(peaks["gauge"], gauge.processing)
            admitted = await store.read_admission()
            samples.append((time.time(), processing, admitted[0].limit if admitted else None))
        except Exception as exc:  # a missed sample is said, never guessed
            print(f"burst: processing sample failed: {type(exc).__name__}", file=sys.stderr)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2)


async def burst(stack, orders: int, rate: float, timeout: float) -> dict:
    """Post `orders` at once with the service held to `rate`; what happened."""
    remote = stack.settings["REMOTE_SERVICE_URL"]
    async with aiohttp.ClientSession() as http:
        response = await http.post(
            f"{remote}/_admin/faults", json={"kind": "ratelimit", "per_second": rate}
        )
        assert response.status == 201, await response.text()
    await asyncio.sleep(3)  # let the host create its containers and settle
    prefix = f"BURST-{uuid.uuid4().hex[:4]}"
    batch = list(generate("webshop", "replies-webshop", orders, prefix, seed=1))
    cosmos, store = await _store(stack)
    peaks = {"count": 0, "gauge": 0}
    samples: list[tuple[float, int, int | None]] = []
    stop = asyncio.Event()
    ended: dict[str, tuple[str, float]] = {}
    async with cosmos:
        watcher = asyncio.create_task(watch_processing(store, peaks, samples, stop))
        async with ServiceBusClient.from_connection_string(
            stack.settings["ServiceBusConnection"]
        ) as bus:
            sender = bus.get_queue_sender("orders-webshop")
            receiver = bus.get_queue_receiver(
                "replies-webshop", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            )
            async with sender, receiver:
                start = time.time()
                for i in range(0, len(batch), 100):
                    await sender.send_messages(
                        [
                            ServiceBusMessage(encode(o), message_id=f"submit/{o.OrderID}")
                            for o in batch[i : i + 100]
                        ]
                    )
                posted = time.time()
                last_note = start
                while len(ended) < orders and time.time() < start + timeout:
                    for m in await receiver.receive_messages(
                        max_message_count=200, max_wait_time=1
                    ):
                        update = json.loads(b"".join(m.body))
                        oid, status = update["OrderID"], update["Status"]
                        if status in TERMINAL and oid.startswith(prefix) and oid not in ended:
                            at = datetime.fromisoformat(update["Timestamp"]).timestamp()
                            ended[oid] = (status, at)
                    if time.time() - last_note >= 60:
                        last_note = time.time()
                        done = sum(1 for s, _ in ended.values() if s == "Processed")
                        print(
                            f"burst: {last_note - start:5.0f} s: {done} processed, "
                            f"{len(ended)} terminal, peak processing {peaks['count']}",
                            file=sys.stderr,
                            flush=True,
                        )
        stop.set()
        await watcher
        records = await _records(store, prefix)
    async with aiohttp.ClientSession() as http:
        calls = (await (await http.get(f"{remote}/_admin/requests")).json()).get("total")
    return {
        "start": start,
        "posted_in": posted - start,
        "ended": ended,
        "records": records,
        "peaks": peaks,
        "samples": samples,
        "calls": calls,
    }


async def _records(store, prefix: str) -> dict:
    from devstack.invariants import records_with_prefix

    return await records_with_prefix(store, prefix)


def report(result: dict, orders: int, rate: float, cap: int, hosts: int) -> int:
    steps = len(DEFAULT_CATALOG.names)
    start = result["start"]
    processed = sorted(at for status, at in result["ended"].values() if status == "Processed")
    minutes = max(1, math.ceil(((processed[-1] if processed else start) - start) / 60))
    per_minute = [0] * minutes
    for at in processed:
        per_minute[min(minutes - 1, int((at - start) // 60))] += 1
    print(f"burst: {orders} orders posted in {result['posted_in']:.1f} s; service {rate:g} calls/s")
    print(
        f"{'minute':>6} {'processed':>10} {'calls/s that took':>18} {'of the rate':>12} "
        f"{'peak Processing':>16} {'limit at end':>13}"
    )
    shares = []
    for i, n in enumerate(per_minute):
        took = n * steps / 60
        share = 100 * took / rate
        shares.append(share)
        inside = [
            (p, lim) for at, p, lim in result["samples"] if i * 60 <= at - start < (i + 1) * 60
        ]
        peak = max((p for p, _ in inside), default=0)
        limit = inside[-1][1] if inside else None
        print(f"{i + 1:>6} {n:>10} {took:>18.2f} {share:>11.0f}% {peak:>16} {limit!s:>13}")
    # Minutes that began with less work left than the service serves in a
    # minute are the drain: they are cut short by the end of the work.
    per_minute_capacity = rate * 60 / steps
    full, left = [], orders
    for i, n in enumerate(per_minute):
        if i > 0 and left >= per_minute_capacity:
            full.append(shares[i])
        left -= n
    worst = min(full) if full else float("nan")
    records = result["records"]
    attempts = [r.Attempt for r in records.values()]
    states: dict[str, int] = {}
    for r in records.values():
        states[r.ProcessState.value] = states.get(r.ProcessState.value, 0) + 1
    mean_attempts = sum(attempts) / len(attempts) if attempts else float("nan")
    failed_attempts = sum(r.FailureCount for r in records.values())
    calls = result["calls"]
    calls_per_order = calls / orders if isinstance(calls, int) else float("nan")
    print(f"burst: records by state: {states}; attempts that failed or ran out: {failed_attempts}")
    print(
        f"burst: orders={orders} rate={rate:g}/s cap={cap} processed={len(processed)} "
        f"minutes={minutes} min_goodput_after_first={worst:.0f}% "
        f"attempts_per_order={mean_attempts:.2f} max_attempts={max(attempts, default=0)} "
        f"peak_processing={result['peaks']['count']} peak_gauge={result['peaks']['gauge']} "
        f"calls_per_order={calls_per_order:.2f} hosts={hosts}"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=int(os.environ.get("BURST_ORDERS", "2000")))
    parser.add_argument(
        "--rate", type=float, default=8.0, help="calls/s the remote service serves, all services"
    )
    parser.add_argument("--cap", type=int, default=500, help="MAX_PROCESSING")
    parser.add_argument("--hosts", type=int, default=1, help="host processes on one task hub")
    parser.add_argument("--timeout", type=float, help="seconds to wait (default: from the rate)")
    args = parser.parse_args()
    exit_on_signals()  # SIGTERM/SIGHUP run the `finally` that stops the stack
    steps = len(DEFAULT_CATALOG.names)
    timeout = args.timeout or 300 + 3 * args.orders * steps / args.rate
    run_dir = Path(tempfile.mkdtemp(prefix="burst-"))
    settings = {**BENCH_SETTINGS, "MAX_PROCESSING": str(args.cap)}
    stack = start_stack(run_dir, args.hosts, settings)
    try:
        result = asyncio.run(burst(stack, args.orders, args.rate, timeout))
    finally:
        stop_stack(stack)
        remove_run_dir(run_dir)
    return report(result, args.orders, args.rate, args.cap, args.hosts)


if __name__ == "__main__":
    sys.exit(main())
