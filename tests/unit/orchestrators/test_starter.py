"""The Starter with fakes: the metric line on every run, one failing start
does not end the run, outbox delivery."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

from adapters.ports import ANY_OWNER
from domain import state_machine as sm
from domain.models import OrderSubmitted, ProcessState
from orchestrators.starter import Starter
from tests.builders import order_payload
from tests.unit.orchestrators.driver import POLICY, SETTINGS, STEPS, World


class Client:
    def __init__(self, fail_for=()):
        self.started, self.fail_for = [], set(fail_for)

    async def start_new(self, name, instance_id, data):
        if instance_id in self.fail_for:
            raise ConnectionError("host unavailable")
        self.started.append(instance_id)

    async def get_status(self, instance_id):
        if instance_id not in self.started:
            return None
        return type("Status", (), {"runtime_status": type("R", (), {"name": "Running"})()})()


async def _pending(world, order_id):
    order = OrderSubmitted.model_validate(order_payload(OrderID=order_id))
    await world.store.create_if_absent(sm.new_record(order, world.now, STEPS))


async def _errored_with_request(world, order_id):
    await _pending(world, order_id)
    claimed = await world.store.claim(order_id, world.now, POLICY)
    t = world.now
    await world.store.update(order_id, lambda r: sm.mark_failed(r, claimed.LockedBy, None, "x", t), claimed.LockedBy)
    await world.store.update(order_id, lambda r: sm.mark_status_sent(
        sm.request_compensation(r, t), r.PendingStatus.MessageId, t), ANY_OWNER)


async def test_at_the_cap_the_metric_line_is_still_emitted(caplog):
    """Issue 17 item 5: the run at saturation logs its `starter: pending=` line."""
    world = World()
    await _pending(world, "A1")
    starter = Starter(replace(SETTINGS, max_processing=0), world.store, clock=lambda: world.now)
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
    client = Client(fail_for={"A1:2"})
    report = await Starter(SETTINGS, world.store, clock=lambda: world.now).run(client)
    assert report.start_failures == 1
    # A1's compensation never started: the same run restarts it as attempt 3.
    assert sorted(client.started) == ["A1:3", "B1:2", "C1:1"]
    assert report.claimed == 1


async def test_a_failing_start_after_a_claim_leaves_the_record_for_the_supervisor():
    world = World()
    await _pending(world, "A1")
    await _pending(world, "B1")
    client = Client(fail_for={"A1:1"})
    report = await Starter(SETTINGS, world.store, clock=lambda: world.now).run(client)
    assert (report.claimed, report.start_failures, client.started) == (2, 1, ["B1:1"])
    record = await world.record("A1")
    assert record.ProcessState is ProcessState.PROCESSING and record.CompleteBy is not None


async def test_outbox_entries_wait_their_grace_then_are_sent_once_with_their_id():
    world = World()
    await _pending(world, "A1")
    claimed = await world.store.claim("A1", world.now, POLICY)
    t = world.now
    await world.store.update("A1", lambda r: sm.mark_failed(r, claimed.LockedBy, None, "declined", t), claimed.LockedBy)
    message_id = (await world.record()).PendingStatus.MessageId
    starter = Starter(SETTINGS, world.store, clock=lambda: world.now, publisher=world.bus)
    assert (await starter.run(Client())).statuses_delivered == 0  # inside the grace: the writer sends it
    world.now += timedelta(minutes=1)
    assert (await starter.run(Client())).statuses_delivered == 1
    assert (await starter.run(Client())).statuses_delivered == 0
    assert [mid for _, mid in world.sent("replies-webshop")] == [message_id]


async def test_the_outbox_is_scanned_at_most_once_per_scan_interval():
    """Issue 12: not a query per tick; an entry waits at most grace + interval."""
    world = World()
    await _pending(world, "A1")
    claimed = await world.store.claim("A1", world.now, POLICY)
    t = world.now
    await world.store.update("A1", lambda r: sm.mark_failed(r, claimed.LockedBy, None, "declined", t), claimed.LockedBy)
    starter = Starter(SETTINGS, world.store, clock=lambda: world.now, publisher=world.bus,
                      status_grace=timedelta(seconds=30), status_scan_interval=timedelta(seconds=10))
    assert (await starter.run(Client())).statuses_delivered == 0  # scanned: inside the grace
    world.now += timedelta(seconds=31)
    assert (await starter.run(Client())).statuses_delivered == 1  # scanned again: past the grace
    await _pending(world, "B1")
    claimed = await world.store.claim("B1", world.now, POLICY)
    t = world.now - timedelta(minutes=5)  # already past its grace
    await world.store.update("B1", lambda r: sm.mark_failed(r, claimed.LockedBy, None, "declined", t), claimed.LockedBy)
    world.now += timedelta(seconds=5)
    assert (await starter.run(Client())).statuses_delivered == 0  # within the interval: no scan
    world.now += timedelta(seconds=5)
    assert (await starter.run(Client())).statuses_delivered == 1
