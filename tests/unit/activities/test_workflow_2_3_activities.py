"""Workflow 2.3's begin/advance activities (docs/adr/020b-workflow-2-3.md):
ids and etags in, the new etag out, never a record; the discriminated union
`Kind` picks the write, and 2.2's one-model `Advance` is still taken."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta

import pytest
from pydantic import ValidationError

from domain.models import ProcessState, StepStatus
from orchestrators.contracts import (
    Advance,
    BeginWrite,
    FinishWrite,
    StepWrite,
    event_payload,
    parse_advance,
    reply_from_event,
)
from tests.unit.orchestrators.driver import World

STEPS = ("reserve-inventory", "charge-payment", "arrange-shipment")


def test_the_kind_picks_the_write_and_a_2_2_input_is_still_an_advance():
    deadline = "2026-11-30T08:01:00Z"
    assert isinstance(parse_advance({"Kind": "begin", "InstanceId": "a:B:1"}), BeginWrite)
    step = {"Kind": "step", "InstanceId": "a:B:1", "Complete": "x", "Start": "y"}
    assert isinstance(parse_advance({**step, "Deadline": deadline}), StepWrite)
    assert isinstance(parse_advance({"Kind": "finish", "InstanceId": "a:B:1"}), FinishWrite)
    legacy = parse_advance({"InstanceId": "a:B:1", "Begin": True, "Record": None, "Etag": None})
    assert isinstance(legacy, Advance)
    with pytest.raises(ValidationError):  # a step says what it starts, and until when
        parse_advance(step)
    with pytest.raises(ValidationError):  # no record rides in a 2.3 input
        parse_advance({"Kind": "finish", "InstanceId": "a:B:1", "Record": {}})
    with pytest.raises(ValidationError):
        parse_advance({"Kind": "advance", "InstanceId": "a:B:1"})


def test_a_2_3_input_dumps_only_what_it_says():
    write = FinishWrite(Kind="finish", InstanceId="a:B:1", Etag='"e"', Complete="x")
    assert write.dump() == {"Kind": "finish", "InstanceId": "a:B:1", "Etag": '"e"', "Complete": "x"}


async def _happy_path(world: World, acts_for, iid: str):
    """Begin, two steps, finish, each activity from `acts_for(i)`; the JSON
    results as the orchestration would see them."""
    deadline = world.now + timedelta(seconds=60)
    results = []
    data = BeginWrite(Kind="begin", InstanceId=iid, Etag=None, Deadline=deadline).dump()
    results.append(await acts_for(0).run("begin_attempt", data))
    for i, (done, start) in enumerate(itertools.pairwise(STEPS), start=1):
        step = StepWrite(
            Kind="step",
            InstanceId=iid,
            Etag=results[-1]["Etag"],
            Complete=done,
            Reference=f"ref-{done}",
            Start=start,
            Deadline=deadline,
        )
        results.append(await acts_for(i).run("advance_attempt", step.dump()))
    finish = FinishWrite(
        Kind="finish", InstanceId=iid, Etag=results[-1]["Etag"], Complete=STEPS[-1]
    )
    results.append(await acts_for(3).run("advance_attempt", finish.dump()))
    return results


@pytest.mark.parametrize("workers", ["one", "each its own"])
async def test_the_happy_path_carries_no_record_and_ends_processed(workers):
    world = World()
    iid = await world.claimed()
    one = world.activities()
    results = await _happy_path(
        world, (lambda i: one) if workers == "one" else (lambda i: world.activities()), iid
    )
    for result in results:
        assert "Record" not in result
        assert len(json.dumps(result)) < 600, result
        assert not result.get("Stale"), result
    assert results[0]["Plan"]["Payload"]  # begin read the order (no payload given)
    assert [r.get("State") for r in results] == ["Processing"] * 3 + ["Processed"]
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSED
    assert record.PendingStatus is None  # sent and cleared
    assert all(record.Steps[s].Status is StepStatus.COMPLETED for s in STEPS)
    assert [r.Reference for r in record.Compensation[:2]] == [f"ref-{s}" for s in STEPS[:2]]
    requests = world.sent("agent-requests")
    assert len(requests) == 3
    # Every request carries the order's payload, wherever the activity ran.
    assert all(json.loads(body)["Payload"]["Lines"] for body, _ in requests)


async def test_a_stale_etag_is_read_again_and_the_lock_still_fences():
    """An etag the process did not write (or an older one) is no proof: the
    activity reads the record and the LockedBy check decides."""
    world = World()
    iid = await world.claimed()
    acts = world.activities()
    deadline = world.now + timedelta(seconds=60)
    begun = await acts.run(
        "begin_attempt", BeginWrite(Kind="begin", InstanceId=iid, Deadline=deadline).dump()
    )
    # Another attempt took the order (the Supervisor recovered it, a new claim).
    record, etag = await world.store.read("webshop:A1")
    await world.store.replace(record.model_copy(update={"LockedBy": "webshop:A1:9"}), etag)
    step = StepWrite(
        Kind="step",
        InstanceId=iid,
        Etag=begun["Etag"],
        Complete=STEPS[0],
        Start=STEPS[1],
        Deadline=deadline,
    )
    result = await acts.run("advance_attempt", step.dump())
    assert result["Stale"] is True
    after = await world.record()
    assert after.LockedBy == "webshop:A1:9"
    assert after.Steps[STEPS[0]].Status is StepStatus.RUNNING  # not completed by the stale attempt


async def test_a_retried_finish_recognises_its_own_write():
    world = World()
    iid = await world.claimed()
    acts = world.activities()
    results = await _happy_path(world, lambda i: acts, iid)
    finish = FinishWrite(Kind="finish", InstanceId=iid, Etag=results[2]["Etag"], Complete=STEPS[-1])
    again = await world.activities().run("advance_attempt", finish.dump())
    assert again.get("State") == "Processed"
    assert not again.get("Stale")


def test_the_bridge_raises_the_reply_without_its_seal():
    from domain.models import AgentReply

    reply = AgentReply(
        InstanceId="webshop:A1:1",
        OrderID="webshop:A1",
        Step="charge-payment",
        Attempt=1,
        EventName="reply-charge-payment-1",
        EventId="e1",
        Outcome="ok",
        Result={"Reference": "r"},
        ReplyToken="v1.k.token",
        Signature="v1.k.sig",
    )
    payload = event_payload(reply)
    assert "ReplyToken" not in payload
    assert "Signature" not in payload
    assert "Error" not in payload  # empty fields left out
    # Nor its identity (the event's name and instance say it: ADR 021h).
    assert payload == {"Outcome": "ok", "Result": {"Reference": "r"}}
    assert reply_from_event(payload).Result == {"Reference": "r"}


async def test_a_begin_run_again_after_the_attempt_moved_on_starts_nothing():
    """Simulation seed 291: a begin delivered again after the attempt's first
    step had completed read the record as it is now and started the second
    step with the first step's deadline. It must plan from the claim's view:
    the begin's own step is done, so nothing is started or sent."""
    world = World()
    iid = await world.claimed()
    claim_etag = (await world.store.read("webshop:A1"))[1]
    one = world.activities()
    results = await _happy_path(world, lambda i: one, iid)
    assert results[-1].get("State") == "Processed"
    before = len(world.sent("agent-requests"))
    begin = BeginWrite(
        Kind="begin", InstanceId=iid, Etag=claim_etag, Deadline=world.now + timedelta(seconds=60)
    )
    again = await world.activities().run("begin_attempt", begin.dump())
    assert again.get("Stale") is True
    assert len(world.sent("agent-requests")) == before
    assert (await world.record()).ProcessState is ProcessState.PROCESSED


async def test_a_begin_retried_after_its_write_landed_writes_nothing_more():
    world = World()
    iid = await world.claimed()
    claim_etag = (await world.store.read("webshop:A1"))[1]
    deadline = world.now + timedelta(seconds=60)
    begin = BeginWrite(Kind="begin", InstanceId=iid, Etag=claim_etag, Deadline=deadline)
    first = await world.activities().run("begin_attempt", begin.dump())
    again = await world.activities().run("begin_attempt", begin.dump())
    assert first["Started"] == again["Started"] == STEPS[0]
    assert again["Etag"] == first["Etag"]  # nothing written the second time
    # Sent again under the same message id, which the queue's duplicate
    # detection (the fake's too) drops: one request on the queue.
    assert [mid for _, mid in world.sent("agent-requests")] == [f"{iid}/{STEPS[0]}"]


async def test_a_progress_status_that_cannot_be_sent_does_not_fail_the_begin():
    """An application with progress statuses whose reply queue is down: the
    begin's write landed and its request went out, so the activity answers
    as usual (the attempt waits for the reply) instead of failing after its
    retries, which failed the attempt and had a later one ask the remote
    service again for a step it had refused for good (simulation seeds
    100067, 100255, 100381)."""
    from dataclasses import replace

    from domain.errors import TransientError
    from tests.fakes import RecordingPublisher
    from tests.unit.orchestrators.driver import SETTINGS

    class ReplyQueueDown(RecordingPublisher):
        async def send(self, queue, body, message_id, application_properties=None) -> None:
            if queue.startswith("replies-"):
                raise TransientError(f"sending to queue {queue!r} failed: link detached")
            await super().send(queue, body, message_id, application_properties)

    world = World(
        bus=ReplyQueueDown(), settings=replace(SETTINGS, progress_apps=frozenset({"webshop"}))
    )
    iid = await world.claimed()
    claim_etag = (await world.store.read("webshop:A1"))[1]
    deadline = world.now + timedelta(seconds=60)
    begin = BeginWrite(Kind="begin", InstanceId=iid, Etag=claim_etag, Deadline=deadline)
    begun = await world.activities().run("begin_attempt", begin.dump())
    assert begun["Started"] == STEPS[0]
    assert [mid for _, mid in world.sent("agent-requests")] == [f"{iid}/{STEPS[0]}"]
    assert world.bus.to("replies-webshop") == []
