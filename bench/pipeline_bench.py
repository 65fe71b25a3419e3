"""What one happy-path order costs on the local stack, and how fast orders go.

Starts the whole local stack (as `make demo` does, without the faults and the
host kill) with one or more host processes on one task hub, keeps K orders in
flight (a new order is posted as each one's `Processed` status arrives on the
reply queue) until N orders are done, and prints per run:

- throughput (orders/s from the first post to the last Processed) and p50/p95
  submit-to-Processed latency;
- Cosmos requests per order (counted by the local Cosmos server; this includes
  the starter's and the Supervisor's periodic queries, spread over the orders);
- Service Bus messages sent per order (all queues, the emulator's sequence
  numbers);
- Durable activities (TaskScheduled), history events and orchestrator episodes
  per order, from the task hub;
- host CPU seconds per order (user + system time of every host process), and
  stack_cpu_s_per_order: the same for every process of the local stack (hosts,
  Service Bus emulator, Cosmos server, Azurite, remote service) and the bench;
- history_bytes_per_order: bytes of the Durable history the task hub holds
  (the events' JSON, every instance) per order;
- cosmos_ru_per_order: RU of one happy-path order, measured in the
  simulation from the documents it writes and the Bicep's indexing policy
  (bench/order_cost.py; the local Cosmos server charges nothing), and
  usd_per_million_orders: the capacity model's list-price total for the dev
  profile at the run's throughput (bench/capacity.py, docs/capacity.md; lines
  with no published price are left out and named there);
- app_log_records_per_order, app_log_bytes_per_order: the log records the
  hosts wrote during the run (the local host's own left out) and their bytes,
  at the hosts' APP_LOG_LEVEL (`--log-level`; Warning is the production
  profile's): what Application Insights would ingest of the app's logs;
- first_attempt: the share of orders whose record ended Processed in attempt 1;
- steady_throughput: orders/s while exactly K were in flight (from the first
  Processed to the one that let the last order be posted), which leaves out
  the pipeline filling at the start and draining at the end; with N orders
  only N - K completions fall in that window, so it needs N well above K;
- others_cpu: the share of the machine's CPU time that processes outside the
  stack and the bench used during the run (other people's work on a shared
  machine): the figures above are only comparable between runs with similar
  values.

The last line is the headline run (the first configuration) in one line, with
the throughput of every configuration appended:

    bench: orders=N in_flight=K throughput=X/s p50=Y s p95=Z s cosmos_requests_per_order=A
           sb_messages_per_order=B activities_per_order=C history_events_per_order=D
           host_cpu_s_per_order=E first_attempt=F% hosts=H ... history_bytes_per_order=I
           cosmos_ru_per_order=J usd_per_million_orders=K throughput_1host=.. throughput_2hosts=..

    python bench/pipeline_bench.py [--orders 300] [--configs 1x50,2x50,1x200] [--transient 0]
        [--scan index|query] [--log-level Information|Warning|Error] [--set NAME=VALUE ...]

Every configuration posts the same number of orders, at least 5 times the
largest in-flight count (with 1x200, 1,000 orders each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from bench.host_cost import ops_from_journal, price, start_journal, take_journal
from cli.orders import generate
from devstack.process import exit_on_signals, free_port
from devstack.stack import Stack
from domain.codec import encode

ROOT = Path(__file__).resolve().parent.parent
BENCH_SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "60",
    "CLAIM_TIMEOUT_SECONDS": "60",
    # The deployed default (infra/main.bicep, local.settings.template.json):
    # Submit's fast path starts orders, so the tick only sets how often the
    # periodic queries run, which the per-order figures include.
    "STARTER_SCHEDULE": "*/5 * * * * *",
    "STARTER_BATCH_SIZE": "100",
    "MAX_PROCESSING": "500",
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


def caller_probe(directory: Path) -> dict[str, str]:
    """The hosts' settings that load bench/probe/sitecustomize.py, which counts
    their Cosmos requests by caller and kind into `directory`."""
    path = os.pathsep.join((str(ROOT / "bench" / "probe"), str(ROOT)))
    return {"COSMOS_CALL_STATS_DIR": str(directory), "PYTHONPATH": path}


def caller_counts(directory: Path) -> dict[str, int]:
    """Cosmos requests by caller and kind, summed over every process that wrote
    counts (bench/probe/sitecustomize.py); each process writes at most once a
    second, so this lags by up to a second."""
    total: dict[str, int] = {}
    for path in directory.glob("*.json"):
        try:
            counts = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for key, n in counts.items():
            total[key] = total.get(key, 0) + n
    return total


def cosmos_containers(stack: Stack) -> dict[str, str]:
    """The stack's Cosmos container names -> the RU model's (bench/cosmos_ru.py)."""
    from adapters.settings import load_settings

    cfg = load_settings(stack.settings)
    return {
        cfg.state_container: "state",
        cfg.orders_container: "orders",
        cfg.recovery_index_container: "index",
    }


def ru_model() -> Any:
    from bench.cosmos_ru import RuModel, bicep_policies
    from bench.order_cost import load_limits

    return RuModel(load_limits(), bicep_policies())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def machine_ticks() -> tuple[int, int]:
    """(all CPU ticks, idle + iowait ticks) of the machine since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields[:8]), fields[3] + fields[4]  # user..steal; idle, iowait


def process_tree_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) of `pids` and their live descendants."""
    import psutil

    total = 0.0
    seen: set[int] = set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            if proc.pid in seen:
                continue
            seen.add(proc.pid)
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
    return total


def stack_pids(stack: Stack) -> list[int]:
    return [s.child.process.pid for s in stack.servers.values() if s.child]


def steady_rate(done_times: list[float], in_flight: int) -> float:
    """Completions per second while `in_flight` orders were in flight: from the first
    Processed to the (N - K)th, after which no order was left to post."""
    times = sorted(done_times)
    last = len(times) - in_flight  # the completion that let the last order be posted
    if last < 2 or times[last - 1] <= times[0]:
        return float("nan")
    return (last - 1) / (times[last - 1] - times[0])


def servicebus_sent(run_dir: Path) -> dict[str, int]:
    with sqlite3.connect(run_dir / "servicebus" / "servicebus.sqlite3") as db:
        return {q: n - 1 for q, n in db.execute("SELECT queue, next FROM sequences")}


def durable_counts(run_dir: Path) -> dict[str, int]:
    """History events, their bytes (compact JSON, as the simulation counts them:
    bench.order_cost.history_size), episodes (OrchestratorStarted) and activities
    (TaskScheduled) in the hub."""
    from bench.order_cost import history_size

    db_path = next((run_dir / "host").glob("*.sqlite"))
    with sqlite3.connect(db_path) as db:
        events, size = 0, 0
        for (event,) in db.execute("SELECT event FROM history"):
            events += 1
            size += history_size(json.loads(event))
        kinds = dict(
            db.execute(
                "SELECT json_extract(event, '$.EventType'), COUNT(*) FROM history GROUP BY 1"
            )
        )
    return {
        "events": events,
        "history_bytes": size,
        "episodes": kinds.get(12, 0),
        "activities": kinds.get(4, 0),
    }


async def first_attempt_share(stack: Stack, prefix: str) -> tuple[int, int] | None:
    """(orders Processed in attempt 1, orders recorded), read from the state container, or
    None if the product's store API could not be used (the figure is then not printed)."""
    try:
        from adapters.cosmos_client import build_client
        from adapters.settings import load_settings
        from adapters.state_store import CosmosStateStore
        from devstack.invariants import records_with_prefix

        cfg = load_settings(stack.settings)
        cosmos = build_client(cfg.state_account)
        async with cosmos:
            store = CosmosStateStore(
                cosmos.get_database_client(cfg.state_database).get_container_client(
                    cfg.state_container
                )
            )
            records = await records_with_prefix(store, prefix)
        first = sum(
            1 for r in records.values() if r.ProcessState.value == "Processed" and r.Attempt == 1
        )
        return first, len(records)
    except Exception as exc:  # a figure we cannot read is reported as missing, never guessed
        print(
            f"bench: could not read the order records ({type(exc).__name__}: {exc})",
            file=sys.stderr,
        )
        return None


@dataclass
class Run:
    hosts: int
    in_flight: int
    orders: int
    processed: int = 0
    throughput: float = float("nan")
    p50: float = float("nan")
    p95: float = float("nan")
    cpu: float = float("nan")
    cosmos: dict[str, float] = field(default_factory=dict)
    servicebus: dict[str, float] = field(default_factory=dict)
    durable: dict[str, float] = field(default_factory=dict)
    first_attempt: float | None = None
    per_host_cpu: list[float] = field(default_factory=list)
    callers: dict[str, float] = field(default_factory=dict)
    stack_cpu: float = float("nan")
    steady: float = float("nan")
    others_cpu: float = float("nan")
    cosmos_ru: float = float("nan")
    usd_per_million: float = float("nan")
    host_cost: Any = None  # bench.host_cost.Priced: the orders' own Cosmos requests and RU
    # The app's log records per order during the run, and their bytes: what
    # Application Insights would ingest at the run's APP_LOG_LEVEL.
    logs: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        first = f"{self.first_attempt:.1f}%" if self.first_attempt is not None else "n/a"
        return (
            f"orders={self.processed} in_flight={self.in_flight} throughput={self.throughput:.2f}/s "
            f"p50={self.p50:.2f} s p95={self.p95:.2f} s "
            f"cosmos_requests_per_order={sum(self.cosmos.values()):.1f} "
            f"sb_messages_per_order={sum(self.servicebus.values()):.1f} "
            f"activities_per_order={self.durable.get('activities', 0):.1f} "
            f"history_events_per_order={self.durable.get('events', 0):.1f} "
            f"host_cpu_s_per_order={self.cpu:.3f} first_attempt={first} hosts={self.hosts} "
            f"steady_throughput={self.steady:.2f}/s stack_cpu_s_per_order={self.stack_cpu:.3f} "
            f"others_cpu={100 * self.others_cpu:.0f}% "
            f"history_bytes_per_order={self.durable.get('history_bytes', 0):.0f} "
            f"cosmos_ru_per_order={self.cosmos_ru:.1f} "
            f"usd_per_million_orders={self.usd_per_million:.2f} "
            f"app_log_records_per_order={self.logs.get('records', 0):.2f} "
            f"app_log_bytes_per_order={self.logs.get('bytes', 0):.0f}"
        )


class BenchStack(Stack):
    """The local stack, except that the remote service (the agents' fake
    inventory, payment and shipping services) keeps its ledger in memory: with
    a state file it rewrites and fsyncs the whole ledger on every call, a cost
    that grows with every order and is the test double's, not the product's
    (it made a 1,000-order run slow down as it went)."""

    def _servers(self):
        servers = super()._servers()
        for server in servers:
            if server.name == "remote" and "--state-file" in server.argv:
                i = server.argv.index("--state-file")
                del server.argv[i : i + 2]
        return servers


def start_stack(run_dir: Path, hosts: int, overrides: dict[str, str]) -> Stack:
    """The stack with `hosts` host processes on one task hub (one data dir)."""
    stack = BenchStack(run_dir, overrides=overrides)
    stack.start()  # stops what it started if a server fails
    try:
        for i in range(2, hosts + 1):
            server = stack.host_server(f"host{i}", free_port())
            stack._launch(server)
            server.wait_ready(60)
    except BaseException:
        stop_stack(stack)
        raise
    return stack


def stop_stack(stack: Stack) -> None:
    # Extra hosts first, so that they drain against live dependencies as the first one does.
    for name, server in list(stack.servers.items()):
        if name.startswith("host") and name != "host":
            server.stop()
    stack.stop()


# A record as devstack.host writes it: "<date> <time> LEVEL logger: message";
# the lines after it up to the next record (a traceback) are its own.
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ([A-Z]+) ([\w.]+): ")


def host_log_offsets(run_dir: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in (run_dir / "logs").glob("host*.log")}


def app_log_counts(run_dir: Path, offsets: dict[Path, int]) -> dict[str, float]:
    """The log records the hosts wrote since `offsets` (their sizes when the
    orders began), by level, and their bytes (message and traceback lines),
    leaving out the local host's own (`devstack.*`: Azure runs its host)."""
    counts: dict[str, float] = {"records": 0, "bytes": 0}
    for path in (run_dir / "logs").glob("host*.log"):
        with path.open("rb") as f:
            f.seek(offsets.get(path, 0))
            text = f.read().decode(errors="replace")
        kept = False
        for line in text.splitlines():
            match = _RECORD.match(line)
            if match:
                level, name = match.groups()
                kept = not name.startswith("devstack")
                if kept:
                    counts["records"] += 1
                    counts[level] = counts.get(level, 0) + 1
                    counts["bytes"] += len(line[match.end() :].encode()) + len(name)
            elif kept:
                counts["bytes"] += len(line.encode()) + 1
    return counts


def remove_run_dir(run_dir: Path) -> None:
    """Delete a run's data (hub, journals, Azurite files: 15 MB or so a run) unless
    BENCH_KEEP_RUN_DIR is set, in which case say where it is."""
    if os.environ.get("BENCH_KEEP_RUN_DIR"):
        print(f"bench: run data kept in {run_dir}", file=sys.stderr)
    else:
        shutil.rmtree(run_dir, ignore_errors=True)


def host_pids(stack: Stack) -> list[int]:
    return [
        s.child.process.pid
        for name, s in stack.servers.items()
        if name.startswith("host") and s.child
    ]


async def closed_loop(
    stack: Stack, batch: list[Any], in_flight: int, timeout: float
) -> tuple[dict[str, float], dict[str, float], float]:
    """Keep `in_flight` orders posted and not yet Processed until every order is done.

    Returns (posted time, Processed time, start) by OrderID; the Processed time is the
    status message's own timestamp (when the product sent it)."""
    posted: dict[str, float] = {}
    done: dict[str, float] = {}
    queue = list(batch)
    async with ServiceBusClient.from_connection_string(
        stack.settings["ServiceBusConnection"]
    ) as bus:
        sender = bus.get_queue_sender("orders-webshop")  # the webshop's ingress queue
        receiver = bus.get_queue_receiver(
            "replies-webshop", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        )
        async with sender, receiver:

            async def post(n: int) -> None:
                chunk, queue[:] = queue[:n], queue[n:]
                for i in range(0, len(chunk), 100):
                    part = chunk[i : i + 100]
                    await sender.send_messages(
                        [
                            ServiceBusMessage(encode(o), message_id=f"submit/{o.OrderID}")
                            for o in part
                        ]
                    )
                    now = time.time()
                    posted.update({o.OrderID: now for o in part})

            start = time.time()
            await post(in_flight)
            deadline = start + timeout
            while len(done) < len(batch) and time.time() < deadline:
                for m in await receiver.receive_messages(max_message_count=200, max_wait_time=1):
                    update = json.loads(b"".join(m.body))
                    oid = update["OrderID"]
                    if update["Status"] == "Processed" and oid in posted and oid not in done:
                        done[oid] = datetime.fromisoformat(update["Timestamp"]).timestamp()
                free = in_flight - (len(posted) - len(done))
                if free > 0 and queue:
                    await post(free)
    return posted, done, start


async def run_once(
    orders: int, in_flight: int, hosts: int, transient: int, settings: dict[str, str]
) -> Run:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-"))
    calls_dir = run_dir / "cosmos-calls"
    # In a worker thread: starting the stack blocks (and creates the Cosmos
    # containers with asyncio.run of its own, which cannot run inside this loop).
    stack = await asyncio.to_thread(
        start_stack,
        run_dir,
        hosts,
        {**BENCH_SETTINGS, **caller_probe(calls_dir), **settings},
    )
    result = Run(hosts=hosts, in_flight=in_flight, orders=orders)
    try:
        remote = stack.settings["REMOTE_SERVICE_URL"]
        # Short, as the simulation's ids are (bench/order_cost.py measures the same orders).
        prefix = f"B{uuid.uuid4().hex[:4]}"
        batch = list(generate("webshop", "replies-webshop", orders, prefix, seed=1))
        if transient:
            async with aiohttp.ClientSession() as http:
                await http.post(
                    f"{remote}/_admin/faults",
                    json={"kind": "transient", "service": "*", "rate": transient / 100},
                )
        await asyncio.sleep(3)  # let the hosts create containers and settle
        pids = host_pids(stack)
        cpu0 = [cpu_seconds(p) for p in pids]
        ours = [*stack_pids(stack), os.getpid()]
        ours0 = process_tree_cpu(ours)
        machine0 = machine_ticks()
        cosmos0 = cosmos_stats(stack.ports.cosmos)
        callers0 = caller_counts(calls_dir)
        start_journal(stack.ports.cosmos)
        logs0 = host_log_offsets(run_dir)
        posted, done, start = await closed_loop(
            stack, batch, in_flight, timeout=max(600, orders * 3)
        )
        # The last orders' outbox clears follow their Processed statuses.
        await asyncio.sleep(2)
        journal = take_journal(stack.ports.cosmos)
        cpu = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
        ours_cpu = process_tree_cpu(ours) - ours0
        machine1 = machine_ticks()
        stats = cosmos_stats(stack.ports.cosmos)
        await asyncio.sleep(1.2)  # the processes' last counts (written once a second)
        callers = caller_counts(calls_dir)
        sent = servicebus_sent(run_dir)
        counts = durable_counts(run_dir)
        n = max(1, len(done))
        result.logs = {k: v / n for k, v in app_log_counts(run_dir, logs0).items()}
        latencies = sorted(done[o] - posted[o] for o in done)
        result.processed = len(done)
        if done:
            result.throughput = len(done) / (max(done.values()) - start)
            result.p50 = statistics.median(latencies)
            result.p95 = latencies[int(0.95 * (len(latencies) - 1))]
        result.per_host_cpu = [c / n for c in cpu]
        result.stack_cpu = ours_cpu / n
        result.steady = steady_rate(list(done.values()), in_flight)
        ticks = os.sysconf("SC_CLK_TCK")
        all_s = (machine1[0] - machine0[0]) / ticks
        busy_s = all_s - (machine1[1] - machine0[1]) / ticks
        if all_s > 0:
            result.others_cpu = max(0.0, busy_s - ours_cpu) / all_s
        result.cpu = sum(cpu) / n
        result.cosmos = {k: (v - cosmos0.get(k, 0)) / n for k, v in sorted(stats.items())}
        result.callers = {
            k: (v - callers0.get(k, 0)) / n for k, v in callers.items() if v > callers0.get(k, 0)
        }
        result.servicebus = {k: v / n for k, v in sorted(sent.items())}
        result.durable = {k: v / n for k, v in counts.items()}
        result.host_cost = price(
            ops_from_journal(journal, cosmos_containers(stack)), ru_model(), len(done)
        )
        result.cosmos_ru = result.host_cost.ru_per_order
        share = await first_attempt_share(stack, prefix)
        if share is not None and share[1]:
            result.first_attempt = 100.0 * share[0] / orders
        return result
    finally:
        stop_stack(stack)
        remove_run_dir(run_dir)


def print_table(results: list[Run]) -> None:
    print(
        f"{'':34}"
        + "".join(f"{f'{r.hosts} host(s), {r.in_flight} in flight':>28}" for r in results)
    )
    rows: list[tuple[str, Any]] = [
        ("orders processed", lambda r: f"{r.processed}/{r.orders}"),
        ("throughput (orders/s)", lambda r: f"{r.throughput:.2f}"),
        ("p50 submit->Processed (s)", lambda r: f"{r.p50:.2f}"),
        ("p95 submit->Processed (s)", lambda r: f"{r.p95:.2f}"),
        ("host CPU s per order (all hosts)", lambda r: f"{r.cpu:.3f}"),
        ("host CPU s per order, each host", lambda r: " ".join(f"{c:.3f}" for c in r.per_host_cpu)),
        ("stack+bench CPU s per order", lambda r: f"{r.stack_cpu:.3f}"),
        ("steady throughput (K in flight)", lambda r: f"{r.steady:.2f}"),
        ("machine CPU used by others", lambda r: f"{100 * r.others_cpu:.0f}%"),
        ("activities / order", lambda r: f"{r.durable.get('activities', 0):.1f}"),
        ("history events / order", lambda r: f"{r.durable.get('events', 0):.1f}"),
        ("orchestrator episodes / order", lambda r: f"{r.durable.get('episodes', 0):.1f}"),
        ("history bytes / order", lambda r: f"{r.durable.get('history_bytes', 0):.0f}"),
        ("cosmos RU / order (its own)", lambda r: f"{r.cosmos_ru:.1f}"),
        ("$ per million orders (dev)", lambda r: f"{r.usd_per_million:.2f}"),
        (
            "first attempt",
            lambda r: f"{r.first_attempt:.1f}%" if r.first_attempt is not None else "n/a",
        ),
    ]
    kinds = sorted({k for r in results for k in r.cosmos})
    rows += [(f"cosmos {k} / order", lambda r, k=k: f"{r.cosmos.get(k, 0):.2f}") for k in kinds]
    queues = sorted({q for r in results for q in r.servicebus})
    rows += [
        (f"sb sent to {q} / order", lambda r, q=q: f"{r.servicebus.get(q, 0):.2f}") for q in queues
    ]
    for name, value in rows:
        print(f"{name:34}" + "".join(f"{value(r):>28}" for r in results))
    for r in results:
        print(
            f"cosmos requests per order by caller [kind], {r.hosts} host(s), {r.in_flight} in flight "
            f"(host processes only; counted in-process, may lag by a second):"
        )
        for key, value in sorted(r.callers.items(), key=lambda kv: -kv[1]):
            if value >= 0.005:
                print(f"  {value:7.3f}  {key}")


def host_counts(run: Run, scan: str) -> dict[str, Any] | None:
    """The run's per-order counts as bench.order_cost.with_host_counts takes them
    (and bench/host_order.json keeps them for the capacity model)."""
    if run.host_cost is None:
        return None
    return {
        "about": "Per happy-path order as the local host ran it: written by make bench "
        "(bench/pipeline_bench.py --save, its first run); read by the capacity model "
        "(bench.order_cost.with_host_counts).",
        "scan": scan,
        "orders": run.host_cost.orders,
        "hosts": run.hosts,
        "in_flight": run.in_flight,
        "cosmos_requests": {k: round(v, 3) for k, v in run.host_cost.requests.items()},
        "cosmos_ru": {k: round(v, 2) for k, v in run.host_cost.ru.items()},
        "history_bytes": round(run.durable.get("history_bytes", 0)),
    }


def host_order_cost(cost: Any, run: Run, scan: str) -> Any:
    """The simulation's measurement of an order with the host's own counts in place
    of its Cosmos requests, RU and history bytes: what the capacity model prices."""
    from bench.order_cost import with_host_counts

    counts = host_counts(run, scan)
    return with_host_counts(cost, counts) if counts else cost


def side_by_side(run: Run, cost: Any) -> None:
    """Per order, the host's counts beside the simulation's (bench/order_cost.py):
    Cosmos requests and RU by container and kind, and the Durable history."""
    host = run.host_cost
    if host is None:
        return
    print(
        f"per order, host ({run.hosts} host(s), {run.in_flight} in flight, {host.orders} orders; "
        f"counted on the Cosmos server and the task hub) beside the simulation "
        f"({cost.orders} orders):"
    )
    print(f"  {'':26}{'requests':>18}{'RU':>20}")
    print(f"  {'':26}{'host':>9}{'sim':>9}{'host':>10}{'sim':>10}")
    for key in sorted(set(host.requests) | set(cost.cosmos_requests)):
        print(
            f"  {key:26}{host.requests.get(key, 0):9.2f}{cost.cosmos_requests.get(key, 0):9.2f}"
            f"{host.ru.get(key, 0):10.2f}{cost.cosmos_ru.get(key, 0):10.2f}"
        )

    def gap(a: float, b: float) -> str:
        return f"{100 * (a - b) / b:+.1f}%" if b else "n/a"

    rows = [
        ("cosmos requests", host.requests_per_order, cost.cosmos_requests_per_order),
        ("cosmos RU", host.ru_per_order, cost.cosmos_ru_per_order),
        ("history bytes", run.durable.get("history_bytes", 0), cost.history_bytes),
        ("history events", run.durable.get("events", 0), cost.history_events),
        ("activities", run.durable.get("activities", 0), cost.activities),
    ]
    for name, a, b in rows:
        print(f"  {name:26}host {a:9.2f}  sim {b:9.2f}  host vs sim {gap(a, b)}")
    print(
        f"  periodic (queries, gauge, checkpoints), host: {host.periodic_requests:.2f} "
        f"requests, {host.periodic_ru:.2f} RU per order at this run's rate"
    )
    print(
        f"bench-cost: hosts={run.hosts} cosmos_requests_per_order={host.requests_per_order:.2f} "
        f"sim={cost.cosmos_requests_per_order:.2f} cosmos_ru_per_order={host.ru_per_order:.1f} "
        f"sim={cost.cosmos_ru_per_order:.1f} "
        f"history_bytes_per_order={run.durable.get('history_bytes', 0):.0f} "
        f"sim={cost.history_bytes:.0f}",
        flush=True,
    )


WAVES = 5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=int(os.environ.get("BENCH_ORDERS", "300")))
    parser.add_argument(
        "--configs",
        default="1x50,2x50,1x200",
        help="runs as HOSTSxIN_FLIGHT, comma-separated; the first is the headline",
    )
    parser.add_argument(
        "--transient", type=int, default=0, help="percent of remote calls failing transiently"
    )
    parser.add_argument(
        "--scan",
        choices=("index", "query"),
        default="index",
        help="the Supervisor's source (SUPERVISOR_SCAN)",
    )
    parser.add_argument(
        "--log-level",
        choices=("Information", "Warning", "Error"),
        default="Information",
        help="APP_LOG_LEVEL of the hosts (the production profile's: Warning); "
        "app_log_records_per_order counts what it lets through",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another app setting for the hosts (e.g. INLINE_STEPS=...); repeatable",
    )
    parser.add_argument(
        "--save",
        action="store_true",
        help="keep the first run's per-order counts in bench/host_order.json for the "
        "capacity model (make bench does; a run with other settings should not)",
    )
    args = parser.parse_args()
    more = dict(kv.split("=", 1) for kv in args.set)
    exit_on_signals()  # SIGTERM/SIGHUP run the `finally` that stops the stack
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    results = []
    # Every configuration posts the same orders, at least WAVES times the
    # largest in-flight count: the pipeline's filling and draining at either
    # end then do not make most of a run (300 orders at 200 in flight would be
    # two thirds first wave), and the configurations compare like with like.
    orders = max(args.orders, WAVES * max(in_flight for _, in_flight in configs))
    # RU and $ per order: one happy-path order measured in the simulation
    # (the local Cosmos server charges nothing), priced by the capacity model.
    from bench.capacity import Model
    from bench.order_cost import measure

    # As many orders as each run, submitted at once: the index removals gather into
    # batches per partition as they do on the host (bench/order_cost.py).
    cost = measure(args.scan, orders=orders)
    for hosts, in_flight in configs:
        r = asyncio.run(
            run_once(
                orders,
                in_flight,
                hosts,
                args.transient,
                {"SUPERVISOR_SCAN": args.scan, "APP_LOG_LEVEL": args.log_level, **more},
            )
        )
        if r.throughput > 0:
            r.usd_per_million = Model(
                r.throughput, "dev", cost=host_order_cost(cost, r, args.scan)
            ).usd_per_million_orders()[0]
        print(f"bench-run: {r.line()}", flush=True)
        results.append(r)
    print_table(results)
    for r in results:
        side_by_side(r, cost)
    counts = host_counts(results[0], args.scan)
    if args.save and counts is not None and results[0].processed == results[0].orders:
        from bench.order_cost import HOST_COUNTS

        HOST_COUNTS.write_text(json.dumps(counts, indent=1) + "\n")
        print(f"bench: the host's per-order counts saved in {HOST_COUNTS}")
    extra = " ".join(
        f"throughput_{r.hosts}host{'s' if r.hosts > 1 else ''}_{r.in_flight}={r.throughput:.2f}/s"
        for r in results
    )
    print(f"bench: {results[0].line()} {extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
