"""Late undo answers (ADR 005): an undo try whose deadline passed may still
be answered, and that answer counts while a later try waits, so an outage
during the later tries does not end the order CompensationFailed when the
remote service had undone the step."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from domain.models import ProcessState
from orchestrators import order_workflow as wf
from tests.unit.orchestrators.driver import STEPS, Driver, World

LATE = timedelta(seconds=70)  # past the 60 s undo deadline, inside the next try's


def ok(send):
    return ("ok", {"Reference": f"ref-{send.Step}-{send.Action}"})


def agent(undo_of_step_1):
    """Forward steps: the last one is declined, so all three are undone.
    Undo tries of STEPS[1] answer as `undo_of_step_1(try)` says."""

    def answer(send):
        if send.Action == "do":
            return ("permanent", "card declined") if send.Step == STEPS[2] else ok(send)
        if send.Step == STEPS[1]:
            return undo_of_step_1(send.Try)
        return ok(send)

    return answer


def undo_requests(world, step):
    return [
        json.loads(body)["ReplyEvent"]
        for body, _ in world.sent("agent-requests")
        if json.loads(body)["Action"] == "undo" and json.loads(body)["Step"] == step
    ]


async def _run(version, undo_of_step_1):
    world = World()
    instance_id, attempt_input = await world.fast_started()
    driver = Driver(world, instance_id, agent(undo_of_step_1), version=version, input=attempt_input)
    assert await driver.run() == "completed", driver.error
    return world, driver


def late_success_then_outage(attempt_try):
    return ("ok", {"Reference": "refund-1"}, LATE) if attempt_try == 0 else None


async def test_a_late_success_of_an_earlier_undo_try_counts():
    world, driver = await _run(wf.VERSION, late_success_then_outage)
    assert driver.output["Outcome"] == "compensated"
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATED
    assert all(e.Outcome == "Done" for e in record.Compensation)
    # try 1 was sent and then outlived by try 0's answer: no third try
    assert len(undo_requests(world, STEPS[1])) == 2
    assert [json.loads(b)["Status"] for b in world.bus.to("replies-webshop")][-1] == "Compensated"


async def test_a_late_failure_of_an_earlier_try_does_not_end_the_current_one():
    def answers(attempt_try):
        if attempt_try == 0:
            return ("transient", "refund service busy", LATE)
        return ("ok", {"Reference": "refund-1"}, timedelta(seconds=20))

    world, driver = await _run(wf.VERSION, answers)
    assert driver.output["Outcome"] == "compensated"
    assert len(undo_requests(world, STEPS[1])) == 2


async def test_a_permanent_refusal_from_any_try_ends_the_undo_as_failed():
    def answers(attempt_try):
        return ("permanent", "refund refused: charge disputed", LATE) if attempt_try == 0 else None

    world, driver = await _run(wf.VERSION, answers)
    assert driver.output["Outcome"] == "compensation_failed"
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATION_FAILED
    assert "charge disputed" in record.LastError
    assert len(undo_requests(world, STEPS[1])) == 2


async def test_the_last_try_giving_up_still_waits_for_an_earlier_tries_answer():
    """The last try answers transiently at once (an open circuit); try 0's
    answer comes before the last try's deadline: it is waited for, not
    abandoned with a CompensationFailed."""

    def answers(attempt_try):
        if attempt_try == 0:
            return ("ok", {"Reference": "refund-1"}, timedelta(seconds=130))
        if attempt_try == 2:
            return ("transient", "circuit open for inventory", timedelta(seconds=1))
        return None

    world, driver = await _run(wf.VERSION, answers)
    assert driver.output["Outcome"] == "compensated"
    assert len(undo_requests(world, STEPS[1])) == 3


def undo_deadlines(world, step):
    """(Deadline, ListenUntil) of each undo request of `step`, in order."""
    bodies = [json.loads(body) for body, _ in world.sent("agent-requests")]
    return [
        (b["Deadline"], b["ListenUntil"])
        for b in bodies
        if b["Action"] == "undo" and b["Step"] == step
    ]


async def test_every_undo_try_of_2_1_says_until_when_its_answer_counts():
    """Each try keeps its own deadline (no call starts after it on a first
    delivery) and carries the undo's one deadline as ListenUntil (first try
    + 3 x 60 s): a try redelivered after its own deadline may still call."""
    world, _ = await _run(wf.VERSION, lambda attempt_try: None)
    sent = undo_deadlines(world, STEPS[1])
    assert len(sent) == 3
    deadlines = [datetime.fromisoformat(d) for d, _ in sent]
    (listen_until,) = {datetime.fromisoformat(u) for _, u in sent}
    assert deadlines == [deadlines[0] + timedelta(seconds=60 * k) for k in range(3)]
    assert listen_until == deadlines[0] + timedelta(seconds=120)


async def test_the_last_try_waits_for_an_earlier_try_until_the_undo_deadline():
    """Try 0 gives up at once, so every later try starts early; try 1's answer
    comes after the last try's own deadline (its start + 60 s) but before the
    undo's (try 0's start + 180 s), when its agent could still call: it counts."""

    def answers(attempt_try):
        if attempt_try == 0:
            return ("transient", "refund service busy", timedelta(seconds=1))
        if attempt_try == 1:
            return ("ok", {"Reference": "refund-1"}, timedelta(seconds=150))
        return ("transient", "circuit open for payment", timedelta(seconds=1))

    world, driver = await _run(wf.VERSION, answers)
    assert driver.output["Outcome"] == "compensated"
    assert len(undo_requests(world, STEPS[1])) == 3
