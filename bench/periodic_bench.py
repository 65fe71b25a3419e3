"""The periodic work against the backlog: the Starter's tick, the Supervisor's
tick and the outbox scan, timed on the local Cosmos server at N records.

For each size it loads N state records into a fresh database on the local
Cosmos server: `--pending-every` of them Pending (the backlog the Starter
claims from), `--processing-every` Processing with a deadline ahead (indexed
as the writers index them), the rest Processed. Then it times, request by
request, each query a tick runs (the same store methods the Starter and the
Supervisor call), and whole ticks: `--ticks` Starter runs (each claims up to
its batches; the durable client is a stand-in that records the starts, the
bench measures the store) and Supervisor runs over the recovery index. Prints
one line a query and one a tick kind:

    records=<n> query=<name> seconds=<s> docs=<returned>
    records=<n> tick=<starter|supervisor> interval=<s> seconds_max=<s> seconds_mean=<s> inside=<yes|no>

The local server answers every query by scanning every document of the
container in JavaScript, so its times grow with N where Azure's index answers
a TOP n query in time bounded by n; a query that returns or counts the whole
backlog is slow in both. RU are priced by the model (bench/capacity.py,
`periodic`), not here: the local server charges 1 RU for everything.

    python bench/periodic_bench.py [--sizes 10000,100000] [--ticks 3]
        [--pending-every 10] [--processing-every 100] [--count-interval none,30]
        [--max-processing 1900] [--no-queries]

`--count-interval S` gives the Starter its count_interval (the backlog COUNTs
and compensation scans once every S seconds; the ticks are spaced by the
Starter's 5 s period, so a tick between counts is timed too); `none,30`
times a set of ticks without it, then a set with it, on the same records.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.checkpoints import CosmosCheckpointStore
from adapters.cosmos_client import RequestCharges, build_client, ensure_state_container
from adapters.recovery_index import CosmosRecoveryIndex, ensure_index_container
from adapters.settings import CosmosAccount
from adapters.state_store import CosmosStateStore, to_document
from devstack.cosmos import start_server
from devstack.process import exit_on_signals
from domain import state_machine as sm
from domain.models import OrderSubmitted, ProcessState
from domain.steps import DEFAULT_CATALOG
from orchestrators.policy import StarterPolicy
from orchestrators.starter import Starter
from reporting import Alerts, StatusReporter
from supervisor.sources import IndexSource
from supervisor.supervisor import Supervisor

STEPS = list(DEFAULT_CATALOG.names)
POLICY = sm.RetryPolicy(threshold=10)
STARTER_INTERVAL_S = 5  # STARTER_SCHEDULE as deployed (infra: starterIntervalSeconds)
SUPERVISOR_INTERVAL_S = 10  # SUPERVISOR_SCHEDULE as deployed


class NullPublisher:
    """Drops every message: the bench measures the store, not a bus."""

    async def send(self, queue: str, body: bytes, message_id: str, application_properties=None):
        """Drop the message."""


class RecordingClient:
    """The durable client's two calls the Starter makes, recorded: the bench
    times the Starter's Cosmos work, not a task hub."""

    def __init__(self) -> None:
        self.started: list[str] = []

    async def start_new(self, name: str, instance_id: str, client_input: Any = None) -> str:
        del name, client_input  # the orchestration's name and input: not what is measured
        self.started.append(instance_id)
        return instance_id

    async def get_status(self, instance_id: str) -> None:
        """No instance exists (the bench starts none)."""
        del instance_id


def record(i: int, state: str, now: datetime):
    order = OrderSubmitted.model_validate(
        {
            "OrderID": f"P-{i:07d}",
            "AppId": "webshop",
            "ReplyTo": "replies-webshop",
            "Customer": {"CustomerId": "C-1"},
            "Lines": [{"Sku": "S", "Quantity": 1, "UnitPrice": "1.00"}],
            "Total": "1.00",
        }
    )
    created = now - timedelta(minutes=5)
    rec = sm.new_record(order, created, STEPS)
    if state == "pending":
        return rec
    rec = sm.claim(rec, now, POLICY)  # a deadline ahead: live, not due
    if state == "processing":
        return rec
    return rec.model_copy(
        update={"ProcessState": ProcessState.PROCESSED, "LockedBy": None, "CompleteBy": None}
    )


def kind_of(i: int, pending_every: int, processing_every: int) -> str:
    if i % processing_every == 1 % processing_every:
        return "processing"
    if i % pending_every == 0:
        return "pending"
    return "processed"


async def load(container, index, n: int, pending_every: int, processing_every: int, now) -> None:
    gate = asyncio.Semaphore(64)

    async def put(i: int) -> None:
        rec = record(i, kind_of(i, pending_every, processing_every), now)
        async with gate:
            if rec.ProcessState is ProcessState.PROCESSING:
                await index.add(rec.id, rec.CompleteBy, rec.Attempt)
            await container.upsert_item(to_document(rec))

    await asyncio.gather(*(put(i) for i in range(n)))


async def timed(label: str, n: int, coro) -> Any:
    start = time.perf_counter()
    result = await coro
    seconds = time.perf_counter() - start
    docs = len(result[0]) if isinstance(result, tuple) else result
    docs = len(docs) if isinstance(docs, list) else docs
    print(f"records={n} query={label} seconds={seconds:.3f} docs={docs}", flush=True)
    return result


async def queries(store: CosmosStateStore, n: int, now: datetime, batch: int) -> None:
    """Each query a Starter tick can run, alone."""
    await timed("starter.count_pending", n, store.count_in_state(ProcessState.PENDING))
    await timed("starter.count_processing", n, store.count_in_state(ProcessState.PROCESSING))
    await timed("starter.claimable", n, store.query_claimable(batch, now))
    await timed("starter.compensation_requests", n, store.query_compensation_requests(batch))
    await timed(
        "starter.compensating",
        n,
        store.query_in_state_after(ProcessState.COMPENSATING, batch, None),
    )
    await timed("outbox.unsent_statuses", n, store.query_unsent_statuses(batch, now))


def tick_line(n: int, kind: str, interval: int, seconds: list[float], extra: str = "") -> str:
    worst = max(seconds)
    return (
        f"records={n} tick={kind} interval={interval} ticks={len(seconds)} "
        f"seconds_max={worst:.3f} seconds_mean={statistics.mean(seconds):.3f} "
        f"inside={'yes' if worst < interval else 'no'} "
        f"each={','.join(f'{x:.2f}' for x in seconds)}{extra}"
    )


async def starter_ticks(
    store, index, n: int, count: int, count_interval: float | None, max_processing: int
) -> None:
    starter = Starter(
        StarterPolicy(max_processing=max_processing),
        store,
        index,
        publisher=NullPublisher(),
        count_interval=None if count_interval is None else timedelta(seconds=count_interval),
    )
    client = RecordingClient()
    seconds: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        await starter.run(client)
        seconds.append(time.perf_counter() - start)
        await asyncio.sleep(max(0.0, STARTER_INTERVAL_S - seconds[-1]))  # the timer's period
    extra = f" count_interval={count_interval} started={len(client.started)}"
    print(tick_line(n, "starter", STARTER_INTERVAL_S, seconds, extra), flush=True)


async def ticks(store, index, state, n: int, args: argparse.Namespace) -> None:
    for count_interval in args.count_interval:
        await starter_ticks(store, index, n, args.ticks, count_interval, args.max_processing)
    sup = Supervisor(
        store,
        IndexSource(index, store),
        CosmosCheckpointStore(state, store.charges, f"bench-{uuid.uuid4().hex[:6]}"),
        StatusReporter(NullPublisher()),
        Alerts(NullPublisher()),
        POLICY,
        100,
    )
    seconds = []
    for _ in range(args.ticks):
        start = time.perf_counter()
        await sup.run()
        seconds.append(time.perf_counter() - start)
    print(tick_line(n, "supervisor(index)", SUPERVISOR_INTERVAL_S, seconds), flush=True)


async def bench(endpoint: str, key: str, sizes: list[int], args: argparse.Namespace) -> None:
    client = build_client(CosmosAccount(endpoint, key, verify_tls=False), connection_timeout=1800)
    now = datetime.now(UTC)
    async with client:
        for n in sizes:
            db = f"periodic-{uuid.uuid4().hex[:8]}"
            charges = RequestCharges()
            state = await ensure_state_container(client, db, "orderState")
            index = CosmosRecoveryIndex(
                await ensure_index_container(client, db, "recoveryIndex"), charges, shards=16
            )
            store = CosmosStateStore(state, charges)
            t = time.perf_counter()
            await load(state, index, n, args.pending_every, args.processing_every, now)
            print(f"# loaded {n} records in {time.perf_counter() - t:.1f}s", file=sys.stderr)
            if not args.no_queries:
                await queries(store, n, datetime.now(UTC), StarterPolicy().starter_batch_size)
            await ticks(store, index, state, n, args)
            await client.delete_database(db)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--pending-every", type=int, default=10)
    parser.add_argument("--processing-every", type=int, default=100)
    parser.add_argument("--no-queries", action="store_true", help="time whole ticks only")
    parser.add_argument(
        "--max-processing",
        type=int,
        default=1900,
        help="MAX_PROCESSING of the bench's Starter (default 1,900, production's until "
        "issue 44 priced the admission slots' hold; production's is 16,900 now)",
    )
    parser.add_argument(
        "--count-interval",
        type=lambda v: [None if x == "none" else float(x) for x in v.split(",")],
        default=[None],
        help="the Starter's count_interval in seconds, or a list (none,30): one set of "
        "ticks each (default: none, every tick counts)",
    )
    args = parser.parse_args()
    if min(args.ticks, args.pending_every, args.processing_every) < 1:
        parser.error("--ticks, --pending-every and --processing-every must be at least 1")
    exit_on_signals()
    server = start_server(port=0)
    try:
        asyncio.run(
            bench(server.endpoint, server.key, [int(s) for s in args.sizes.split(",")], args)
        )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
