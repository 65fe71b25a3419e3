"""The recovery index's sharded key (docs/adr/019b-sharded-recovery-index.md):
the walk over a minute's partitions, entries written before the shards, the
cursor rules per minute, per-partition discard batches, and the setting. The
real adapters over the simulation's in-memory container (the same tests
against the Cosmos server: tests/integration/supervisor/test_sharded_index.py)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from adapters.ports import bucket_of, minute_of
from adapters.recovery_index import (
    DISCARD_SPREAD,
    SHARDS_DOCUMENT,
    CosmosRecoveryIndex,
    entry_id,
    next_partition,
    partition_of,
    shard_of,
)
from adapters.settings import SettingsError, load_settings
from adapters.state_store import CosmosStateStore
from domain import state_machine as sm
from domain.models import OrderSubmitted, ProcessState
from reporting import Alerts, StatusReporter
from sim.cosmos import SimContainer
from sim.world import FaultConfig, World
from supervisor.sources import IndexSource, checkpoint_name
from supervisor.supervisor import Supervisor
from tests.builders import ReadClock, claim, order_payload
from tests.fakes import RecordingPublisher
from tests.unit.supervisor.test_supervisor import MemoryCheckpoints

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
POLICY = sm.RetryPolicy(threshold=2, long_retries=0, claim_timeout=timedelta(seconds=30))
MINUTE = bucket_of(T0)


def _run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def _rig(shards: int):
    world = World(1, FaultConfig())
    index_c = SimContainer(world, "index", "/bucket")
    store = CosmosStateStore(SimContainer(world, "state", "/id"))
    return index_c, CosmosRecoveryIndex(index_c, shards=shards), store


async def _claimed(store, index, oid: str, at: datetime) -> None:
    """A record claimed at `at`, indexed first, as the Starter does."""
    order = OrderSubmitted.model_validate(order_payload(oid))
    await store.create_if_absent(sm.new_record(order, at, [], key=oid))
    await index.add(oid, at + POLICY.claim_timeout, 1)
    assert (await claim(store, oid, at, POLICY)).ProcessState is ProcessState.PROCESSING


def _supervisor(store, source, page_size: int, now):
    bus = RecordingPublisher()
    return Supervisor(
        store,
        source,
        MemoryCheckpoints(),
        StatusReporter(bus),
        Alerts(bus),
        POLICY,
        page_size,
        slack=timedelta(seconds=5),
        clock=ReadClock(now),
    )


def test_a_minutes_partitions_are_walked_in_the_order_they_sort():
    walk = [MINUTE]
    while minute_of(walk[-1]) == MINUTE:
        walk.append(next_partition(walk[-1], 3))
    assert walk == [
        MINUTE,
        f"{MINUTE}|000",
        f"{MINUTE}|001",
        f"{MINUTE}|002",
        bucket_of(T0 + timedelta(minutes=1)),
    ]
    assert walk == sorted(walk)  # a cursor over partitions compares as (minute, shard)
    assert {minute_of(p) for p in walk[:-1]} == {MINUTE}
    # A partition this version does not write (a shard past the count, a
    # mangled one) ends the minute instead of failing the run.
    assert next_partition(f"{MINUTE}|007", 3) == walk[-1]
    assert next_partition(f"{MINUTE}|x", 3) == walk[-1]


def test_the_shard_of_an_order_is_stable_and_spreads_the_orders():
    counts = Counter(shard_of(f"webshop:ORD-{i}", 16) for i in range(3200))
    assert set(counts) == set(range(16))
    assert max(counts.values()) < 1.3 * 200  # 200 each if perfectly even
    # crc32, not Python's per-process salted hash: every process agrees.
    assert shard_of("webshop:ORD-1", 16) == 2013078551 % 16 == 7
    assert partition_of(T0 + timedelta(seconds=42), "webshop:ORD-1", 16) == f"{MINUTE}|007"


def test_entries_written_before_the_shards_are_still_found_and_recovered():
    """A rolling deploy: the previous version wrote entries under the bare
    minute (and may go on doing so until its last host stops). The sharded
    walk reads a minute's bare partition first, so they are recovered and
    removed like the sharded ones."""

    async def go():
        index_c, index, store = _rig(16)
        legacy = CosmosRecoveryIndex(index_c, shards=16)
        for oid in ("OLD-1", "OLD-2"):
            order = OrderSubmitted.model_validate(order_payload(oid))
            await store.create_if_absent(sm.new_record(order, T0, [], key=oid))
            deadline = T0 + POLICY.claim_timeout
            # exactly the document the version before the shards wrote
            index_c.docs[(MINUTE, entry_id(oid, deadline))] = index_c._stamp(
                {
                    "id": entry_id(oid, deadline),
                    "bucket": bucket_of(deadline),
                    "OrderID": oid,
                    "CompleteBy": deadline.isoformat(),
                    "Attempt": 1,
                }
            )
            await claim(store, oid, T0, POLICY)
        for oid in ("NEW-1", "NEW-2", "NEW-3"):
            await _claimed(store, legacy, oid, T0)
        now = T0 + timedelta(minutes=2)
        sup = _supervisor(store, IndexSource(index, store), 2, lambda: now)
        for _ in range(3):
            await sup.run()
        for oid in ("OLD-1", "OLD-2", "NEW-1", "NEW-2", "NEW-3"):
            assert (await store.read(oid))[0].ProcessState is ProcessState.PENDING, oid
        assert index_c.docs == {}

    _run(go())


def test_a_late_minute_keeps_the_cursor_at_its_start_across_shards():
    """Cursor rule 2 per minute: in a bucket that may still get entries, a
    claim may index into a shard the cursor has passed. The cursor stays at
    the minute's start (its bare partition), not at the shard it reached."""

    async def go():
        _index_c, index, store = _rig(16)
        source = IndexSource(index, store)
        ids = [f"B-{i}" for i in range(40)]
        late = [o for o in ids if shard_of(o, 16) == 0]
        early = [o for o in ids if shard_of(o, 16) >= 8]
        for oid in early:
            await _claimed(store, index, oid, T0 - timedelta(seconds=20))  # due T0 + 10 s
        upper = T0 + timedelta(seconds=40)
        candidates, cursor, _ = await source.page(upper, 3, None)
        assert len(candidates) == 3
        assert json.loads(cursor) == [MINUTE, ""]
        # Now an order of shard 0, before every shard the page read, is due in that minute.
        await _claimed(store, index, late[0], T0 + timedelta(seconds=15))  # due T0 + 45 s
        found: list[str] = []
        later = T0 + timedelta(seconds=70)
        for _ in range(len(early)):
            candidates, cursor, _ = await source.page(later, 3, cursor)
            found += [c.record.id for c in candidates]
            for c in candidates:
                await c.done()
        assert late[0] in found

    _run(go())


def test_a_first_scan_starts_at_the_start_of_the_earliest_minute():
    async def go():
        _index_c, index, store = _rig(16)
        source = IndexSource(index, store)
        # Only a shard past 0 holds an entry; a claim may later index into shard 0.
        oid = next(f"E-{i}" for i in range(100) if shard_of(f"E-{i}", 16) > 5)
        await _claimed(store, index, oid, T0 + timedelta(seconds=10))  # due T0 + 40 s
        _, cursor, _ = await source.page(T0 + timedelta(seconds=20), 5, None)
        assert json.loads(cursor) == [MINUTE, ""]

    _run(go())


def test_the_shard_count_document_is_never_read_as_an_entry():
    async def go():
        index_c, index, store = _rig(4)
        index_c.docs[(SHARDS_DOCUMENT["bucket"], SHARDS_DOCUMENT["id"])] = index_c._stamp(
            {**SHARDS_DOCUMENT, "shards": 4}
        )
        assert await index.earliest_bucket() == SHARDS_DOCUMENT["bucket"]
        upper = T0 + timedelta(seconds=30)
        candidates, cursor, read = await IndexSource(index, store).page(upper, 10, None)
        assert (candidates, read) == ([], 0)
        assert json.loads(cursor) == [bucket_of(upper - timedelta(seconds=10)), ""]
        assert index.unreadable == []
        assert store.unreadable == []

    _run(go())


def test_discards_gather_per_partition():
    """Sharded, a process's discards spread over the shards: each
    partition's discards go together once `discard_batch` of them gathered,
    so a batch stays full instead of one delete per shard."""

    async def go():
        index_c, _, _ = _rig(4)
        index = CosmosRecoveryIndex(index_c, shards=4, discard_batch=3)
        oids = [f"D-{i}" for i in range(40)]
        at = T0 + timedelta(seconds=30)
        for oid in oids:
            await index.add(oid, at, 1)
        shard0 = [o for o in oids if shard_of(o, 4) == 0][:3]
        others = [o for o in oids if shard_of(o, 4) != 0][:2]
        for oid in others + shard0[:2]:
            await index.discard(oid, at)
        assert len(index_c.docs) == 40  # nothing full yet
        await index.discard(shard0[2], at)
        assert len(index_c.docs) == 37  # shard 0's three, in one request
        assert index.charges.by_kind["index_remove_batch"].calls == 1
        await index.flush()
        assert len(index_c.docs) == 35

    _run(go())


def test_discards_waiting_in_an_idle_process_go_one_spread_after_the_first():
    """ADR 021k: with no more discards to fill a batch or spread it, those
    waiting still go DISCARD_SPREAD after the first, long before their
    entries are due: the Supervisor would take a due entry of a Processed
    record for a status maybe unsent, and send it again."""

    async def go():
        index_c, _, _ = _rig(4)
        wakes = []
        index = CosmosRecoveryIndex(
            index_c, shards=4, wake=lambda delay, fn: wakes.append((delay, fn))
        )
        at = T0 + timedelta(seconds=30)
        for oid in ("W-1", "W-2"):
            await index.add(oid, at, 1)
            await index.discard(oid, at)
        assert len(index_c.docs) == 2
        ((delay, flush),) = wakes  # one wake for every discard waiting
        assert delay == DISCARD_SPREAD.total_seconds()
        await flush()
        assert index_c.docs == {}

    _run(go())


@pytest.mark.parametrize("page_size", [1, 7, 100])
def test_a_backlog_over_every_shard_is_recovered_whatever_the_page_size(page_size):
    async def go():
        index_c, index, store = _rig(16)
        oids = [f"K-{i}" for i in range(60)]
        for i, oid in enumerate(oids):
            await _claimed(store, index, oid, T0 + timedelta(seconds=i))
        now = T0 + timedelta(minutes=3)
        sup = _supervisor(store, IndexSource(index, store), page_size, lambda: now)
        for _ in range(200):
            report = await sup.run()
            if report.examined == 0:
                break
        for oid in oids:
            assert (await store.read(oid))[0].ProcessState is ProcessState.PENDING, oid
        assert index_c.docs == {}

    _run(go())


def test_the_index_supervisor_keeps_a_checkpoint_of_its_own():
    assert checkpoint_name("index") == "supervisor-index-sharded"
    assert checkpoint_name("query") == "supervisor-query"


BASE = {
    "CosmosDbConnection": "AccountEndpoint=https://127.0.0.1:8081/;AccountKey=a2V5",
    "ServiceBusConnection": "Endpoint=sb://127.0.0.1;SharedAccessKeyName=k;SharedAccessKey=a2V5",
}


def test_the_shard_setting():
    assert load_settings(BASE).recovery_index_shards == 16
    assert load_settings({**BASE, "RECOVERY_INDEX_SHARDS": "4"}).recovery_index_shards == 4
    for bad in ("0", "1000", "four", "-2"):
        with pytest.raises(SettingsError, match="RECOVERY_INDEX_SHARDS"):
            load_settings({**BASE, "RECOVERY_INDEX_SHARDS": bad})


def test_an_empty_stretch_is_crossed_with_one_query_and_never_past_the_settled_bucket():
    """With 16 shards a minute is 17 queries; entries 40 minutes apart would
    take 680 queries (six pages of MAX_BUCKETS_PER_PAGE) to reach. After a
    minute of empty partitions the walk asks for the next partition holding
    a document and jumps there, but never past the first bucket that may
    still get entries (whose minutes it then walks in full)."""

    async def go():
        _index_c, index, store = _rig(16)
        await _claimed(store, index, "FIRST", T0)  # due T0 + 30 s
        await _claimed(store, index, "FAR", T0 + timedelta(minutes=40))
        await _claimed(store, index, "AHEAD", T0 + timedelta(minutes=100))  # not due
        source = IndexSource(index, store)
        upper = T0 + timedelta(minutes=50)
        index.charges.by_kind.clear()
        candidates, cursor, _ = await source.page(upper, 10, json.dumps([MINUTE, ""]))
        assert [c.record.id for c in candidates] == ["FIRST", "FAR"]
        # one page: the run-up in minute 0 and after FAR, 3 jumps, the last two minutes
        assert index.charges.by_kind["index_query"].calls <= 4 * 17 + 3 + 17
        # The jump toward AHEAD stopped at the bucket of upper - SETTLE and
        # walked on to the end of upper's bucket: the cursor is at its start,
        # not at AHEAD (a claim made now indexes behind AHEAD).
        assert json.loads(cursor) == [bucket_of(upper), ""]
        await _claimed(store, index, "NOW", upper - timedelta(seconds=25))  # due upper + 5 s
        later = upper + timedelta(seconds=40)
        candidates, cursor, _ = await source.page(later, 10, cursor)
        assert "NOW" in [c.record.id for c in candidates]

    _run(go())


def test_recording_the_shard_count_under_throttling_is_a_transient_failure():
    """The start-up check's read and create go through the adapters' error
    translation: a throttled account fails the build as a retryable error,
    not as a refused setting, and nothing is recorded."""
    from adapters.recovery_index import ensure_shard_count
    from domain.errors import TransientError

    world = World(1, FaultConfig())
    world.faults.storms.append((T0 - timedelta(seconds=1), T0 + timedelta(hours=1)))
    container = SimContainer(world, "index", "/bucket")
    container.id = "recoveryIndex"
    with pytest.raises(TransientError):
        _run(ensure_shard_count(container, 16))
    assert container.docs == {}
    world.faults.storms.clear()
    _run(ensure_shard_count(container, 16))
    with pytest.raises(SettingsError, match="set up with 16 shards"):
        _run(ensure_shard_count(container, 4))


def test_a_shard_count_recorded_moments_ago_and_not_yet_readable_is_transient():
    """Another process created the `~config` document moments ago and this
    process's reads land on a replica that has not seen it (a 404 both before
    and after its own create's 409): a retryable failure, not a SettingsError
    naming a count that was never read. Found while closing the fault
    surface's last gap there (session_lag at `ensure_shard_count.recorded`):
    the simulation restarts a host whose start fails, so no check saw it."""
    from adapters.recovery_index import SHARDS_DOCUMENT, ensure_shard_count
    from domain.errors import TransientError

    world = World(1, FaultConfig())
    container = SimContainer(world, "index", "/bucket")
    container.id = "recoveryIndex"
    _run(container.create_item({**SHARDS_DOCUMENT, "shards": 16}))  # the other process
    world.faults.config.query_lag = 1.0  # every read of a new document lags
    with pytest.raises(TransientError, match="not yet readable"):
        _run(ensure_shard_count(container, 16))
    world.faults.config.query_lag = 0.0
    _run(ensure_shard_count(container, 16))  # the retried start
    with pytest.raises(SettingsError, match="set up with 16 shards"):
        _run(ensure_shard_count(container, 4))
