"""Unconfirmed undo (ADR 019a): an undo whose every try ended
unconfirmed (transient, unanswered, lost) is no verdict. The record stays
Compensating with a NotBefore (its long retry), the Starter restarts the
compensation as a new attempt after that time, and the idempotent, fenced undo
then gets the remote's answer. A refusal still ends CompensationFailed at
once; the long retries are bounded, then CompensationFailed with its alert.
Driven through the Durable SDK's replay (tests/unit/orchestrators/driver.py)
with the real activities and Starter over in-memory fakes."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

from domain.models import ProcessState
from domain.steps import DEFAULT_CATALOG
from orchestrators.contracts import step_payload
from orchestrators.order_workflow import VERSION
from tests.unit.orchestrators.driver import POLICY, SETTINGS, STEPS, Driver, World

UNDO_BUDGET = timedelta(seconds=3 * 60)  # UndoTries x step timeout


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


def lost(attempt_try):
    """An outage in which every answer is lost: no try is ever answered."""
    return None


class GoneClient:
    """A Durable client for the Starter: instances it started are Running
    until the test marks them finished (as the driver runs them)."""

    def __init__(self) -> None:
        self.started: dict[str, object] = {}
        self.finished: set[str] = set()

    async def start_new(self, name, instance_id, data):
        self.started[instance_id] = data

    async def get_status(self, instance_id):
        name = "Completed" if instance_id in self.finished else "Running"
        return type("Status", (), {"runtime_status": type("R", (), {"name": name})()})()


def undo_tries(world, step):
    return [
        json.loads(body)
        for body, _ in world.sent("agent-requests")
        if json.loads(body)["Action"] == "undo" and json.loads(body)["Step"] == step
    ]


def alerts(world):
    return [json.loads(body)["Kind"] for body, _ in world.sent("alerts")]


async def _first_attempt(world, undo_of_step_1, version=VERSION):
    instance_id, attempt_input = await world.fast_started()
    driver = Driver(world, instance_id, agent(undo_of_step_1), version=version, input=attempt_input)
    assert await driver.run() == "completed", driver.error
    return driver


async def test_an_unconfirmed_undo_waits_for_a_long_retry_instead_of_failing():
    world = World()
    driver = await _first_attempt(world, lost)
    assert driver.output["Outcome"] == "compensation_deferred"
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATING
    assert record.LockedBy == driver.instance_id  # kept until the Starter restarts it
    assert record.CompensationLongRetries == 1
    assert record.NotBefore == world.now + POLICY.long_delay
    by_step = {e.Step: e for e in record.Compensation}
    assert by_step[STEPS[1]].Outcome == "Pending"
    assert by_step[STEPS[1]].Error.startswith("unconfirmed")
    assert {by_step[s].Outcome for s in (STEPS[0], STEPS[2])} == {"Done"}
    assert "unconfirmed" in record.LastError
    # No verdict: neither a CompensationFailed status nor an alert.
    assert [s["Status"] for s in world.statuses()][-1] == "Compensating"
    assert "CompensationFailed" not in alerts(world)
    assert driver.writes()[-4:] == [
        "undo_done",  # STEPS[2], the declined one
        "undo_unconfirmed",  # STEPS[1]
        "undo_done",  # STEPS[0]
        "defer_compensation",
    ]


async def test_the_starter_restarts_it_after_its_long_retry_and_the_undo_gets_its_answer():
    world = World()
    first = await _first_attempt(world, lost)
    client = GoneClient()
    client.finished.add(first.instance_id)  # the deferred instance completed
    starter = world.starter()

    world.now += POLICY.long_delay - timedelta(seconds=1)
    report = await starter.run(client)
    assert (report.compensation_restarts, report.compensations_waiting) == (0, 1)
    assert (await world.record()).LockedBy == first.instance_id

    world.now += timedelta(seconds=2)
    report = await starter.run(client)
    assert report.compensation_restarts == 1
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATING
    assert record.NotBefore is None
    assert record.CompensationRestarts == 0  # a long retry is not a restart of a dead instance
    assert record.Attempt == 2
    assert record.LockedBy in client.started

    # The restart's input carries the payload its undo requests send.
    given = client.started[record.LockedBy]
    assert given == {"Payload": step_payload(world.orders.orders["webshop:A1"])}
    # The remote applied the refund during the outage; the fenced retry
    # (same key, a higher token) gets its original answer.
    retried = Driver(
        world, record.LockedBy, agent(lambda t: ("ok", {"Reference": "refund-1"})), input=given
    )
    assert await retried.run() == "completed", retried.error
    assert retried.output["Outcome"] == "compensated"
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATED
    assert all(e.Outcome == "Done" for e in record.Compensation)
    assert record.LastError is None
    # Only the unconfirmed step is tried again: 3 tries before, 1 after.
    tries = undo_tries(world, STEPS[1])
    assert tries[-1]["Payload"] == DEFAULT_CATALOG.part(STEPS[1], given["Payload"])
    assert [t["Attempt"] for t in tries] == [1, 1, 1, 2]
    assert len(undo_tries(world, STEPS[0])) == 1
    assert [s["Status"] for s in world.statuses()][-1] == "Compensated"
    assert "CompensationFailed" not in alerts(world)


async def test_a_refusal_still_ends_compensation_failed_at_once():
    world = World()
    driver = await _first_attempt(
        world, lambda t: ("permanent", "refund refused: charge disputed") if t == 0 else None
    )
    assert driver.output["Outcome"] == "compensation_failed"
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATION_FAILED
    assert record.NotBefore is None
    assert record.CompensationLongRetries == 0
    assert "charge disputed" in record.LastError
    assert "CompensationFailed" in alerts(world)


async def test_a_refusal_next_to_an_unconfirmed_undo_is_the_verdict():
    """One undo refused for good, another unconfirmed: CompensationFailed now,
    naming the refused step (an operator must act on it anyway)."""

    def answer(send):
        if send.Action == "do":
            return ("permanent", "card declined") if send.Step == STEPS[2] else ok(send)
        if send.Step == STEPS[2]:
            return None  # unconfirmed
        if send.Step == STEPS[0]:
            return ("permanent", "release refused: already shipped")
        return ok(send)

    world = World()
    instance_id, attempt_input = await world.fast_started()
    driver = Driver(world, instance_id, answer, input=attempt_input)
    assert await driver.run() == "completed", driver.error
    assert driver.output["Outcome"] == "compensation_failed"
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATION_FAILED
    assert f"step {STEPS[0]}" in record.LastError
    assert "already shipped" in record.LastError


async def test_the_long_retries_are_bounded_then_compensation_failed_with_its_alert():
    world = World(settings=replace(SETTINGS, retry=replace(POLICY, undo_long_retries=1)))
    first = await _first_attempt(world, lost)
    assert first.output["Outcome"] == "compensation_deferred"
    client = GoneClient()
    client.finished.add(first.instance_id)
    world.now += POLICY.long_delay + timedelta(seconds=1)
    await world.starter().run(client)
    record = await world.record()
    retried = Driver(world, record.LockedBy, agent(lost), input=None)
    assert await retried.run() == "completed", retried.error
    assert retried.output["Outcome"] == "compensation_failed"
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATION_FAILED
    assert "still unconfirmed after 1 long retries" in record.LastError
    assert record.LockedBy is None
    assert record.NotBefore is None
    assert alerts(world).count("CompensationFailed") == 1
    assert [s["Status"] for s in world.statuses()][-1] == "CompensationFailed"
