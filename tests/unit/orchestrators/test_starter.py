"""The Starter with fakes: the metric line on every run, one failing start
does not end the run, outbox delivery."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
from dataclasses import replace
from datetime import datetime, timedelta

from adapters.ports import ANY_OWNER
from domain import state_machine as sm
from domain.admission import Admission
from domain.errors import TransientError
from domain.ids import order_key
from domain.models import CompensationEntry, OrderSubmitted, ProcessState
from orchestrators.starter import Starter
from tests.builders import ReadClock, claim, order_payload
from tests.unit.orchestrators.driver import POLICY, SETTINGS, STEPS, StartingClient, World


class Client:
    def __init__(self, fail_for=()):
        self.started, self.fail_for = [], set(fail_for)
        self.died: set[str] = set()  # started instances that failed

    async def start_new(self, name, instance_id, data):
        if instance_id in self.fail_for:
            raise ConnectionError("host unavailable")
        self.started.append(instance_id)

    async def get_status(self, instance_id):
        if instance_id not in self.started:
            return None
        runtime = "Failed" if instance_id in self.died else "Running"
        return type("Status", (), {"runtime_status": type("R", (), {"name": runtime})()})()


async def _pending(world, order_id):
    order = OrderSubmitted.model_validate(order_payload(OrderID=order_id))
    await world.store.create_if_absent(sm.new_record(order, world.now, STEPS))


async def _failed(world, order_id):
    """A claimed order failed by its attempt: Error, its Failed status in the outbox."""
    await _pending(world, order_id)
    key = order_key("webshop", order_id)
    claimed = await claim(world.store, key, world.now, POLICY)
    t = world.now
    await world.store.update(
        key, lambda r: sm.mark_failed(r, claimed.LockedBy, None, "declined", t), claimed.LockedBy
    )


def _refuse(world, queue: str, error: str = "MessagingEntityDisabled"):
    """Make `queue` refuse every send while the returned switch's "on" is
    true; the list the times of the sends it refused."""
    real_send = world.bus.send
    refusing = {"on": True}
    refused: list[datetime] = []

    async def send(q, body, message_id, props=None):
        if q == queue and refusing["on"]:
            refused.append(world.now)
            raise TransientError(f"{q}: {error}")
        await real_send(q, body, message_id, props)

    world.bus.send = send
    return refusing, refused


async def _errored_with_request(world, order_id):
    await _pending(world, order_id)
    order_id = order_key("webshop", order_id)
    claimed = await claim(world.store, order_id, world.now, POLICY)
    t = world.now
    await world.store.update(
        order_id, lambda r: sm.mark_failed(r, claimed.LockedBy, None, "x", t), claimed.LockedBy
    )
    await world.store.update(
        order_id,
        lambda r: sm.mark_status_sent(sm.request_compensation(r, t), r.PendingStatus.MessageId, t),
        ANY_OWNER,
    )


async def test_at_the_cap_the_metric_line_is_still_emitted(caplog):
    """Issue 17 item 5: the run at saturation logs its `starter: pending=` line."""
    world = World()
    await _pending(world, "A1")
    starter = Starter(
        replace(SETTINGS, max_processing=0), world.store, clock=ReadClock(lambda: world.now)
    )
    with caplog.at_level(logging.INFO, logger="orchestrators.starter"):
        report = await starter.run(Client())
    assert report.claimed == 0
    assert any(r.getMessage().startswith("starter: pending=1 processing=0") for r in caplog.records)


async def test_one_failing_compensation_start_does_not_abort_the_run():
    """Defect 10: the other requests and the Pending claims still happen."""
    world = World()
    await _errored_with_request(world, "A1")
    await _errored_with_request(world, "B1")
    await _pending(world, "C1")
    client = Client(fail_for={"webshop:A1:2"})
    starter = Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now))
    report = await starter.run(client)
    # A1's compensation never started: the same run tries to start it again,
    # under the same attempt (nothing ran under it, so no restart is spent).
    assert report.start_failures == 2
    assert sorted(client.started) == ["webshop:B1:2", "webshop:C1:1"]
    assert report.claimed == 1
    client.fail_for.clear()
    report = await starter.run(client)
    assert (report.compensations_started, report.compensation_restarts) == (1, 0)
    assert "webshop:A1:2" in client.started
    assert (await world.record("A1")).CompensationRestarts == 0


async def test_a_failing_start_after_a_claim_leaves_the_record_for_the_supervisor():
    world = World()
    await _pending(world, "A1")
    await _pending(world, "B1")
    client = Client(fail_for={"webshop:A1:1"})
    report = await Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now)).run(client)
    assert (report.claimed, report.start_failures, client.started) == (2, 1, ["webshop:B1:1"])
    record = await world.record("A1")
    assert record.ProcessState is ProcessState.PROCESSING
    assert record.CompleteBy is not None


async def test_outbox_entries_wait_their_grace_then_are_sent_once_with_their_id():
    world = World()
    await _failed(world, "A1")
    message_id = (await world.record()).PendingStatus.MessageId
    starter = Starter(
        SETTINGS, world.store, clock=ReadClock(lambda: world.now), publisher=world.bus
    )
    assert (
        await starter.run(Client())
    ).statuses_delivered == 0  # inside the grace: the writer sends it
    world.now += timedelta(minutes=1)
    assert (await starter.run(Client())).statuses_delivered == 1
    assert (await starter.run(Client())).statuses_delivered == 0
    assert [mid for _, mid in world.sent("replies-webshop")] == [message_id]


async def test_the_outbox_is_scanned_at_most_once_per_scan_interval():
    """Issue 12: not a query per tick; an entry waits at most grace + interval."""
    world = World()
    await _failed(world, "A1")
    starter = Starter(
        SETTINGS,
        world.store,
        clock=ReadClock(lambda: world.now),
        publisher=world.bus,
        status_grace=timedelta(seconds=30),
        status_scan_interval=timedelta(seconds=10),
    )
    assert (await starter.run(Client())).statuses_delivered == 0  # scanned: inside the grace
    world.now += timedelta(seconds=31)
    assert (await starter.run(Client())).statuses_delivered == 1  # scanned again: past the grace
    await _pending(world, "B1")
    claimed = await claim(world.store, "webshop:B1", world.now, POLICY)
    t = world.now - timedelta(minutes=5)  # already past its grace
    await world.store.update(
        "webshop:B1",
        lambda r: sm.mark_failed(r, claimed.LockedBy, None, "declined", t),
        claimed.LockedBy,
    )
    world.now += timedelta(seconds=5)
    assert (await starter.run(Client())).statuses_delivered == 0  # within the interval: no scan
    world.now += timedelta(seconds=5)
    assert (await starter.run(Client())).statuses_delivered == 1


async def test_the_timer_leaves_new_orders_to_a_working_fast_path_for_a_few_seconds():
    """Issue 12: the timer raced Submit's fast path for orders Submit was about
    to claim; each lost race cost a replace and an index entry."""
    from orchestrators.starter import FAST_PATH_WINDOW

    world = World()
    client = Client()
    starter = Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now))
    order = OrderSubmitted.model_validate(order_payload(OrderID="A1"))
    record, etag, _ = await world.store.create_if_absent(sm.new_record(order, world.now, STEPS))
    assert await starter.start_submitted(client, record, etag) == "webshop:A1:1"
    await _pending(world, "B1")  # its fast path did not run (or has not yet)
    report = await starter.run(client)
    assert (report.pending, report.claimed) == (1, 0)
    world.now += FAST_PATH_WINDOW + timedelta(seconds=1)
    report = await starter.run(client)
    assert report.claimed == 1
    assert client.started == ["webshop:A1:1", "webshop:B1:1"]


async def test_an_unchanged_backlog_gauge_is_not_rewritten_every_run():
    world = World()
    writes = []
    real = world.store.write_backlog_gauge

    async def counting(pending, at, processing=None):
        writes.append(pending)
        await real(pending, at, processing)

    world.store.write_backlog_gauge = counting
    starter = Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now))
    for _ in range(3):
        await starter.run(Client())
        world.now += timedelta(seconds=5)
    await _pending(world, "A1")
    world.now += timedelta(seconds=10)  # older than the fast-path window, if one were used
    await starter.run(Client())
    world.now += SETTINGS.backlog_gauge_max_age
    await starter.run(Client())
    assert writes == [0, 1, 0]  # the first run; then only when the figure changed


async def test_the_fast_path_claim_can_mark_received_sent_in_the_same_write():
    """Issue 12: Submit's ReceivedSent write and the claim were two replaces of
    the same record, one right after the other."""
    from tests.fakes import CountingStateStore

    world = World(store=CountingStateStore())
    client = Client()
    order = OrderSubmitted.model_validate(order_payload(OrderID="A1"))
    record, etag, _ = await world.store.create_if_absent(sm.new_record(order, world.now, STEPS))
    before = world.store.total
    starter = Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now))
    assert (
        await starter.start_submitted(client, record, etag, order, received_sent_at=world.now)
        == "webshop:A1:1"
    )
    assert world.store.total - before == 1
    stored = await world.record("A1")
    assert stored.ReceivedSent
    assert stored.ProcessState is ProcessState.PROCESSING
    # Lost (the etag moved on): nothing written, nothing marked; Submit marks it itself.
    order_b = OrderSubmitted.model_validate(order_payload(OrderID="B1"))
    record_b, etag_b, _ = await world.store.create_if_absent(
        sm.new_record(order_b, world.now, STEPS)
    )
    await world.store.replace(record_b.model_copy(update={"LastError": "x"}), etag_b)
    assert (
        await starter.start_submitted(client, record_b, etag_b, order_b, received_sent_at=world.now)
        is None
    )
    assert not (await world.record("B1")).ReceivedSent


async def test_a_failed_status_still_in_the_outbox_is_sent_before_its_compensation_starts():
    """Review defect 2: an operator asks to compensate an Error order whose
    Failed status was never delivered (every send failed). The client gets
    Failed, then the compensation's statuses: the claim no longer drops it."""
    world = World()
    await _pending(world, "A1")
    claimed = await claim(world.store, "webshop:A1", world.now, POLICY)
    t = world.now
    await world.store.update(
        "webshop:A1",
        lambda r: sm.request_compensation(
            sm.mark_failed(r, claimed.LockedBy, None, "declined", t), t
        ),
        claimed.LockedBy,
    )
    failed_id = (await world.record()).PendingStatus.MessageId
    world.now += timedelta(minutes=1)
    seen_at_start = []

    class Watching(Client):
        async def start_new(self, name, instance_id, data):
            # what the client had been told when the compensation began
            seen_at_start.extend(mid for _, mid in world.sent("replies-webshop"))
            await super().start_new(name, instance_id, data)

    client = Watching()
    report = await Starter(
        SETTINGS, world.store, clock=ReadClock(lambda: world.now), publisher=world.bus
    ).run(client)
    assert client.started == ["webshop:A1:2"]
    assert report.compensations == 1
    assert seen_at_start == [failed_id]
    assert [mid for _, mid in world.sent("replies-webshop")] == [failed_id]
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATING
    assert record.PendingStatus is None


class _Down:
    """A publisher whose every send fails (the reply and alert queues are down)."""

    async def send(self, queue, body, message_id, application_properties=None) -> None:
        raise ConnectionError("service bus unavailable")


async def test_a_failed_status_that_cannot_be_sent_does_not_hold_up_the_compensation():
    """The reply queue is down: the compensation starts anyway (undoing a
    charge must not wait on a status), carrying the entry for a later run."""
    world = World()
    await _pending(world, "A1")
    claimed = await claim(world.store, "webshop:A1", world.now, POLICY)
    t = world.now
    await world.store.update(
        "webshop:A1",
        lambda r: sm.request_compensation(
            sm.mark_failed(r, claimed.LockedBy, None, "declined", t), t
        ),
        claimed.LockedBy,
    )
    failed_id = (await world.record()).PendingStatus.MessageId
    world.now += timedelta(minutes=1)
    client = Client()
    await Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now), publisher=_Down()).run(
        client
    )
    assert client.started == ["webshop:A1:2"]
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATING
    assert record.PendingStatus is not None
    assert record.PendingStatus.MessageId == failed_id


class BlinkingClient(Client):
    """A Durable client whose status calls fail while `blink` is set, as the SDK's
    do on a 5xx or a dropped connection (a bare Exception); an unknown instance
    is a 404, which the SDK answers with a status whose runtime_status is None."""

    def __init__(self, fail_for=()):
        super().__init__(fail_for)
        self.blink = False

    async def get_status(self, instance_id):
        if self.blink:
            raise Exception("The operation failed with an unexpected status code 503")
        if instance_id not in self.started:
            return type("Status", (), {"runtime_status": None})()
        return await super().get_status(instance_id)


async def test_a_failed_status_call_does_not_restart_a_live_compensation():
    """Issue 21 item 2 (seeds 52, 55): not knowing an instance's status is not
    the instance being gone; three blips used to end a healthy compensation
    CompensationFailed."""
    world = World()
    await _errored_with_request(world, "A1")
    client = BlinkingClient()
    starter = Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now))
    await starter.run(client)
    assert client.started == ["webshop:A1:2"]
    client.blink = True
    for _ in range(5):
        report = await starter.run(client)
        assert report.status_unknown == 1
    record = await world.record("A1")
    assert (record.ProcessState, record.LockedBy, record.CompensationRestarts) == (
        ProcessState.COMPENSATING,
        "webshop:A1:2",
        0,
    )
    # A dead instance is still restarted once the status can be read.
    client.blink = False
    client.died.add("webshop:A1:2")
    report = await starter.run(client)
    assert report.compensation_restarts == 1
    assert (await world.record("A1")).LockedBy == "webshop:A1:3"


async def test_a_dead_compensation_behind_a_full_page_of_live_ones_is_restarted():
    """Issue 21 item 6: with a page or more of live compensations, each run
    used to read the same first page, and a dead one behind it waited forever."""
    world = World()
    batch = 4
    settings = replace(SETTINGS, starter_batch_size=batch)
    names = [f"A{i:02d}" for i in range(3 * batch)]
    for name in names:
        await _errored_with_request(world, name)
    client = Client()
    starter = Starter(settings, world.store, clock=ReadClock(lambda: world.now))
    while len(client.started) < len(names):  # the requests are claimed, a page a run
        await starter.run(client)
    dead = names[-1]  # sorts last: never on the first page
    client.died.add(f"webshop:{dead}:2")  # its instance died
    restarts = 0
    for _ in range(len(names) // batch + 1):  # a full cycle of pages reaches it
        restarts += (await starter.run(client)).compensation_restarts
    assert restarts == 1
    assert (await world.record(dead)).LockedBy == f"webshop:{dead}:3"


async def _run_with_answers_lost(world, starter, client) -> None:
    """One Starter run whose every state write is applied with its answer
    lost (a 408)."""
    real_update = world.store.update

    async def answer_lost(*args, **kw):
        await real_update(*args, **kw)
        raise TransientError("replace state: Cosmos DB answered 408")

    world.store.update = answer_lost
    try:
        with contextlib.suppress(TransientError):
            await starter.run(client)
    finally:
        world.store.update = real_update


async def _restart_answer_lost():
    """A1's compensation attempt :2 died, and the Starter's restart to :3 was
    written with its answer lost (a 408): nothing started :3."""
    world = World()
    await _errored_with_request(world, "A1")
    client = Client()
    starter = Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now))
    await starter.run(client)
    client.died.add("webshop:A1:2")
    await _run_with_answers_lost(world, starter, client)
    return world, client, starter


async def test_a_compensation_written_but_never_started_is_started_without_spending_a_restart():
    """Simulation seed 5000250 (50 orders): the Starter's restart writes were
    applied with their answers lost (a 408), so it never started the new
    attempt; each run then found no instance, counted another restart, and
    the third ended the order CompensationFailed with an undo never sent. An
    attempt whose instance does not exist never ran: it is started as it is."""
    world, client, starter = await _restart_answer_lost()
    record = await world.record("A1")
    assert (record.LockedBy, record.CompensationRestarts) == ("webshop:A1:3", 1)
    assert "webshop:A1:3" not in client.started
    for _ in range(3):
        report = await starter.run(client)
    assert client.started.count("webshop:A1:3") == 1
    record = await world.record("A1")
    assert (record.ProcessState, record.LockedBy, record.CompensationRestarts) == (
        ProcessState.COMPENSATING,
        "webshop:A1:3",
        1,
    )
    assert report.compensation_restarts == 0


async def test_others_bookkeeping_after_an_unstarted_restart_spends_no_restart():
    """Simulation seed 100502: a restart's write was applied with its answer
    lost, then Submit marked Received sent on the record (a redelivery of
    the order) before the Starter's next run. That write moved UpdatedAt past
    the restart, and the attempt that never ran was taken for one that had
    written and been purged: a restart was counted for it. Only what the
    attempt writes (an undo's outcome, a transition) says it ran."""
    world, client, starter = await _restart_answer_lost()
    world.now += timedelta(seconds=7)
    t = world.now
    await world.store.update(  # Submit, for a redelivered copy of the order
        "webshop:A1", lambda r: sm.mark_received_sent(r, t), ANY_OWNER
    )
    report = await starter.run(client)
    assert (report.compensation_restarts, report.compensations_started) == (0, 1)
    record = await world.record("A1")
    assert (record.LockedBy, record.CompensationRestarts) == ("webshop:A1:3", 1)
    assert client.started.count("webshop:A1:3") == 1


async def test_a_dead_attempts_entry_dated_by_a_clock_ahead_does_not_pass_for_the_restarts():
    """Simulation seed 3324363: attempt :2 wrote an undo's outcome dated by
    its host's clock, which ran ahead, and died; the Starter, on its own
    clock, restarted it as :3 with the answer lost, so :3 never started. The
    entry's At was later than the restart's, and the next run took it for :3's
    own write: a restart counted for an attempt that never ran. The restart is
    now dated after every entry it saw, and an entry after the transition
    before it, so the record's own order decides, not two hosts' clocks."""
    world = World()
    await _errored_with_request(world, "A1")
    client = Client()
    starter = Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now))
    await starter.run(client)  # claims the compensation: :2 starts
    ahead = world.now + timedelta(seconds=2)  # :2's host clock
    undone = CompensationEntry(Step="reserve-inventory", Outcome="Done", At=ahead)
    await world.store.update(
        "webshop:A1",
        lambda r: r.model_copy(update={"Compensation": [undone], "UpdatedAt": ahead}),
        ANY_OWNER,
    )
    client.died.add("webshop:A1:2")
    world.now += timedelta(seconds=1)  # the Starter's clock: behind :2's entry
    await _run_with_answers_lost(world, starter, client)
    record = await world.record("A1")
    assert (record.LockedBy, record.CompensationRestarts) == ("webshop:A1:3", 1)
    assert record.History[-1].At >= ahead
    report = await starter.run(client)
    assert (report.compensation_restarts, report.compensations_started) == (0, 1)
    assert client.started.count("webshop:A1:3") == 1
    record = await world.record("A1")
    assert (record.LockedBy, record.CompensationRestarts) == ("webshop:A1:3", 1)


async def test_an_entry_written_by_a_clock_behind_the_restart_is_dated_after_it():
    """The other side: the new attempt's host runs behind the Starter's, and
    its first undo outcome must still read as written after the restart."""
    world = World()
    await _errored_with_request(world, "A1")
    await Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now)).run(Client())
    await world.store.update(
        "webshop:A1",
        lambda r: r.model_copy(
            update={"Compensation": [CompensationEntry(Step="reserve-inventory")]}
        ),
        ANY_OWNER,
    )
    record = await world.record("A1")
    behind = record.History[-1].At - timedelta(seconds=2)
    written = sm.record_undo(record, record.LockedBy, "reserve-inventory", True, behind)
    assert written.Compensation[0].At > record.History[-1].At


async def test_a_compensation_purged_after_it_ran_is_restarted_under_a_new_attempt():
    """A missing instance that wrote the record ran: the task hub's retention
    policy purged it once it ended (production purges Completed histories at
    once). Started again under its own id, its undo requests would reuse ids
    the duplicate window still holds; it is restarted as a dead one is."""
    world = World()
    await _errored_with_request(world, "A1")
    client = Client()
    starter = Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now))
    await starter.run(client)
    later = world.now + timedelta(seconds=3)
    undone = CompensationEntry(Step="reserve-inventory", Outcome="Done", At=later)
    await world.store.update(  # the compensation writes an undo's outcome, then ends
        "webshop:A1",
        lambda r: r.model_copy(update={"Compensation": [undone], "UpdatedAt": later}),
        ANY_OWNER,
    )
    client.started.remove("webshop:A1:2")  # its history purged
    report = await starter.run(client)
    assert (report.compensation_restarts, report.compensations_started) == (1, 0)
    record = await world.record("A1")
    assert (record.LockedBy, record.CompensationRestarts) == ("webshop:A1:3", 1)


async def test_a_resend_during_a_long_retry_adds_no_index_entry():
    """Issue 21 item 1: a client resends an order while its record waits for
    its long retry; Submit's fast path used to index an attempt it could not
    claim, and that entry (newer than its record) held the index Supervisor's
    cursor, and every later order's recovery, until the long retry's claim."""
    from tests.fakes import FakeIndex

    world = World()
    await _pending(world, "A1")
    await world.store.update(
        "webshop:A1",
        lambda r: r.model_copy(update={"NotBefore": world.now + timedelta(hours=1)}),
        ANY_OWNER,
    )
    record, etag = await world.store.read("webshop:A1")
    index = FakeIndex()
    starter = Starter(SETTINGS, world.store, index=index, clock=ReadClock(lambda: world.now))
    assert await starter.start_submitted(Client(), record, etag) is None
    assert index.entries == {}
    # Once claimable, the claim indexes its attempt first, as before.
    world.now += timedelta(hours=1)
    record, etag = await world.store.read("webshop:A1")
    assert await starter.start_submitted(Client(), record, etag) == "webshop:A1:1"
    assert list(index.entries.values()) == [1]


def _admitted(world, limit: int) -> None:
    """An admission document whose limit an earlier count set to `limit`."""
    earlier = world.now - timedelta(seconds=5)
    world.store.admission = (Admission(limit=limit, counted=0, counted_at=earlier), '"a"')


async def test_one_run_claims_batch_after_batch_within_the_room_left():
    # One batch per tick capped the claims at batch/interval whatever the backlog.
    world = World()
    for i in range(23):
        await _pending(world, f"B{i:02d}")
    client = Client()
    settings = replace(SETTINGS, starter_batch_size=5, starter_max_batches=10, max_processing=17)
    _admitted(world, 1000)  # the cap is the tighter bound
    starter = Starter(settings, world.store, clock=ReadClock(lambda: world.now))

    report = await starter.run(client)

    assert report.claimed == 17  # the room MAX_PROCESSING left, in four batches
    assert report.batches == 4
    assert len(client.started) == 17
    assert (await starter.run(client)).claimed == 0  # at the cap now


async def test_a_run_stops_claiming_at_its_batch_count_and_its_budget():
    world = World()
    for i in range(23):
        await _pending(world, f"C{i:02d}")
    settings = replace(SETTINGS, starter_batch_size=5, starter_max_batches=2)
    _admitted(world, 1000)
    assert (
        await Starter(settings, world.store, clock=ReadClock(lambda: world.now)).run(Client())
    ).claimed == 10

    reads = []

    def slow():  # the first batch takes 10 s of the clock
        reads.append(None)
        return world.now if len(reads) <= 1 else world.now + timedelta(seconds=10)

    settings = replace(settings, starter_max_batches=10, starter_run_budget=timedelta(seconds=4))
    report = await Starter(settings, world.store, clock=ReadClock(slow)).run(Client())
    assert report.batches == 1
    assert report.claimed == 5


async def test_a_reply_queue_that_keeps_refusing_raises_one_alert_and_its_statuses_wait():
    """Issue 43 item 4: a terminal status its reply queue refuses for good is
    not retried in silence. After STATUS_ALERT_AFTER refusals in a row one
    StatusUndeliverable alert names the queue (one for the spell, however
    many runs); the status stays in the outbox and goes out once the queue
    takes it, and a new spell alerts again."""
    from orchestrators.starter import STATUS_ALERT_AFTER, STATUS_BACKOFF_MAX

    world = World()
    await _failed(world, "A1")
    refusing, _ = _refuse(world, "replies-webshop", "QuotaExceeded")
    starter = world.starter()

    def undeliverable():
        return [a for a, _ in world.sent("alerts") if b"StatusUndeliverable" in a]

    for _ in range(3 * STATUS_ALERT_AFTER):
        world.now += timedelta(minutes=1)
        await starter.run(StartingClient())
    assert len(undeliverable()) == 1
    assert b"replies-webshop" in undeliverable()[0]
    assert (await world.record()).PendingStatus is not None

    refusing["on"] = False
    world.now += STATUS_BACKOFF_MAX
    assert (await starter.run(StartingClient())).statuses_delivered == 1
    assert (await world.record()).PendingStatus is None
    assert len(undeliverable()) == 1


async def test_an_alerts_queue_refusing_for_long_holds_back_no_status_and_blames_no_reply_queue():
    """Seed 104 of h11-mutants' long alerts refusal: the alerts queue refusing
    a Failed status's outbox alert was counted as the client's reply queue
    refusing (a StatusUndeliverable alert naming replies-webshop) and the
    status waited behind its alert for the spell (36 minutes). Now the
    statuses go at once without their alerts, the alerts queue is probed as a
    refusing reply queue is (10 s, 20 s, ..., then every STATUS_BACKOFF_MAX),
    entries left for their alert fill no page meanwhile, and once the queue
    takes sends every alert goes, once, and the entries are cleared."""
    from orchestrators.starter import STATUS_BACKOFF_MAX

    world = World()
    batch = world.starter()._settings.starter_batch_size
    names = [f"A{i}" for i in range(batch + 2)]
    for name in names:
        await _failed(world, name)
    refusing, refused = _refuse(world, "alerts")
    starter = world.starter()
    tick = timedelta(seconds=10)
    for _ in range(6):  # past the grace: every status goes
        world.now += tick
        await starter.run(StartingClient())
    replies = [json.loads(b)["OrderID"] for b in world.bus.to("replies-webshop")]
    assert sorted(replies) == sorted(names)
    late = "B1"  # a status written while the page is full of entries left for their alerts
    await _failed(world, late)
    end = world.now + timedelta(minutes=30)
    while world.now < end:
        world.now += tick
        await starter.run(StartingClient())
    assert late in [json.loads(b)["OrderID"] for b in world.bus.to("replies-webshop")]
    assert world.bus.to("alerts") == []
    assert 6 <= len(refused) <= 14, len(refused)  # probed, not one per entry and scan
    for name in [*names, late]:
        pending = (await world.record(f"webshop:{name}")).PendingStatus
        assert pending is not None
        assert pending.Sent

    refusing["on"] = False
    back = world.now
    while any([(await world.record(f"webshop:{n}")).PendingStatus for n in [*names, late]]):
        assert world.now - back <= 2 * STATUS_BACKOFF_MAX, "alerts left after the queue is back"
        world.now += tick
        await starter.run(StartingClient())
    alerts = [json.loads(b) for b in world.bus.to("alerts")]
    assert sorted(a["OrderID"] for a in alerts if a["Kind"] == "OrderError") == sorted(
        f"webshop:{n}" for n in [*names, late]
    )
    assert [a for a in alerts if a["Kind"] == "StatusUndeliverable"] == []
    assert len(world.bus.to("replies-webshop")) == len(names) + 1  # no status sent twice


async def test_a_reply_queue_refusing_for_an_hour_is_probed_with_a_few_sends_not_every_scan():
    """A parked status whose reply queue refuses for an hour, the Starter
    running every 10 s: its queue is probed after 10 s, 20 s, 40 s, ...,
    then every STATUS_BACKOFF_MAX (about 17 refused sends in the hour, not
    one per 30 s scan: 120). Once the queue takes sends the status goes out
    within STATUS_BACKOFF_MAX by itself; an operator's resend (the console's
    and the CLI's StatusOutbox) goes at once, whatever the Starter's back-off."""
    from orchestrators.starter import STATUS_BACKOFF_MAX
    from reporting import StatusOutbox, StatusReporter

    world = World()
    await _failed(world, "A1")
    refusing, refused = _refuse(world, "replies-webshop")
    starter = world.starter()
    tick = timedelta(seconds=10)

    async def run_for(span: timedelta) -> None:
        end = world.now + span
        while world.now < end:
            world.now += tick
            await starter.run(StartingClient())

    await run_for(timedelta(hours=1))
    assert 10 <= len(refused) <= 20, len(refused)
    gaps = [b - a for a, b in itertools.pairwise(refused)]
    assert max(gaps) <= STATUS_BACKOFF_MAX + tick
    assert gaps[-1] >= STATUS_BACKOFF_MAX  # backed off to the cap
    assert (await world.record()).PendingStatus is not None

    # The queue works again: the Starter sends it by itself within the cap.
    refusing["on"] = False
    back = world.now
    while (await world.record()).PendingStatus is not None:
        assert world.now - back <= STATUS_BACKOFF_MAX + tick
        world.now += tick
        await starter.run(StartingClient())

    # A new spell: the operator's resend goes at once, past the Starter's back-off.
    await _failed(world, "B1")
    refusing["on"] = True
    await run_for(timedelta(minutes=15))  # the Starter backs off B1's queue
    refusing["on"] = False
    record = await world.record("webshop:B1")
    assert record.PendingStatus is not None
    assert (await StatusOutbox(world.store, StatusReporter(world.bus)).deliver(record)).done
    assert (await world.record("webshop:B1")).PendingStatus is None


async def test_a_refused_status_whose_try_count_is_not_written_still_backs_off():
    """Seed 12000745: a refused send whose try-count write then failed (a
    Cosmos outage) was taken for a sent status, ending the queue's back-off:
    the Starter sent to the refusing queue every 10 s scan."""
    from domain.errors import TransientError as StoreDown

    world = World()
    await _failed(world, "A1")
    refused: dict[str, list] = {"replies-webshop": [], "alerts": []}

    async def send(queue, body, message_id, props=None):
        refused[queue].append(world.now)
        raise TransientError(f"{queue}: MessagingEntityDisabled")

    world.bus.send = send
    real_update = world.store.update

    async def update(order_id, change, owner):
        if refused["replies-webshop"][-1:] == [world.now]:  # the try count of a refused send
            raise StoreDown("state: Cannot connect")
        return await real_update(order_id, change, owner)

    world.store.update = update
    starter = world.starter()
    end = world.now + timedelta(minutes=30)
    while world.now < end:
        world.now += timedelta(seconds=10)
        await starter.run(StartingClient())
    # 10, 20, 40, 80, 160 s, then every 5 minutes: each queue probed on its own
    for queue, times in refused.items():
        assert 6 <= len(times) <= 12, (queue, len(times))
