"""IndexSource (supervisor/sources.py) against reads that lag the latest write.

Under Session consistency another client's read may return an older version of
a record. The Supervisor's index source must never remove the index entry of a
live attempt on such a read: that attempt would then never be recovered
(found by the seeded simulation, seed 157 --orders 3; earlier seed 65). The
index and the state store are the real adapters over the simulation's
in-memory container, with the key unsharded (one partition a minute, as
the regressions were found) and sharded 16 ways (ADR 019b)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from adapters.ports import ANY_OWNER
from adapters.recovery_index import CosmosRecoveryIndex
from adapters.state_store import CosmosStateStore
from domain import state_machine as sm
from domain.models import OrderState, OrderSubmitted, ProcessState
from sim.cosmos import SimContainer
from sim.world import FaultConfig, World
from supervisor.sources import LOST_CLAIM_AFTER, IndexSource
from tests.builders import ReadClock, claim, order_payload

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
POLICY = sm.RetryPolicy(threshold=2, long_retries=0, claim_timeout=timedelta(seconds=30))

pytestmark = pytest.mark.parametrize("shards", [1, 16])


def _order(oid: str) -> OrderSubmitted:
    # Records here are keyed by the bare OrderID (`key=oid`), as records
    # written before keys named the application are: the index and the
    # Supervisor take keys from records, in either form.
    return OrderSubmitted.model_validate(order_payload(oid))


class LaggingStore:
    """The state store, except that `read` returns a version captured earlier
    (what a read by another session may see)."""

    def __init__(self, store: CosmosStateStore) -> None:
        self._store = store
        self.old: tuple[OrderState, str] | None = None

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def read(self, order_id: str) -> tuple[OrderState, str]:
        return self.old if self.old is not None else await self._store.read(order_id)


def _sim_store_and_index(shards: int) -> tuple[CosmosStateStore, CosmosRecoveryIndex]:
    """The real adapters over the simulation's in-memory containers."""
    world = World(1, FaultConfig())
    return (
        CosmosStateStore(SimContainer(world, "state", "/id")),
        CosmosRecoveryIndex(SimContainer(world, "index", "/bucket"), shards=shards),
    )


async def _claimed_with_index(shards: int):
    world = World(1, FaultConfig())
    index_c = SimContainer(world, "index", "/bucket")
    store = CosmosStateStore(SimContainer(world, "state", "/id"))
    index = CosmosRecoveryIndex(index_c, shards=shards)
    lagging = LaggingStore(store)
    await store.create_if_absent(sm.new_record(_order("A"), T0, [], key="A"))
    lagging.old = await store.read("A")  # Pending, Attempt 0: the version before the claim
    # As the Starter does: index the attempt's deadline, then claim.
    await index.add("A", T0 + timedelta(seconds=20), 1)
    claimed = await claim(store, "A", T0, POLICY)
    assert claimed.ProcessState is ProcessState.PROCESSING
    assert claimed.Attempt == 1
    return index_c, index, store, lagging


def test_a_lagging_read_from_before_the_claim_keeps_the_live_attempts_entry(shards):
    async def go():
        index_c, index, _, lagging = await _claimed_with_index(shards)
        source = IndexSource(index, lagging)
        for upper in (T0 + timedelta(seconds=10), T0 + timedelta(seconds=40)):  # not yet due; due
            candidates, cursor, _ = await source.page(upper, 10, None)
            assert candidates == []
            assert [d["OrderID"] for d in index_c.docs.values()] == ["A"], upper
            # The cursor does not pass the kept entry: the next run reads it again.
            again, _, read = await source.page(upper, 10, cursor)
            assert read == 1
            assert again == []

    asyncio.new_event_loop().run_until_complete(go())


def test_once_the_read_catches_up_the_expired_attempt_is_recovered(shards):
    async def go():
        _index_c, index, _, lagging = await _claimed_with_index(shards)
        source = IndexSource(index, lagging)
        upper = T0 + timedelta(seconds=40)
        _, cursor, _ = await source.page(upper, 10, None)
        lagging.old = None
        candidates, _, _ = await source.page(upper, 10, cursor)
        assert [(c.record.id, c.record.Attempt) for c in candidates] == [("A", 1)]

    asyncio.new_event_loop().run_until_complete(go())


def test_a_lost_claims_entry_stops_holding_the_cursor_once_long_past(shards):
    """A claim that never landed (a fast path whose message lock was lost)
    leaves its entry on a record still Pending at the older attempt. Held for
    good, the cursor kept the entries after it from recovery, and with the
    admission cap full of their attempts the record could never be claimed
    (sim seed 34001820). Long past its deadline, the entry moves ahead."""

    async def go():
        world = World(1, FaultConfig())
        index_c = SimContainer(world, "index", "/bucket")
        store = CosmosStateStore(SimContainer(world, "state", "/id"))
        index = CosmosRecoveryIndex(index_c, shards=shards)
        await store.create_if_absent(sm.new_record(_order("A"), T0, [], key="A"))
        await index.add("A", T0 + timedelta(seconds=20), 1)  # the claim is then lost
        # B's attempt is live, due in the next minute's bucket.
        await store.create_if_absent(sm.new_record(_order("B"), T0, [], key="B"))
        await index.add("B", T0 + timedelta(seconds=70), 1)
        await claim(store, "B", T0 + timedelta(seconds=40), POLICY)
        source = IndexSource(index, store)
        # Within LOST_CLAIM_AFTER the lost claim's entry may be a lagging read:
        # held, and a run whose page holds only it makes no progress (pages of
        # one, as the simulation's; a page of held entries in production).
        upper = T0 + timedelta(seconds=90)
        candidates, cursor, read = await source.page(upper, 1, None)
        assert (candidates, read) == ([], 1)
        candidates, cursor, read = await source.page(upper, 1, cursor)
        assert (candidates, read) == ([], 1)
        # Long past: A's entry moves ahead and B's expired attempt is reached.
        upper = T0 + timedelta(seconds=20) + LOST_CLAIM_AFTER + timedelta(seconds=1)
        candidates, cursor, _ = await source.page(upper, 1, cursor)
        assert candidates == []
        candidates, _, _ = await source.page(upper, 1, cursor)
        assert [(c.record.id, c.record.Attempt) for c in candidates] == [("B", 1)]
        moved = [d for d in index_c.docs.values() if d["OrderID"] == "A"]
        assert [(d["Attempt"], d["CompleteBy"] > upper.isoformat()) for d in moved] == [(1, True)]

    asyncio.new_event_loop().run_until_complete(go())


def test_entries_of_ended_or_replaced_attempts_are_still_removed(shards):
    async def go():
        index_c, index, store, lagging = await _claimed_with_index(shards)
        source = IndexSource(index, lagging)
        await store.update("A", lambda r: sm.mark_processed(r, "A:1", T0), "A:1")
        lagging.old = None
        # Not due yet: the entry stays and its record is not even read (issue 12).
        reads = store.charges.by_kind.get("read")
        before = reads.calls if reads else 0
        _, cursor, _ = await source.page(T0 + timedelta(seconds=10), 10, None)
        assert len(index_c.docs) == 1
        assert (
            store.charges.by_kind["read"].calls if "read" in store.charges.by_kind else 0
        ) == before
        # Due: the ended attempt's entry is removed.
        await source.page(T0 + timedelta(seconds=30), 10, cursor)
        assert index_c.docs == {}
        # A lost claim's extra entry on a record that can never be claimed again.
        await index.add("A", T0 + timedelta(seconds=20), 2)
        await source.page(T0 + timedelta(seconds=30), 10, None)
        assert index_c.docs == {}

    asyncio.new_event_loop().run_until_complete(go())


def test_an_entry_of_a_processed_record_with_no_status_parks_it_in_the_outbox(shards):
    """ADR 021k: with the index, the finishing write leaves Processed out of
    the outbox and its entry marks the status maybe unsent (the activity
    died before sending, or before its discard): the Supervisor meeting the
    due entry parks the status there for the Starter, then removes the entry.
    A record finished by another attempt, or already holding an entry, is
    left as it is."""

    async def go():
        index_c, index, store, _ = await _claimed_with_index(shards)
        source = IndexSource(index, store)
        await store.update("A", lambda r: sm.mark_processed(r, "A:1", T0, outbox=False), "A:1")
        await source.page(T0 + timedelta(seconds=30), 10, None)
        assert index_c.docs == {}
        record, _ = await store.read("A")
        assert record.PendingStatus is not None
        assert record.PendingStatus.MessageId == "A/status/Processed"
        assert record.PendingStatus.At == T0
        # An entry left again: the status already waits in the outbox.
        await index.add("A", T0 + timedelta(seconds=20), 1)
        await source.page(T0 + timedelta(seconds=30), 10, None)
        assert index_c.docs == {}
        assert (await store.read("A"))[0].PendingStatus == record.PendingStatus

        # An older attempt's entry: attempt 2 finished the record, not attempt 1.
        def by_attempt_2(r):
            last = r.History[-1].model_copy(update={"By": "A:2"})
            history = [*r.History[:-1], last]
            return r.model_copy(update={"PendingStatus": None, "Attempt": 2, "History": history})

        await store.update("A", by_attempt_2, ANY_OWNER)
        await index.add("A", T0 + timedelta(seconds=20), 1)
        await source.page(T0 + timedelta(seconds=30), 10, None)
        assert index_c.docs == {}
        assert (await store.read("A"))[0].PendingStatus is None

    asyncio.new_event_loop().run_until_complete(go())


def test_an_unsent_processed_read_from_a_lagging_version_keeps_its_entry(shards):
    """The Supervisor parks on the version it read: a read that lags the
    activity's own park (a newer version) fails the replace, and the entry
    stays for a later run, which finds the status parked and removes it."""

    async def go():
        index_c, index, store, lagging = await _claimed_with_index(shards)
        await store.update("A", lambda r: sm.mark_processed(r, "A:1", T0, outbox=False), "A:1")
        lagging.old = await store.read("A")
        await store.update("A", lambda r: sm.park_processed(r, "A:1"), None)
        source = IndexSource(index, lagging)
        await source.page(T0 + timedelta(seconds=30), 10, None)
        assert len(index_c.docs) == 1
        lagging.old = None
        await source.page(T0 + timedelta(seconds=30), 10, None)
        assert index_c.docs == {}

    asyncio.new_event_loop().run_until_complete(go())


def test_a_skipped_candidate_read_from_a_lagging_version_keeps_its_entry(shards):
    """Seed 200 --orders 3: the source's read showed the claim's deadline (due),
    the Supervisor's guarded update then read the live attempt's later step
    deadline and skipped it; the entry was removed all the same, and the attempt
    was never recovered."""
    from reporting import Alerts, StatusReporter
    from supervisor.supervisor import Supervisor
    from tests.fakes import RecordingPublisher
    from tests.unit.supervisor.test_supervisor import MemoryCheckpoints

    async def go():
        index_c, index, store, lagging = await _claimed_with_index(shards)
        lagging.old = await store.read("A")  # the claim's version: CompleteBy T0 + 30 s
        step_deadline = T0 + timedelta(seconds=50)
        await store.update("A", lambda r: r.model_copy(update={"CompleteBy": step_deadline}), "A:1")
        now = T0 + timedelta(seconds=40)
        bus = RecordingPublisher()
        sup = Supervisor(
            store,
            IndexSource(index, lagging),
            MemoryCheckpoints(),
            StatusReporter(bus),
            Alerts(bus),
            POLICY,
            10,
            slack=timedelta(seconds=5),
            clock=ReadClock(lambda: now),
        )
        report = await sup.run()
        assert (report.examined, report.skipped) == (1, 1)
        assert [d["OrderID"] for d in index_c.docs.values()] == ["A"]  # looked at again later
        lagging.old = None
        now = step_deadline + timedelta(seconds=10)
        report = await sup.run()
        assert report.recovered == 1
        assert (await store.read("A"))[0].ProcessState is ProcessState.PENDING

    asyncio.new_event_loop().run_until_complete(go())


def test_an_entry_moved_behind_the_cursor_in_its_bucket_is_still_reached(shards):
    """Simulation seed 65 --orders 3 --version 1.1: an entry moved to its
    attempt's later deadline landed in the cursor's bucket but sorted before
    the cursor's id (ids sort by order id); the cursor then left the bucket and
    the attempt was never recovered."""

    async def go():
        store, index = _sim_store_and_index(shards)
        for oid in ("A", "B", "C"):
            await store.create_if_absent(sm.new_record(_order(oid), T0, [], key=oid))
            await index.add(oid, T0 + timedelta(seconds=20), 1)
            await claim(store, oid, T0, POLICY)
        # A's attempt lives on to a later deadline in the same minute; B and C ended.
        await store.update(
            "A", lambda r: r.model_copy(update={"CompleteBy": T0 + timedelta(seconds=50)}), "A:1"
        )
        for oid in ("B", "C"):
            await store.update(
                oid, lambda r, oid=oid: sm.mark_processed(r, f"{oid}:1", T0), f"{oid}:1"
            )
        source = IndexSource(index, store)
        _, cursor, _ = await source.page(T0 + timedelta(seconds=30), 2, None)  # moves A, removes B
        found = []
        for _ in range(3):  # the next minute: A's new deadline has passed
            candidates, cursor, _ = await source.page(T0 + timedelta(seconds=70), 2, cursor)
            found += [c.record.id for c in candidates]
        assert found == ["A"]

    asyncio.new_event_loop().run_until_complete(go())


def test_a_skipped_candidate_never_moves_the_cursor_past_an_entry_not_yet_due(shards):
    """Simulation seed 4455 --orders 3 (two Supervisors sharing a checkpoint):
    in one bucket A's entry (first by id) was not yet due, B's was. One
    Supervisor recovered B while the other held the same page; that one found
    B stale and rewound to B's position, just after A, and saved last. The
    next runs read the bucket after A and moved on: A stayed Processing."""
    from reporting import Alerts, StatusReporter
    from supervisor.supervisor import Supervisor
    from tests.fakes import RecordingPublisher
    from tests.unit.supervisor.test_supervisor import MemoryCheckpoints

    class ThenRun:
        def __init__(self, inner, other) -> None:
            self.inner, self.other = inner, other

        async def page(self, upper, max_items, cursor):
            result = await self.inner.page(upper, max_items, cursor)
            await self.other.run()  # the other Supervisor's whole run, meanwhile
            return result

    async def go():
        store, index = _sim_store_and_index(shards)
        for oid, second in (("A", 55), ("B", 20)):
            await store.create_if_absent(sm.new_record(_order(oid), T0, [], key=oid))
            claimed_at = T0 + timedelta(seconds=second) - POLICY.claim_timeout
            await index.add(oid, claimed_at + POLICY.claim_timeout, 1)
            await claim(store, oid, claimed_at, POLICY)
        now = T0 + timedelta(seconds=40)  # upper T0 + 35 s: B due, A not
        checkpoints = MemoryCheckpoints()
        bus = RecordingPublisher()

        def supervisor(source):
            return Supervisor(
                store,
                source,
                checkpoints,
                StatusReporter(bus),
                Alerts(bus),
                POLICY,
                3,
                slack=timedelta(seconds=5),
                clock=ReadClock(lambda: now),
            )

        first = supervisor(IndexSource(index, store))
        second = supervisor(ThenRun(IndexSource(index, store), first))
        report = await second.run()
        assert (report.examined, report.skipped) == (1, 1)
        assert (await store.read("B"))[0].ProcessState is ProcessState.PENDING
        for _ in range(3):
            now += timedelta(minutes=1)
            await first.run()
        assert (await store.read("A"))[0].ProcessState is ProcessState.PENDING

    asyncio.new_event_loop().run_until_complete(go())


def test_a_full_page_in_a_bucket_that_may_still_fill_keeps_the_cursor_at_its_start(shards):
    """A page that ends inside the bucket of its upper bound must not leave the
    cursor at its last id: a claim indexes its deadline ahead of now, into that
    same bucket, under an id that may sort before the cursor's (ids sort by
    order id). Had the cursor stayed at C, the runs after the minute rolled
    over would never read A."""

    async def go():
        store, index = _sim_store_and_index(shards)

        async def claimed(oid: str, at: datetime) -> None:
            await store.create_if_absent(sm.new_record(_order(oid), at, [], key=oid))
            await index.add(oid, at + POLICY.claim_timeout, 1)
            await claim(store, oid, at, POLICY)

        for oid in ("B", "C"):
            await claimed(oid, T0 - timedelta(seconds=20))  # due at T0 + 10 s
        source = IndexSource(index, store)
        candidates, cursor, _ = await source.page(T0 + timedelta(seconds=40), 2, None)
        assert [c.record.id for c in candidates] == ["B", "C"]
        await claimed("A", T0 + timedelta(seconds=25))  # due at T0 + 55 s, same bucket
        found: list[str] = []
        for _ in range(2):
            candidates, cursor, _ = await source.page(T0 + timedelta(seconds=70), 2, cursor)
            found += [c.record.id for c in candidates]
        assert "A" in found

    asyncio.new_event_loop().run_until_complete(go())
