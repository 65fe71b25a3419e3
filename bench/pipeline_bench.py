"""What one happy-path order costs on the local stack, and how fast orders go.

Starts the whole local stack (as `make demo` does, without the faults and the
host kill), posts N orders, and waits for each one's `Processed` status on
the reply queue. Run once with no faults and once with 10% transient errors
from the remote service. Prints one table:

- Cosmos requests per order by kind (counted by the local Cosmos server; this
  includes the starter's and the Supervisor's periodic queries, spread over
  the orders). The local server reports a request charge of 1 for everything,
  so RU are not printed.
- Service Bus messages sent per order, per queue (the emulator's sequence
  numbers), and received (deliveries, including redeliveries).
- Durable history events and orchestrator episodes (replays) per order, from
  the host's task hub.
- Host CPU seconds per order (the host process's user + system time).
- Throughput (orders/s from the first post to the last Processed) and p50/p95
  submit-to-Processed latency.

    python bench/pipeline_bench.py [--orders 1000] [--runs 0,10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode  # noqa: E402
from azure.servicebus.aio import ServiceBusClient  # noqa: E402

from cli.orders import generate  # noqa: E402
from devstack.process import exit_on_signals  # noqa: E402
from devstack.stack import Stack  # noqa: E402
from domain.codec import encode  # noqa: E402

BENCH_SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "60",
    "CLAIM_TIMEOUT_SECONDS": "60",
    "STARTER_SCHEDULE": "*/2 * * * * *",
    "STARTER_BATCH_SIZE": "100",
    "MAX_PROCESSING": "50",
    "SUPERVISOR_SCHEDULE": "*/10 * * * * *",
    "SUPERVISOR_SCAN": "index",
    "PENDING_BACKLOG_LIMIT": "100000",
}


def cosmos_stats(port: int) -> dict[str, int]:
    """Request counts by kind from the local Cosmos server's launcher."""
    import http.client
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the dev server's self-signed certificate
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    connection.request("GET", "/_devstack/stats")
    return json.loads(connection.getresponse().read())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def servicebus_sent(run_dir: Path) -> dict[str, int]:
    with sqlite3.connect(run_dir / "servicebus" / "servicebus.sqlite3") as db:
        return {q: n - 1 for q, n in db.execute("SELECT queue, next FROM sequences")}


def durable_counts(run_dir: Path) -> tuple[int, int]:
    db_path = next((run_dir / "host").glob("*.sqlite"))
    with sqlite3.connect(db_path) as db:
        events = db.execute("SELECT COUNT(*) FROM history").fetchone()[0]
        episodes = sum(1 for (e,) in db.execute("SELECT event FROM history") if json.loads(e).get("EventType") == 12)
    return events, episodes


async def run_once(orders: int, transient: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-"))
    stack = Stack(run_dir, overrides=BENCH_SETTINGS)
    stack.start()  # stops what it started if a server fails
    try:
        remote = stack.settings["REMOTE_SERVICE_URL"]
        prefix = f"BENCH-{uuid.uuid4().hex[:4]}"
        batch = list(generate("webshop", "replies-webshop", orders, prefix, seed=1))
        async with aiohttp.ClientSession() as http:
            if transient:
                await http.post(f"{remote}/_admin/faults",
                                json={"kind": "transient", "service": "*", "rate": transient / 100})
        await asyncio.sleep(3)  # let the host create containers and settle
        host_pid = stack.servers["host"].process.pid
        cpu0 = cpu_seconds(host_pid)
        posted: dict[str, float] = {}
        done: dict[str, float] = {}
        received = 0
        async with ServiceBusClient.from_connection_string(stack.settings["ServiceBusConnection"]) as bus:
            async with bus.get_queue_sender("orders-webshop") as sender:  # the webshop's ingress
                start = time.time()
                for i in range(0, len(batch), 100):
                    chunk = batch[i:i + 100]
                    await sender.send_messages(
                        [ServiceBusMessage(encode(o), message_id=f"submit/{o.OrderID}") for o in chunk])
                    now = time.time()
                    posted.update({o.OrderID: now for o in chunk})
            receiver = bus.get_queue_receiver("replies-webshop", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
            async with receiver:
                deadline = time.time() + max(600, orders * 3)
                while len(done) < orders and time.time() < deadline:
                    for m in await receiver.receive_messages(max_message_count=200, max_wait_time=2):
                        received += 1
                        update = json.loads(b"".join(m.body))
                        if update["Status"] == "Processed":
                            done[update["OrderID"]] = datetime.fromisoformat(update["Timestamp"]).timestamp()
        cpu = cpu_seconds(host_pid) - cpu0
        stats = cosmos_stats(stack.ports.cosmos)
        sent = servicebus_sent(run_dir)
        events, episodes = durable_counts(run_dir)
        latencies = sorted(done[o] - posted[o] for o in done)
        elapsed = max(done.values()) - start if done else float("nan")
        return {
            "transient": transient, "orders": orders, "processed": len(done),
            "throughput": len(done) / elapsed, "p50": statistics.median(latencies),
            "p95": latencies[int(0.95 * (len(latencies) - 1))],
            "cosmos": {k: v / orders for k, v in sorted(stats.items())},
            "servicebus": {k: v / orders for k, v in sorted(sent.items())},
            "events": events / orders, "episodes": episodes / orders, "cpu": cpu / orders,
        }
    finally:
        stack.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--runs", default="0,10", help="transient failure percentages, one run each")
    args = parser.parse_args()
    exit_on_signals()  # SIGTERM/SIGHUP run the `finally` that stops the stack
    results = [asyncio.run(run_once(args.orders, int(p))) for p in args.runs.split(",")]
    print(f"{'':34}" + "".join(f"{r['transient']:>3}% transient  " for r in results))
    rows = [("orders processed", lambda r: f"{r['processed']}/{r['orders']}"),
            ("throughput (orders/s)", lambda r: f"{r['throughput']:.2f}"),
            ("p50 submit->Processed (s)", lambda r: f"{r['p50']:.1f}"),
            ("p95 submit->Processed (s)", lambda r: f"{r['p95']:.1f}"),
            ("host CPU s per order", lambda r: f"{r['cpu']:.3f}"),
            ("durable history events / order", lambda r: f"{r['events']:.1f}"),
            ("orchestrator replays / order", lambda r: f"{r['episodes']:.1f}")]
    kinds = sorted({k for r in results for k in r["cosmos"]})
    rows += [(f"cosmos {k} / order", lambda r, k=k: f"{r['cosmos'].get(k, 0):.2f}") for k in kinds]
    queues = sorted({q for r in results for q in r["servicebus"]})
    rows += [(f"sb sent to {q} / order", lambda r, q=q: f"{r['servicebus'].get(q, 0):.2f}") for q in queues]
    for name, value in rows:
        print(f"{name:34}" + "".join(f"{value(r):>15}" for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
