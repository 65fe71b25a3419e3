"""Supervisor scan cost as the number of records grows: the state container's
query against the recovery index.

For each size it loads N state records into a fresh database on the local
Cosmos server (1% Processing with a deadline that passed in the last two
minutes, the rest finished), indexes the in-flight deadlines as the writers
would, then runs the Supervisor with each source, run after run as its timer
would, until every expired record has been handled, and prints per run:

    records=<n> expired=<m> design=<query|index> runs=<k> docs_read=<per run> requests=<per run> seconds=<per run>

docs_read is the most documents one run's requests returned (query results,
index entries and the point reads that check them); requests the most Cosmos
calls one run made; seconds the mean time of a run. The local server reports a request charge of 1 for everything,
so RU are not printed. On the local server the query design's time grows with
N because the server scans every document; in Azure the same query fans out to
every physical partition, which is what the index avoids.

    python bench/supervisor_bench.py [--sizes 1000,10000,100000] [--page-size 100]
        [--max-pages 20] [--expired-every 100] [--designs query,index]
        [--page-sizes 25,100,400] [--budget 8] [--shards 16]

`--max-pages 1` is the Supervisor before a run paged through its backlog
(ADR 018c); `--expired-every 1` makes every record an expired attempt (a
backlog left by an outage): then `runs` is how many timer ticks the
recovery takes. The index is sharded `--shards` ways (RECOVERY_INDEX_SHARDS,
ADR 019b).

Recovery time against the page size (issue 23 item 3): `--page-sizes`
repeats each design once per page size (the backlog loaded again each
time), and `--budget S` gives each run the time budget of
SUPERVISOR_RUN_BUDGET_SECONDS (the run's clock then moves with the wall
clock; without it the clock is stopped and only `--max-pages` ends a run).
Each line then adds `recovery_seconds` (the runs' wall time summed) and
`bound_seconds` = runs x the timer interval (10 s): when the backlog was
recovered at the latest, with the Supervisor's timer as deployed.

    python bench/supervisor_bench.py --sizes 5000 --expired-every 1 --designs index \
        --page-sizes 25,100,400 --max-pages 1000 --budget 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adapters.checkpoints import CosmosCheckpointStore
from adapters.clock import wait_event
from adapters.cosmos_client import RequestCharges, build_client, ensure_state_container
from adapters.recovery_index import CosmosRecoveryIndex, ensure_index_container
from adapters.settings import CosmosAccount
from adapters.state_store import CosmosStateStore, to_document
from devstack.cosmos import start_server
from devstack.process import exit_on_signals
from domain import state_machine as sm
from domain.models import OrderSubmitted, ProcessState
from domain.steps import DEFAULT_CATALOG
from reporting import Alerts, StatusReporter
from supervisor.sources import IndexSource, QuerySource
from supervisor.supervisor import Supervisor

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
STEPS = list(DEFAULT_CATALOG.names)  # domain/steps.json
POLICY = sm.RetryPolicy(threshold=10)


class FixedClock:
    """The Supervisor's Clock stopped at NOW: every run sees the same records as due."""

    def now(self) -> datetime:
        return NOW

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        return await wait_event(event, seconds)


class MovingClock(FixedClock):
    """NOW plus the wall time since the bench started, so a run's time
    budget runs out as it would in production (records stay due: they
    expired before NOW)."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def now(self) -> datetime:
        return NOW + timedelta(seconds=time.monotonic() - self._start)


INTERVAL_SECONDS = 10  # SUPERVISOR_SCHEDULE as deployed


class NullPublisher:
    """A MessagePublisher that drops every message: the bench measures the Supervisor, not a bus."""

    async def send(
        self,
        queue: str,
        body: bytes,
        message_id: str,
        application_properties: dict[str, str] | None = None,
    ) -> None:
        """Drop the message (a stub body: the arguments are the port's signature)."""


def record(i: int, expired: bool):
    order = OrderSubmitted.model_validate(
        {
            "OrderID": f"B-{i:06d}",
            "AppId": "webshop",
            "ReplyTo": "replies-webshop",
            "Customer": {"CustomerId": "C-1"},
            "Lines": [{"Sku": "S", "Quantity": 1, "UnitPrice": "1.00"}],
            "Total": "1.00",
        }
    )
    # expired deadlines fall in the two minutes before the run (steady state)
    claimed_at = NOW - POLICY.claim_timeout - timedelta(seconds=6 + i % 110)
    rec = sm.claim(sm.new_record(order, claimed_at, STEPS), claimed_at, POLICY)
    if not expired:
        rec = rec.model_copy(
            update={"ProcessState": ProcessState.PROCESSED, "LockedBy": None, "CompleteBy": None}
        )
    return rec


async def load(container, index, n: int, expired_every: int) -> int:
    gate = asyncio.Semaphore(64)
    expired = 0

    async def put(i: int):
        nonlocal expired
        is_expired = i % expired_every == 0
        rec = record(i, is_expired)
        async with gate:
            if is_expired:
                expired += 1
                await index.add(rec.id, rec.CompleteBy, rec.Attempt)
            await container.upsert_item(to_document(rec))

    await asyncio.gather(*(put(i) for i in range(n)))
    return expired


async def run_design(
    design, store, index, state, page_size, charges, max_pages=20, budget=None
) -> tuple[int, int, int, float]:
    source = IndexSource(index, store) if design == "index" else QuerySource(store)
    sup = Supervisor(
        store,
        source,
        CosmosCheckpointStore(state, charges, f"bench-{design}-{page_size}"),
        StatusReporter(NullPublisher()),
        Alerts(NullPublisher()),
        POLICY,
        page_size,
        clock=FixedClock() if budget is None else MovingClock(),
        max_pages=max_pages,
        budget=budget,
    )
    runs, most_docs, most_requests, elapsed = 0, 0, 0, 0.0
    while True:
        charges.by_kind.clear()
        start = time.perf_counter()
        report = await sup.run()
        elapsed += time.perf_counter() - start
        runs += 1
        if os.environ.get("BENCH_DEBUG"):
            print(design, report, file=sys.stderr)
        docs = report.read * (2 if design == "index" else 1)  # index: entry + point read
        most_docs, most_requests = max(most_docs, docs), max(most_requests, charges.calls)
        # query: the pass has reached its end; index: a run found nothing due
        if report.read == 0 or report.examined == 0 or (design == "query" and report.pass_finished):
            break
    return runs, most_docs, most_requests, elapsed / runs


async def bench(
    endpoint: str,
    key: str,
    sizes: list[int],
    page_size: int,
    max_pages: int = 20,
    expired_every: int = 100,
    designs: tuple[str, ...] = ("query", "index"),
    page_sizes: list[int] | None = None,
    budget: timedelta | None = None,
    shards: int = 16,
) -> None:
    # A generous timeout: on the local server the query design's scan of every
    # document gets slow at 100,000 records, and that slowness is the figure.
    client = build_client(CosmosAccount(endpoint, key, verify_tls=False), connection_timeout=300)
    async with client:
        for n in sizes:
            db = f"bench-{uuid.uuid4().hex[:8]}"
            charges = RequestCharges()
            state = await ensure_state_container(client, db, "orderState")
            index = CosmosRecoveryIndex(
                await ensure_index_container(client, db, "recoveryIndex"), charges, shards=shards
            )
            store = CosmosStateStore(state, charges)
            t = time.perf_counter()
            expired = await load(state, index, n, expired_every)
            print(f"# loaded {n} records in {time.perf_counter() - t:.1f}s", file=sys.stderr)
            first = True
            for design in designs:
                for size in page_sizes or [page_size]:
                    if not first:
                        # the last pass recovered them; expire them again for a like-for-like pass
                        await load(state, index, n, expired_every)
                    first = False
                    try:
                        runs, docs, requests, seconds = await run_design(
                            design, store, index, state, size, charges, max_pages, budget
                        )
                    except Exception as exc:  # noqa: BLE001 - a failed design is a result too
                        print(
                            f"records={n} expired={expired} design={design} "
                            f"failed={type(exc).__name__}: {str(exc)[:120]}",
                            flush=True,
                        )
                        continue
                    timed = (
                        ""
                        if budget is None
                        else f" budget={budget.total_seconds():g} "
                        f"recovery_seconds={runs * seconds:.1f} "
                        f"bound_seconds={runs * INTERVAL_SECONDS}"
                    )
                    print(
                        f"records={n} expired={expired} design={design} "
                        f"{'shards=' + str(shards) + ' ' if design == 'index' else ''}"
                        f"page_size={size} max_pages={max_pages} "
                        f"runs={runs} docs_read={docs} "
                        f"requests={requests} seconds={seconds:.3f}{timed}",
                        flush=True,
                    )
            await client.delete_database(db)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--max-pages", type=int, default=20)
    parser.add_argument("--expired-every", type=int, default=100)
    parser.add_argument("--designs", default="query,index")
    parser.add_argument("--page-sizes", default="", help="several page sizes, one pass each")
    parser.add_argument("--budget", type=float, default=None, help="a run's time budget, seconds")
    parser.add_argument("--shards", type=int, default=16, help="RECOVERY_INDEX_SHARDS")
    args = parser.parse_args()
    if args.max_pages < 1 or args.expired_every < 1 or args.page_size < 1:
        parser.error("--page-size, --max-pages and --expired-every must be at least 1")
    designs = tuple(d for d in args.designs.split(",") if d)
    if not designs or set(designs) - {"query", "index"}:
        parser.error("--designs takes query and/or index")
    try:
        page_sizes = [int(p) for p in args.page_sizes.split(",") if p]
    except ValueError:
        parser.error("--page-sizes takes whole numbers")
    if any(p < 1 for p in page_sizes) or not 1 <= args.shards <= 999:
        parser.error("page sizes must be at least 1, --shards 1 to 999")
    if args.budget is not None and not args.budget > 0:
        parser.error("--budget must be a positive number of seconds")
    exit_on_signals()  # SIGTERM/SIGHUP run the `finally` that stops the server
    server = start_server(port=0)
    try:
        asyncio.run(
            bench(
                server.endpoint,
                server.key,
                [int(s) for s in args.sizes.split(",")],
                args.page_size,
                args.max_pages,
                args.expired_every,
                designs,
                page_sizes,
                None if args.budget is None else timedelta(seconds=args.budget),
                args.shards,
            )
        )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
