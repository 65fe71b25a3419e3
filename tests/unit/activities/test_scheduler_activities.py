"""Write-idempotency of the Scheduler's activities under at-least-once
delivery: each activity run twice has the effect of running once."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from domain.errors import StatusNotSent, TransientError
from domain.models import ProcessState, StatusKind
from orchestrators.commands import parse_state_write
from orchestrators.contracts import FinishAll, SendRequest, StatusNote
from tests.unit.orchestrators.driver import STEPS, World


async def _write(acts, iid, kind, **fields):
    return await acts.write_state(parse_state_write({"InstanceId": iid, "Kind": kind, **fields}))


async def _fail(acts, iid, step="reserve-inventory", compensate=False):
    """The attempt's finishing write for a refusal of `step`: Error, or
    with `compensate` the compensation begun."""
    return await acts.finish_attempt(
        FinishAll(InstanceId=iid, Failed=step, Reason="declined", Compensate=compensate)
    )


@pytest.mark.parametrize("final", ["processed", "failed", "compensate"])
async def test_every_write_run_twice_is_one_write_and_never_stale(final):
    world = World()
    iid = await world.claimed()
    acts = world.activities()
    if final == "processed":
        finish = FinishAll(InstanceId=iid, Done={s: f"r-{s}" for s in STEPS})
    else:
        done = {STEPS[0]: "r-0"} if final == "compensate" else {}
        finish = FinishAll(
            InstanceId=iid,
            Done=done,
            Failed=STEPS[1] if done else STEPS[0],
            Reason="declined",
            Compensate=bool(done),
        )
    first = await acts.finish_attempt(finish)
    after_first = world.store.docs["webshop:A1"][0]
    again = await acts.finish_attempt(finish)
    assert not first.Stale, first.Reason
    assert not again.Stale, again.Reason
    assert first.State == again.State
    assert world.store.docs["webshop:A1"][0]["History"] == after_first["History"]
    writes = []
    if final == "compensate":
        writes = [("undo_done", {"Step": s}) for s in first.Plan.Undo] + [
            ("finish_compensation", {})
        ]
    for kind, fields in writes:
        first = await _write(acts, iid, kind, **fields)
        after_first = world.store.docs["webshop:A1"][0]
        again = await _write(acts, iid, kind, **fields)
        assert not first.Stale, (kind, first.Reason)
        assert not again.Stale, (kind, again.Reason)
        assert first.State == again.State
        record = world.store.docs["webshop:A1"][0]
        assert record["ProcessState"] == after_first["ProcessState"]
        assert record["Compensation"] == after_first["Compensation"]
    expected = {
        "processed": ProcessState.PROCESSED,
        "failed": ProcessState.ERROR,
        "compensate": ProcessState.COMPENSATED,
    }[final]
    assert (await world.record()).ProcessState is expected


async def test_a_write_by_another_attempt_is_stale():
    world = World()
    iid = await world.claimed()
    acts = world.activities()
    assert (await _write(acts, "webshop:A1:7", "transient", Step=STEPS[0])).Stale
    assert (await acts.finish_attempt(FinishAll(InstanceId="webshop:A1:7"))).Stale
    assert iid != "webshop:A1:7"
    assert (await world.record()).ProcessState is ProcessState.PROCESSING


async def test_agent_request_sent_twice_is_one_message():
    world = World()
    iid = await world.claimed()
    acts = world.activities()
    send = SendRequest(
        InstanceId=iid, Step="reserve-inventory", Deadline=world.now + timedelta(minutes=1)
    )
    assert await acts.send_agent_request(send) == await acts.send_agent_request(send)
    assert len(world.sent("agent-requests")) == 1


async def test_terminal_status_run_twice_is_one_message_from_the_outbox():
    world = World()
    iid = await world.claimed()
    acts = world.activities()
    await _fail(acts, iid)
    note = StatusNote(
        InstanceId=iid, ReplyTo="replies-webshop", Status=StatusKind.FAILED, Detail="declined"
    )
    await acts.report_status(note)
    await acts.report_status(note)
    assert len(world.sent("replies-webshop")) == 1
    assert (await world.record()).PendingStatus is None


async def test_terminal_status_that_cannot_be_sent_raises_and_stays_in_the_outbox():
    world = World()
    iid = await world.claimed()
    acts = world.activities()
    await _fail(acts, iid)
    world.bus.refusing["replies-webshop"] = ConnectionError("down")
    with pytest.raises(StatusNotSent):
        await acts.report_status(
            StatusNote(InstanceId=iid, ReplyTo="replies-webshop", Status=StatusKind.FAILED)
        )
    pending = (await world.record()).PendingStatus
    assert pending is not None
    assert pending.Tries == 1
    assert not pending.Sent


async def test_an_error_records_alert_goes_with_its_status_and_survives_a_failed_send():
    """Defect 6 (alerts): the OrderError alert of a Failed order is sent from
    the record's outbox with the Failed status (the raise_alert activity
    leaves it to the outbox), so a failed alert send is retried, once, with a
    stable id; it is not only logged. A refused alert never holds the status
    back (the alerts queue refusing for long, seed 104 of h11-mutants): the
    status goes, the entry stays for the alert alone."""
    from orchestrators.contracts import AlertNote

    world = World()
    iid = await world.claimed()
    acts = world.activities()
    await _fail(acts, iid)
    await acts.raise_alert(AlertNote(Kind="OrderError", OrderID="webshop:A1", Reason="declined"))
    assert world.sent("alerts") == []
    note = StatusNote(
        InstanceId=iid, ReplyTo="replies-webshop", Status=StatusKind.FAILED, Detail="declined"
    )
    world.bus.refusing["alerts"] = ConnectionError("alerts queue down")
    await acts.report_status(note)  # the client's status is sent: nothing for Durable to retry
    assert world.sent("alerts") == []
    assert len(world.sent("replies-webshop")) == 1
    pending = (await world.record()).PendingStatus
    assert pending is not None
    assert pending.Sent
    assert pending.Tries == 1
    del world.bus.refusing["alerts"]
    await acts.report_status(note)
    await acts.report_status(note)
    assert len(world.sent("alerts")) == 1
    # the status was not sent again with its alert
    assert [q for q, *_ in world.bus.sends if q == "replies-webshop"] == ["replies-webshop"]
    assert (await world.record()).PendingStatus is None


async def test_a_terminal_status_sent_without_its_outbox_entry_uses_the_entrys_id():
    """report_status reading a version lagging the Failed write (no outbox
    entry yet) sends Failed under the id the entry has, so the outbox's send
    of it is dropped as a duplicate: one terminal status, one message id."""
    from domain.models import OrderState

    world = World()
    iid = await world.claimed()
    acts = world.activities()
    before = await world.record()
    await _fail(acts, iid)
    real_read = world.store.read
    lagging = {"left": 1}

    async def read(order_id):
        if lagging["left"]:
            lagging["left"] -= 1
            return OrderState.model_validate(before.model_dump(mode="json")), '"old"'
        return await real_read(order_id)

    world.store.read = read
    note = StatusNote(
        InstanceId=iid,
        ReplyTo="replies-webshop",
        Status=StatusKind.FAILED,
        Step="reserve-inventory",
        Detail="declined",
    )
    await acts.report_status(note)  # lagging: sent directly
    await acts.report_status(note)  # from the outbox: the same id, dropped as a duplicate
    assert len(world.sent("replies-webshop")) == 1
    assert (await world.record()).PendingStatus is None


class _Killed(BaseException):
    """The activity's process killed (no handler runs), as kill -9 would."""


async def _indexed_finish(world):
    """An attempt claimed with the recovery index (ADR 021k), and its finishing input."""
    from tests.fakes import FakeIndex

    world.index = FakeIndex()
    iid = await world.claimed()
    ((_, deadline),) = world.index.entries
    return FinishAll(InstanceId=iid, Done={s: f"r-{s}" for s in STEPS}, IndexedAt=deadline)


async def test_with_the_index_a_rerun_after_a_crash_before_the_send_sends_the_same_id():
    """ADR 021k: the finishing write puts no status in the outbox (no clear
    to pay); a process killed between the write and the send leaves the
    record Processed with an empty outbox and the index entry in place, and
    Durable's re-run finds the write landed and sends Processed under the
    one id (and the body, its time the write's) the outbox would have."""
    world = World()
    finish = await _indexed_finish(world)
    acts = world.activities()
    world.bus.fail_next = _Killed()
    with pytest.raises(_Killed):
        await acts.finish_attempt(finish)
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSED
    assert record.PendingStatus is None
    assert len(world.index.entries) == 1  # the mark that the status may be unsent
    world.now += timedelta(seconds=7)  # the re-run's clock is later: the body is not
    again = await acts.finish_attempt(finish)
    assert again.State is ProcessState.PROCESSED
    ((body, message_id),) = world.sent("replies-webshop")
    assert message_id == "A1/status/Processed"
    status = json.loads(body)
    assert status["Status"] == "Processed"
    assert datetime.fromisoformat(status["Timestamp"]) == record.History[-1].At
    assert (await world.record()).PendingStatus is None
    assert world.index.entries == {}


async def test_with_the_index_a_failed_send_parks_the_status_in_the_outbox():
    """ADR 021k: a Processed status the reply queue refuses is parked in the
    outbox (the Starter's sweep, try counts and alert take over) and the
    activity succeeds; only when parking fails too does it raise for
    Durable to run it again."""
    from reporting import StatusOutbox, StatusReporter

    world = World()
    finish = await _indexed_finish(world)
    acts = world.activities()
    world.bus.fail_next = ConnectionError("reply queue down")
    assert (await acts.finish_attempt(finish)).State is ProcessState.PROCESSED
    assert world.sent("replies-webshop") == []
    record, etag = await world.store.read("webshop:A1")
    assert record.PendingStatus is not None
    assert record.PendingStatus.MessageId == "A1/status/Processed"
    assert record.PendingStatus.At == record.History[-1].At
    assert (await StatusOutbox(world.store, StatusReporter(world.bus)).deliver(record, etag)).done
    assert [mid for _, mid in world.sent("replies-webshop")] == ["A1/status/Processed"]

    world = World()
    finish = await _indexed_finish(world)
    acts = world.activities()
    world.bus.fail_next = ConnectionError("reply queue down")

    async def refused(*args, **kwargs):
        raise TransientError("store down")

    world.store.update = refused
    with pytest.raises(StatusNotSent):
        await acts.finish_attempt(finish)
    assert (await world.record()).PendingStatus is None
    assert len(world.index.entries) == 1  # left for the re-run, or the Supervisor
