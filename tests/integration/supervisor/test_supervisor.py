"""The Supervisor against the real Cosmos server, with both sources (the state
container's query and the recovery index): every branch, two supervisors at
once, a supervisor that dies mid-page, clock skew, and bounded reads."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest

from adapters.checkpoints import CosmosCheckpointStore
from adapters.ports import UNREADABLE_RETRY, IndexEntry, bucket_of
from adapters.recovery_index import CosmosRecoveryIndex, ensure_index_container, entry_id
from domain import state_machine as sm
from domain.models import ProcessState
from reporting import Alerts, StatusReporter
from supervisor.sources import IndexSource, QuerySource
from supervisor.supervisor import Supervisor
from tests.builders import ReadClock, claim, start_step
from tests.fakes import RecordingPublisher
from tests.integration.adapters.builders import NOW, POLICY, make_record

pytestmark = pytest.mark.timeout(120)

LATER = NOW + timedelta(minutes=10)


class Crash(Exception):
    pass


@pytest.fixture(params=["query", "index"])
async def rig(
    request, state_store, state_container, cosmos_client, cosmos_database, request_charges
):
    index = None
    if request.param == "index":
        container = await ensure_index_container(cosmos_client, cosmos_database, "recoveryIndex")
        index = CosmosRecoveryIndex(container, request_charges)
    return Rig(request.param, state_store, state_container, index, request_charges)


class Rig:
    def __init__(self, scan, store, state_container, index, charges):
        self.scan, self.store, self.index = scan, store, index
        self.state_container, self.charges = state_container, charges
        self.bus = RecordingPublisher()
        self.now = LATER

    def supervisor(
        self, page_size=10, slack=timedelta(seconds=5), clock=None, name="supervisor", store=None
    ):
        store = store or self.store
        source = IndexSource(self.index, store) if self.scan == "index" else QuerySource(store)
        return Supervisor(
            store,
            source,
            CosmosCheckpointStore(self.state_container, self.charges, name),
            StatusReporter(self.bus),
            Alerts(self.bus),
            POLICY,
            page_size,
            slack=slack,
            clock=clock or ReadClock(lambda: self.now),
        )

    async def add_claimed(self, order_id: str, claimed_at=NOW):
        """A record claimed at `claimed_at` (deadline one claim timeout later),
        indexed as the Starter would."""
        record = make_record(order_id, claimed_at)
        await self.store.create_if_absent(record)
        if self.index is not None:
            await self.index.add(order_id, claimed_at + POLICY.claim_timeout, record.Attempt + 1)
        claimed = await claim(self.store, order_id, claimed_at, POLICY)
        assert claimed is not None
        return claimed

    async def state(self, order_id):
        return (await self.store.read(order_id))[0]


async def test_expired_attempt_returns_to_pending(rig):
    await rig.add_claimed("A")
    report = await rig.supervisor().run()
    assert (report.examined, report.recovered) == (1, 1)
    record = await rig.state("A")
    assert record.ProcessState is ProcessState.PENDING
    assert record.FailureCount == 1
    assert record.LockedBy is None


async def test_attempt_that_met_its_deadline_is_left_alone(rig):
    claimed = await rig.add_claimed("A")
    await rig.store.update(
        "A",
        lambda r: r.model_copy(
            update={"ProcessState": ProcessState.PROCESSED, "LockedBy": None, "CompleteBy": None}
        ),
        claimed.LockedBy,
    )
    report = await rig.supervisor().run()
    assert report.recovered == 0
    assert (await rig.state("A")).ProcessState is ProcessState.PROCESSED


async def test_budget_then_long_retry_then_error_with_alert(rig):
    await rig.add_claimed("A")
    seen = []
    t = NOW
    for _ in range(6):
        record = await rig.state("A")
        if record.ProcessState is ProcessState.ERROR:
            break
        if record.ProcessState is ProcessState.PENDING:
            t = max(t, record.NotBefore or t) + timedelta(seconds=1)
            if rig.index is not None:
                await rig.index.add("A", t + POLICY.claim_timeout, record.Attempt + 1)
            assert await claim(rig.store, "A", t, POLICY) is not None
        t += timedelta(minutes=5)
        rig.now = t
        report = await rig.supervisor().run()
        seen.append((report.recovered, report.long_retry, report.failed))
    assert seen == [(1, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]
    record = await rig.state("A")
    assert record.FailureCount == POLICY.max_failures  # invariant 5
    kinds = [json.loads(body)["Kind"] for body in rig.bus.to("alerts")]
    assert kinds == ["OrderError"]


async def test_two_supervisors_never_recover_one_expiry_twice(rig):
    for i in range(30):
        await rig.add_claimed(f"O{i:02d}")
    first, second = rig.supervisor(page_size=50, name="s1"), rig.supervisor(page_size=50, name="s2")
    reports = await asyncio.gather(first.run(), second.run())
    assert sum(r.recovered for r in reports) == 30
    records = [await rig.state(f"O{i:02d}") for i in range(30)]
    assert {r.FailureCount for r in records} == {1}
    assert {r.ProcessState for r in records} == {ProcessState.PENDING}


async def test_supervisor_killed_mid_page_resumes_without_skipping_or_double_counting(rig):
    for i in range(12):
        await rig.add_claimed(f"K{i:02d}", NOW + timedelta(seconds=i))
    real_update = rig.store.update
    calls = 0

    async def dying_update(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise Crash("killed mid-page")
        return await real_update(*args, **kwargs)

    rig.store.update = dying_update
    with pytest.raises(Crash):
        await rig.supervisor(page_size=5).run()
    rig.store.update = real_update
    for _ in range(6):
        report = await rig.supervisor(page_size=5).run()
        if report.read == 0:
            break
    records = [await rig.state(f"K{i:02d}") for i in range(12)]
    assert [r.ProcessState for r in records] == [ProcessState.PENDING] * 12
    assert [r.FailureCount for r in records] == [1] * 12


async def test_clock_running_ahead_within_slack_does_not_steal_a_live_attempt(rig):
    claimed = await rig.add_claimed("A", NOW)
    # The supervisor's clock is 20 s ahead of the attempt's deadline; slack is 30 s.
    rig.now = claimed.CompleteBy + timedelta(seconds=20)
    report = await rig.supervisor(slack=timedelta(seconds=30)).run()
    assert report.recovered == 0
    assert (await rig.state("A")).ProcessState is ProcessState.PROCESSING
    rig.now = claimed.CompleteBy + timedelta(seconds=31)
    assert (await rig.supervisor(slack=timedelta(seconds=30)).run()).recovered == 1


async def test_reads_per_run_are_bounded_by_the_page_size(rig):
    for i in range(25):
        await rig.add_claimed(f"P{i:02d}", NOW + timedelta(seconds=i))
    reads = []
    for _ in range(8):
        report = await rig.supervisor(page_size=7).run()
        reads.append(report.read)
        if report.read == 0:
            break
    assert max(reads) <= 7
    assert sum(r.FailureCount for r in [await rig.state(f"P{i:02d}") for i in range(25)]) == 25


@pytest.mark.parametrize("rig", ["index"], indirect=True)
async def test_index_entries_for_met_or_replaced_deadlines_are_discarded(rig):
    claimed = await rig.add_claimed("A")
    # the attempt moves on to a step with a later deadline: a second entry, the first now stale
    step_deadline = NOW + timedelta(minutes=30)
    await rig.index.add("A", step_deadline, claimed.Attempt)
    await rig.store.update(
        "A",
        lambda r: start_step(r, "reserve-inventory", NOW, step_deadline),
        claimed.LockedBy,
    )
    report = await rig.supervisor().run()  # now = NOW + 10 min: only the claim's entry is due
    assert report.recovered == 0
    assert report.read == 1
    assert (await rig.state("A")).ProcessState is ProcessState.PROCESSING
    rig.now = step_deadline + timedelta(minutes=1)
    assert (await rig.supervisor().run()).recovered == 1


@pytest.mark.parametrize("rig", ["index"], indirect=True)
async def test_index_cursor_never_passes_an_entry_not_yet_due(rig):
    """Issue 11 defect 1: a full page ends inside the current minute's bucket
    with an entry not yet due; after the minute rolls over that entry must
    still be recovered."""
    from datetime import datetime

    from adapters.ports import bucket_of

    minute = datetime.fromisoformat(bucket_of(NOW + timedelta(minutes=2))).replace(
        tzinfo=NOW.tzinfo
    )
    # ids sort A < B < C; deadlines: A late in the minute, B and C early.
    for order_id, second in (("A", 50), ("B", 10), ("C", 15)):
        await rig.add_claimed(order_id, minute + timedelta(seconds=second) - POLICY.claim_timeout)
    rig.now = minute + timedelta(seconds=35)  # upper = minute + 30 s: B, C due; A not
    await rig.supervisor(page_size=2).run()
    for _ in range(4):
        rig.now += timedelta(minutes=1)
        await rig.supervisor(page_size=2).run()
    assert [(await rig.state(o)).ProcessState for o in "ABC"] == [ProcessState.PENDING] * 3


async def test_records_whose_deadline_passed_long_ago_are_recovered(rig):
    """Issue 11 defect 9: an outage longer than seven days loses nothing."""
    await rig.add_claimed("A")
    rig.now = NOW + timedelta(days=9)
    assert (await rig.supervisor().run()).recovered == 1
    assert (await rig.state("A")).ProcessState is ProcessState.PENDING


@pytest.mark.parametrize("rig", ["index"], indirect=True)
async def test_one_index_entry_per_attempt_follows_a_live_attempt_to_its_deadline(rig):
    """Workflow 2.0 indexes an attempt once, at its claim: a later step
    deadline gets no entry of its own. The Supervisor moves the entry of a
    live attempt to the record's deadline, and recovers it when that passes."""
    claimed = await rig.add_claimed("A")
    step_deadline = NOW + timedelta(minutes=30)
    await rig.store.update(
        "A",
        lambda r: start_step(r, "reserve-inventory", NOW, step_deadline),
        claimed.LockedBy,
    )
    report = (
        await rig.supervisor().run()
    )  # now = NOW + 10 min: the claim's entry is due, the attempt is not
    assert report.recovered == 0
    assert (await rig.state("A")).ProcessState is ProcessState.PROCESSING
    rig.now = NOW + timedelta(minutes=20)
    assert (await rig.supervisor().run()).recovered == 0
    rig.now = step_deadline + timedelta(minutes=1)
    assert (await rig.supervisor().run()).recovered == 1
    assert (await rig.state("A")).ProcessState is ProcessState.PENDING


@pytest.mark.parametrize("rig", ["index"], indirect=True)
async def test_an_attempt_that_retired_its_entry_costs_the_supervisor_nothing(rig):
    """A 2.0 attempt that ends removes its own entry (discard, sent with the
    process's next batch): no read later."""
    claimed = await rig.add_claimed("A")
    await rig.index.discard("A", NOW + POLICY.claim_timeout)
    await rig.index.flush()
    t = NOW
    await rig.store.update(
        "A", lambda r: sm.mark_failed(r, claimed.LockedBy, None, "x", t), claimed.LockedBy
    )
    report = await rig.supervisor().run()
    assert report.read == 0
    assert report.recovered == 0


class _ThenRun:
    """A source that lets another Supervisor run a whole run between this
    one's page read and its recoveries (two Supervisors at once)."""

    def __init__(self, inner, other: Supervisor) -> None:
        self._inner, self._other = inner, other

    async def page(self, upper, max_items, cursor):
        result = await self._inner.page(upper, max_items, cursor)
        await self._other.run()
        return result


@pytest.mark.parametrize("rig", ["index"], indirect=True)
async def test_a_skipped_candidate_never_moves_the_cursor_past_an_entry_not_yet_due(rig):
    """Simulation seed 4455 --orders 3: in one bucket, A's entry (first by id)
    was not yet due and B's was. Two Supervisors sharing the checkpoint read
    both; one recovered B, the other found B stale and rewound its cursor to
    B's position, which is just after A. It saved last: the next runs read the
    bucket after A, moved on to the next minute, and A's attempt stayed
    Processing for good."""
    from datetime import datetime

    from adapters.ports import bucket_of

    minute = datetime.fromisoformat(bucket_of(NOW + timedelta(minutes=2))).replace(
        tzinfo=NOW.tzinfo
    )
    for order_id, second in (("A", 55), ("B", 20)):
        await rig.add_claimed(order_id, minute + timedelta(seconds=second) - POLICY.claim_timeout)
    rig.now = minute + timedelta(seconds=40)  # upper = minute + 35 s: B due, A not
    first = rig.supervisor(page_size=3)
    second = rig.supervisor(page_size=3)
    second._source = _ThenRun(second._source, first)
    report = await second.run()  # first recovers B while second holds its page
    assert (report.examined, report.skipped) == (1, 1)
    assert (await rig.state("B")).ProcessState is ProcessState.PENDING
    for _ in range(3):
        rig.now += timedelta(minutes=1)
        await rig.supervisor(page_size=3).run()
    assert (await rig.state("A")).ProcessState is ProcessState.PENDING


async def test_documents_this_version_cannot_read_are_alerted_and_stop_no_run(rig):
    """Issue 21 item 4: one unreadable record (or index entry) used to make
    every index-mode run fail; now each run goes on, recovers the others, and
    names the bad documents in one UnreadableRecord alert each, not one per run."""
    from adapters.ports import bucket_of
    from adapters.recovery_index import entry_id

    expired = NOW + POLICY.claim_timeout
    await rig.state_container.create_item(
        {
            "id": "BAD-1",
            "ProcessState": "Processing",
            "LockedBy": "BAD-1:1",
            "CompleteBy": "2026-01-01T12:01:00.000000Z",
            "Attempt": 1,
            "FailureCount": "many",
        }
    )
    if rig.index is not None:
        await rig.index.add("BAD-1", expired, 1)
        await rig.index._container.create_item(
            {"id": "junk", "bucket": bucket_of(expired), "OrderID": 7, "CompleteBy": "soon"}
        )
    await rig.add_claimed("A")
    newer = await rig.add_claimed("B")
    # A newer version's field on a live record does not make it unreadable.
    doc = await rig.state_container.read_item("B", partition_key="B")
    await rig.state_container.replace_item("B", {**doc, "NewerVersionField": 1})
    first = await rig.supervisor().run()
    assert first.recovered == 2
    assert (await rig.state("A")).ProcessState is ProcessState.PENDING
    b = await rig.state_container.read_item("B", partition_key="B")
    assert b["NewerVersionField"] == 1
    assert b["FailureCount"] == newer.FailureCount + 1
    rig.now += timedelta(minutes=30)  # past the moved entry's retry
    await rig.supervisor().run()
    alerts = [json.loads(body) for queue, body, _, _ in rig.bus.sent if queue == "alerts"]
    named = [a["Reason"] for a in alerts if a["Kind"] == "UnreadableRecord"]
    assert any("BAD-1" in reason for reason in named)
    if rig.index is not None:
        assert any("junk" in reason for reason in named)
        ids = [d["id"] async for d in rig.index._container.query_items("SELECT c.id FROM c")]
        assert entry_id("BAD-1", expired) not in ids  # moved ahead, to be read again
        assert any(i.startswith("BAD-1|") for i in ids)
    assert len(named) == len(set(named))  # the second run's repeats were dropped


async def _ahead_of_the_scan(rig, kind: str) -> None:
    """Leave the index holding only a document far ahead of now, the way a
    first scan (no checkpoint yet: a first deployment, a lost checkpoint, a
    Supervisor that died before its first save) finds it."""
    if kind == "set aside":
        # An unreadable record's entry and a document that is not an entry,
        # both due: a run sets them aside UNREADABLE_RETRY (10 min) ahead.
        await rig.state_container.create_item(
            {"id": "BAD-1", "ProcessState": "Processing", "Attempt": 1, "FailureCount": "many"}
        )
        await rig.index.add("BAD-1", NOW + POLICY.claim_timeout, 1)
        await rig.index._container.create_item(
            {"id": "junk", "bucket": bucket_of(NOW), "OrderID": 7, "CompleteBy": "soon"}
        )
        await rig.supervisor(name="earlier").run()
        buckets = [d["bucket"] async for d in rig.index._container.query_items("SELECT * FROM c")]
        assert min(buckets) >= bucket_of(rig.now + timedelta(minutes=9))
    else:
        # A live attempt in a long step: its entry moved to the step's deadline.
        claimed = await rig.add_claimed("LONG", rig.now)
        step_deadline = rig.now + timedelta(minutes=30)
        await rig.index.add("LONG", step_deadline, claimed.Attempt)
        await rig.index.remove_many(
            [
                IndexEntry(
                    entry_id("LONG", rig.now + POLICY.claim_timeout),
                    bucket_of(rig.now + POLICY.claim_timeout),
                    "LONG",
                    rig.now + POLICY.claim_timeout,
                    claimed.Attempt,
                )
            ]
        )
        await rig.store.update(
            "LONG",
            lambda r: start_step(r, "reserve-inventory", rig.now, step_deadline),
            claimed.LockedBy,
        )


@pytest.mark.parametrize("rig", ["index"], indirect=True)
@pytest.mark.parametrize("kind", ["set aside", "long step"])
async def test_a_first_scan_never_starts_past_the_attempts_claimed_after_it(rig, kind):
    """Simulation seeds 100545 and 200182 (issue 21, foreign documents): a
    first scan started at the earliest bucket holding a document. When the
    only documents lie ahead (set aside for UNREADABLE_RETRY, or a long step's
    deadline), its cursor started there, past every entry added after it
    (a claim indexes its deadline a claim timeout ahead), and a cursor never
    goes back: an attempt claimed then expired and stayed Processing."""
    await _ahead_of_the_scan(rig, kind)
    fresh = rig.supervisor(name="fresh")
    assert (await fresh.run()).recovered == 0
    await rig.add_claimed("A", rig.now)
    rig.now += POLICY.claim_timeout + timedelta(seconds=10)
    report = await fresh.run()
    assert report.recovered == 1
    assert (await rig.state("A")).ProcessState is ProcessState.PENDING
    if kind == "long step":
        assert (await rig.state("LONG")).ProcessState is ProcessState.PROCESSING


@pytest.mark.parametrize("rig", ["index"], indirect=True)
async def test_a_checkpoint_saved_past_its_own_run_scans_again_from_the_start(rig):
    """A checkpoint the cursor rules never save (further ahead than clock
    skew, as the first scan above saved before its fix) has passed entries
    that are due: the run scans again from the earliest bucket."""
    await rig.add_claimed("A", NOW)
    ahead = bucket_of(rig.now + UNREADABLE_RETRY)
    await CosmosCheckpointStore(rig.state_container, rig.charges, "supervisor").save(
        json.dumps([ahead, ""])
    )
    assert (await rig.supervisor().run()).recovered == 1
    assert (await rig.state("A")).ProcessState is ProcessState.PENDING


class _UpsertRefusedOnce:
    """The real index container, with its next upsert refused as the account
    refuses it under an outage (503): the one call the test makes fail."""

    def __init__(self, container):
        self._container = container
        self.refused = 0

    def __getattr__(self, name):
        return getattr(self._container, name)

    async def upsert_item(self, *args, **kwargs):
        if not self.refused:
            from azure.cosmos.exceptions import CosmosHttpResponseError

            self.refused += 1
            raise CosmosHttpResponseError(status_code=503, message="Service Unavailable")
        return await self._container.upsert_item(*args, **kwargs)


@pytest.mark.parametrize("rig", ["index"], indirect=True)
async def test_a_document_that_could_not_be_set_aside_is_read_again_and_alerted_at_once(rig):
    """Simulation seed 100172: the index Supervisor met a document that is
    not an entry, its copy ahead could not be written (503, swallowed), and
    the run saved its checkpoint past it: no run ever read it again, and the
    run's failure before its end lost the alert too. Now the refused copy
    fails the page (TransientError, no checkpoint past the document), the
    failing run alerts what it could not read on the way out, and the next
    run sets the document aside."""
    from domain.errors import TransientError

    expired = NOW + POLICY.claim_timeout
    refusing = _UpsertRefusedOnce(rig.index._container)
    rig.index._container = refusing
    await refusing.create_item(
        {"id": "junk", "bucket": bucket_of(expired), "OrderID": 7, "CompleteBy": "soon"}
    )
    with pytest.raises(TransientError):
        await rig.supervisor().run()
    assert refusing.refused == 1
    alerts = [json.loads(body) for queue, body, _, _ in rig.bus.sent if queue == "alerts"]
    assert [a["Kind"] for a in alerts] == ["UnreadableRecord"]
    assert "junk" in alerts[0]["Reason"]
    await rig.supervisor().run()
    buckets = {d["id"]: d["bucket"] async for d in refusing.query_items("SELECT * FROM c")}
    assert buckets["junk"] >= bucket_of(rig.now + timedelta(minutes=9))  # read again, moved
