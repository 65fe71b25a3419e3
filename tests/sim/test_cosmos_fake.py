"""The simulation's Cosmos container fake (sim/cosmos.py) under the project's
real adapters: the state store's claims, guarded updates, keyset-paged expired
scan and counts, and the recovery index's bucket pages, with the SDK's own
exception types. If the fake's SQL subset drifted from what the adapters send,
these would fail before any simulation result could be trusted."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import pytest
from azure.cosmos.exceptions import CosmosHttpResponseError

from adapters.ports import minute_of
from adapters.recovery_index import CosmosRecoveryIndex, partition_of
from adapters.state_store import CosmosStateStore
from domain import state_machine as sm
from domain.errors import StaleError, TransientError
from domain.models import OrderSubmitted, ProcessState
from sim.cosmos import SimContainer
from sim.world import FaultConfig, World
from tests.builders import claim, order_payload

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
POLICY = sm.RetryPolicy(threshold=2, long_retries=0, claim_timeout=timedelta(seconds=30))


def _order(oid: str) -> OrderSubmitted:
    # Records here are keyed by the bare OrderID (`key=oid`): the fake, like
    # the real container, stores whatever key it is given.
    return OrderSubmitted.model_validate(order_payload(oid))


def _run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def _store():
    world = World(1, FaultConfig())
    return world, SimContainer(world, "state", "/id")


def test_claims_updates_and_stale_etags_as_the_real_store():
    async def go():
        _, container = _store()
        store = CosmosStateStore(container)
        record, _, created = await store.create_if_absent(
            sm.new_record(_order("A"), T0, [], key="A")
        )
        assert created
        _, _, again = await store.create_if_absent(sm.new_record(_order("A"), T0, [], key="A"))
        assert not again
        assert [r.id for r, _ in await store.query_claimable(10, T0)] == ["A"]
        claimed = await claim(store, "A", T0, POLICY)
        assert claimed.ProcessState is ProcessState.PROCESSING
        assert claimed.LockedBy == "A:1"
        assert await claim(store, "A", T0, POLICY) is None  # not claimable twice
        assert await store.count_in_state(ProcessState.PROCESSING) == 1
        with pytest.raises(StaleError):
            await store.update("A", lambda r: r, "A:2")  # guard: not the owner
        _, etag = await store.read("A")
        await store.update("A", lambda r: sm.mark_processed(r, "A:1", T0), "A:1")
        with pytest.raises(StaleError):
            await store.replace(record, etag)  # 412 on the old etag
        assert (await store.read("A"))[0].ProcessState is ProcessState.PROCESSED

    _run(go())


def test_expired_scan_pages_by_keyset_in_deadline_order():
    async def go():
        _, container = _store()
        store = CosmosStateStore(container)
        rng = random.Random(3)
        for i in range(7):
            oid = f"O{i}"
            await store.create_if_absent(sm.new_record(_order(oid), T0, [], key=oid))
            await claim(store, oid, T0 + timedelta(seconds=rng.randint(0, 20)), POLICY)
        await store.update("O3", lambda r: sm.mark_processed(r, "O3:1", T0), "O3:1")
        now = T0 + timedelta(minutes=5)
        seen, token = [], None
        while True:
            page, token = await store.query_expired(now, T0 - timedelta(days=1), 2, token)
            seen += [(r.CompleteBy, r.id) for r, _ in page]
            if token is None:
                break
        assert seen == sorted(seen)  # (CompleteBy, id) order across pages, no repeats
        assert len(seen) == len(set(seen))
        assert {oid for _, oid in seen} == {f"O{i}" for i in range(7)} - {"O3"}

    _run(go())


def test_recovery_index_pages_buckets_and_earliest_bucket():
    """The walk goes minute by minute, each minute's bare partition and then
    its shards in order (ADR 019b); a page stops at `max_items` inside a
    partition and resumes there."""

    async def go():
        world = World(1, FaultConfig())
        index = CosmosRecoveryIndex(SimContainer(world, "index", "/bucket"), shards=4)
        for i, second in enumerate((5, 10, 70, 75, 130)):
            await index.add(f"O{i}", T0 + timedelta(seconds=second), 1)
        earliest = await index.earliest_bucket()
        assert earliest is not None
        assert minute_of(earliest) == "2026-11-30T08:00:00"
        entries, bucket, after, done = await index.page(
            T0 + timedelta(minutes=3), "2026-11-30T08:00:00", "", 3
        )
        # Minute by minute; within a minute by shard (then id).
        assert {e.order_id for e in entries[:2]} == {"O0", "O1"}
        assert entries[2].order_id in ("O2", "O3")
        assert all(e.bucket == partition_of(e.complete_by, e.order_id, 4) for e in entries)
        assert not done
        rest, bucket, after, done = await index.page(T0 + timedelta(minutes=3), bucket, after, 10)
        assert {e.order_id for e in entries + rest} == {f"O{i}" for i in range(5)}
        assert rest[-1].order_id == "O4"
        assert done
        assert minute_of(bucket) == "2026-11-30T08:03:00"

    _run(go())


def test_throttling_raises_the_sdk_error_the_adapter_turns_transient():
    world = World(1, FaultConfig())
    world.faults.storms.append((T0 - timedelta(seconds=1), T0 + timedelta(hours=1)))
    container = SimContainer(world, "state", "/id")

    async def go():
        with pytest.raises(CosmosHttpResponseError) as raw:
            await container.read_item("A", partition_key="A")
        assert raw.value.status_code == 429
        assert raw.value.headers["x-ms-retry-after-ms"]
        with pytest.raises(TransientError):
            await CosmosStateStore(container).read("A")

    _run(go())


def test_an_owner_is_not_refused_on_a_read_that_lags_its_claim():
    """Seed 49 --orders 3: a read inside a guarded update returned the version
    before the claim; the owner's write was refused as stale and its
    compensation ended "stale", leaving the record Compensating for good.
    A refusal now stands only once the version it was read from is current."""

    class LagOnce(SimContainer):
        lag = 0

        async def read_item(self, item, partition_key, response_hook=None, **kw):
            key = (str(partition_key), str(item))
            if self.lag and key in self.previous:
                self.lag -= 1
                await self._op("read", response_hook)
                return dict(self.previous[key])
            return await super().read_item(item, partition_key, response_hook, **kw)

    async def go():
        world = World(1, FaultConfig())
        container = LagOnce(world, "state", "/id")
        store = CosmosStateStore(container)
        await store.create_if_absent(sm.new_record(_order("A"), T0, [], key="A"))
        await claim(store, "A", T0, POLICY)  # the previous version is Pending, unlocked
        container.lag = 1
        done, _ = await store.update(
            "A", lambda r: sm.mark_processed(r, "A:1", T0), "A:1", confirm_refusal=True
        )
        assert done.ProcessState is ProcessState.PROCESSED
        # A refusal read from the current version still stands, and writes nothing new.
        _, _etag = await store.read("A")
        with pytest.raises(StaleError):
            await store.update("A", lambda r: r, "A:2", confirm_refusal=True)
        assert (await store.read("A"))[0].ProcessState is ProcessState.PROCESSED

    _run(go())


def test_a_batch_of_deletes_is_all_or_nothing_like_a_transactional_batch():
    from azure.cosmos.exceptions import CosmosBatchOperationError

    async def go():
        world = World(1, FaultConfig())
        container = SimContainer(world, "index", "/bucket")
        index = CosmosRecoveryIndex(container, shards=1)  # one partition for the three
        for oid in ("A", "B", "C"):
            await index.add(oid, T0 + timedelta(seconds=10), 1)
        ids = sorted(doc["id"] for doc in container.docs.values())
        bucket = "2026-11-30T08:00:00|000"
        with pytest.raises(CosmosBatchOperationError):
            await container.execute_item_batch(
                [("delete", (ids[0],)), ("delete", ("missing",))], partition_key=bucket
            )
        assert len(container.docs) == 3  # nothing applied
        await container.execute_item_batch(
            [("delete", (i,)) for i in ids[:2]], partition_key=bucket
        )
        assert sorted(doc["id"] for doc in container.docs.values()) == ids[2:]

    _run(go())


def test_a_lagging_query_keeps_session_guarantees_and_misses_other_sessions_writes():
    """Session consistency (sim.cosmos): a replica behind serves another
    session's query the previous version, however old, but never one older
    than what the querying session wrote or read (read-your-writes,
    monotonic reads); a call of no session (an operator's own client) may lag."""
    world = World(1, FaultConfig(query_lag=1.0))
    container = SimContainer(world, "state", "/id")
    running: dict[str, str | None] = {"session": "A"}
    container.session = lambda: running["session"]
    count = "SELECT VALUE COUNT(1) FROM c WHERE c.ProcessState = 'Processing'"

    async def processing(session: str | None) -> int:
        running["session"] = session
        (counted,) = [n async for n in container.query_items(count)]
        return counted

    async def go():
        await container.create_item({"id": "X", "ProcessState": "Pending"})
        await container.replace_item("X", {"id": "X", "ProcessState": "Processing"})
        assert await processing("A") == 1  # its own write
        assert await processing("B") == 0  # another session's: the previous version
        assert await processing(None) == 0
        running["session"] = "B"
        await container.read_item("X", partition_key="X")  # B reads the claim once...
        assert await processing("B") == 1  # ...and no later query of B goes back on it
        assert await processing(None) == 0

    _run(go())
