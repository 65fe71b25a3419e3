"""Workflow 2.4 on a record its claim marked (ADR 021a), through the Durable
SDK's replay with the real activities over fakes (driver.py): one write on
the happy path, the attempt's one deadline everywhere, compensation of every
step the record shows as possibly sent, a retry that sends every step again
under the same idempotency keys, and the 2.3 path when the claim marked nothing."""

from __future__ import annotations

import json
from datetime import datetime

from domain import state_machine as sm
from domain.models import ProcessState, StepStatus
from orchestrators import order_workflow as wf
from tests.fakes import CountingOrders, CountingStateStore, FakeIndex
from tests.unit.orchestrators.driver import (
    POLICY,
    STEPS,
    TIMER_CREATED,
    ActivityFailure,
    StartingClient,
    World,
    fail_step,
    ok,
    requests,
    statuses,
)
from tests.unit.orchestrators.driver import Driver as _Driver


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def Driver(world, instance_id, agent, **kw):  # noqa: N802 (the driver's class, on 2.4)
    return _Driver(world, instance_id, agent, version="2.4", **kw)


def test_2_4_is_the_live_version():
    with open("host.json") as f:
        host = json.load(f)
    assert host["extensions"]["durableTask"]["defaultVersion"] == wf.CURRENT_VERSION == "2.4"
    assert set(wf.VERSIONS) == {"1.0", "1.1", "2.0", "2.1", "2.2", "2.3", "2.4"}


async def test_the_claim_marks_every_step_running_until_the_attempts_one_deadline():
    world = World(marking=True)
    _instance_id, given = await world.fast_started()
    record = await world.record()
    deadline = world.now + len(STEPS) * world.settings.step_timeout
    assert record.ProcessState is ProcessState.PROCESSING
    assert record.CompleteBy == deadline
    assert {n: (s.Status, s.Attempt, s.CompleteBy) for n, s in record.Steps.items()} == {
        n: (StepStatus.RUNNING, 1, deadline) for n in STEPS
    }
    assert at(given["Deadline"]) == deadline
    assert [s["Name"] for s in given["Plan"]["Steps"]] == STEPS
    assert "IndexedAt" not in given or given["IndexedAt"] is None  # the entry is at the deadline


async def test_the_happy_path_writes_the_record_once_after_the_claim():
    world = World(marking=True, store=CountingStateStore(), orders=CountingOrders())
    instance_id, given = await world.fast_started()
    replaces_before = world.store.requests.get("replace", 0)
    driver = Driver(world, instance_id, ok, input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    assert [n for n, _ in driver.calls] == ["send_step"] * len(STEPS) + ["finish_attempt"]
    # The one write (Processed, outbox filled) and the outbox clear after the send.
    assert world.store.requests["replace"] - replaces_before == 2
    # Every request, the one timer and the record carry the attempt's one deadline.
    deadlines = {r["Deadline"] for r in requests(world)}
    assert deadlines == {given["Deadline"]}
    timers = [e["FireAt"] for e in driver.history if e["EventType"] == TIMER_CREATED]
    assert [at(t) for t in timers] == [at(given["Deadline"])]
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSED
    assert [record.Steps[n].Reference for n in STEPS] == [f"ref-{n}-do" for n in STEPS]
    assert [e.Step for e in record.Compensation] == STEPS
    assert statuses(world) == ["Processed"]
    # The payload rode in the first request's input only; the others were kept.
    payloads = [d.get("Payload") for n, d in driver.calls if n == "send_step"]
    assert payloads[0]
    assert not any(payloads[1:])
    assert all(r["Payload"] == payloads[0] for r in requests(world))


async def test_the_finish_retires_the_attempts_index_entry():
    world = World(marking=True, index=FakeIndex())
    instance_id, given = await world.fast_started()
    assert world.index.entries  # indexed at the attempt's deadline by the claim
    assert await Driver(world, instance_id, ok, input=given).run() == "completed"
    assert world.index.requests == {"add": 1, "discard": 1}
    assert world.index.entries == {}


async def test_a_decline_after_a_done_step_compensates_exactly_what_may_have_happened():
    world = World(marking=True)
    instance_id, given = await world.fast_started()
    assert given["Fresh"] == STEPS
    driver = Driver(world, instance_id, fail_step(STEPS[1]), input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "compensated"
    undone = [r["Step"] for r in requests(world) if r["Action"] == "undo"]
    # The failed step (its request was sent), then the done one; the step
    # after them, which the claim marked but no attempt sent, is NotStarted
    # again and not undone.
    assert undone == [STEPS[1], STEPS[0]]
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATED
    assert record.Steps[STEPS[0]].Reference == f"ref-{STEPS[0]}-do"
    assert record.Steps[STEPS[2]].Status is StepStatus.NOT_STARTED
    assert [e.Step for e in record.Compensation] == [STEPS[0], STEPS[1]]


async def test_a_step_an_earlier_attempt_may_have_sent_is_undone_on_a_later_decline():
    world = World(marking=True)
    instance_id, given = await world.fast_started()
    # Attempt 1 hears nothing from step 1: every step stays marked by its claim.
    first = Driver(world, instance_id, lambda send: None, input=given)
    assert await first.run() == "completed"
    record, etag = await world.store.read("webshop:A1")
    world.now = record.CompleteBy + POLICY.claim_timeout
    await world.store.replace(sm.recover_expired(record, record.LockedBy, world.now, POLICY), etag)
    back, etag = await world.store.read("webshop:A1")
    client = StartingClient()
    second = await world.starter().start_submitted(client, back, etag)
    given2 = client.started[second]
    assert given2["Fresh"] == []  # attempt 1's claim marked them all
    driver = Driver(world, second, fail_step(STEPS[1]), input=given2)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "compensated"
    undone = [r["Step"] for r in requests(world) if r["Action"] == "undo"]
    # Attempt 1 may have sent step 3 for all the record knows: undone too
    # (a no-op by the agent contract), latest first.
    assert undone == list(reversed(STEPS))


async def test_a_decline_of_the_first_step_fails_the_order_outright():
    world = World(marking=True)
    instance_id, given = await world.fast_started()
    driver = Driver(world, instance_id, fail_step(STEPS[0]), input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "failed"
    record = await world.record()
    assert record.ProcessState is ProcessState.ERROR
    assert record.Steps[STEPS[0]].Status is StepStatus.FAILED
    assert {record.Steps[n].Status for n in STEPS[1:]} == {StepStatus.NOT_STARTED}
    assert statuses(world) == ["Failed"]
    assert [json.loads(b)["Kind"] for b, _ in world.sent("alerts")] == ["OrderError"]


async def test_timer_first_leaves_the_marked_record_to_the_supervisor():
    world = World(marking=True)
    instance_id, given = await world.fast_started()
    driver = Driver(
        world, instance_id, lambda send: None if send.Step == STEPS[1] else ok(send), input=given
    )
    assert await driver.run() == "completed"
    assert driver.output == {"Outcome": "timed_out", "Step": STEPS[1], "Detail": "deadline passed"}
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSING
    assert record.LockedBy == instance_id
    assert record.CompleteBy == at(given["Deadline"])
    # No step write: every step still shows as possibly sent.
    assert {s.Status for s in record.Steps.values()} == {StepStatus.RUNNING}


async def test_a_retry_sends_every_step_again_under_the_same_idempotency_keys():
    world = World(marking=True)
    instance_id, given = await world.fast_started()
    first = Driver(
        world, instance_id, lambda send: None if send.Step == STEPS[2] else ok(send), input=given
    )
    assert await first.run() == "completed"
    record, etag = await world.store.read("webshop:A1")
    world.now = record.CompleteBy + POLICY.claim_timeout
    back = sm.recover_expired(record, record.LockedBy, world.now, POLICY)
    await world.store.replace(back, etag)
    _, etag = await world.store.read("webshop:A1")
    client = StartingClient()
    second = await world.starter().start_submitted(client, back, etag)
    assert second is not None
    assert second.endswith(":2")
    driver = Driver(world, second, ok, input=client.started[second])
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    sent = requests(world)
    assert [r["Step"] for r in sent] == STEPS[:3] + STEPS
    keys = {r["Step"]: set() for r in sent}
    for r in sent:
        keys[r["Step"]].add(r["IdempotencyKey"])
    assert all(len(k) == 1 for k in keys.values())
    assert (await world.record()).ProcessState is ProcessState.PROCESSED


async def test_a_stale_attempt_cannot_finish():
    world = World(marking=True)
    instance_id, given = await world.fast_started()

    async def recovered_meanwhile(name, data):
        record, etag = await world.store.read("webshop:A1")
        if name == "finish_attempt" and record.LockedBy == instance_id:
            later = record.CompleteBy + POLICY.claim_timeout
            back = sm.recover_expired(record, record.LockedBy, later, POLICY)
            await world.store.replace(back, etag)

    driver = Driver(world, instance_id, ok, input=given, before_activity=recovered_meanwhile)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "stale"
    record = await world.record()
    assert record.ProcessState is ProcessState.PENDING
    assert statuses(world) == []


async def test_without_a_plan_in_its_input_2_4_runs_2_3s_begin_and_step_writes():
    world = World()  # a claimer that marks nothing (an older build's)
    instance_id, given = await world.fast_started()
    assert "Plan" not in given
    assert "Deadline" not in given
    driver = Driver(world, instance_id, ok, input=given)
    assert await driver.run() == "completed"
    assert [n for n, _ in driver.calls] == ["begin_attempt"] + ["advance_attempt"] * 3
    assert (await world.record()).ProcessState is ProcessState.PROCESSED


class _AnswerLost(_Driver):
    """2.4 whose activity call matching `lost(name, data)` lands (its write,
    its request) and then fails on every try, as after sends whose answers
    were lost (the activities are idempotent: a retry sends again)."""

    lost = staticmethod(lambda name, data: False)

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, version="2.4", **kw)

    async def _activity(self, name, data):
        result = await super()._activity(name, data)
        if self.lost(name, data):
            raise ActivityFailure("sending to agent-requests: no answer in time")
        return result


class _AdvanceAnswerLost(_AnswerLost):
    """The advance_attempt starting the second step (2.3's path)."""

    lost = staticmethod(
        lambda name, data: name == "advance_attempt" and data.get("Start") == STEPS[1]
    )


async def test_a_refusal_to_a_step_whose_sending_write_failed_still_ends_the_order():
    """Simulation seed 5000003 (50 orders): on the 2.3 path the write that
    sent the charge failed after the request left; the decline came back, was
    unheard, and attempt 2 charged the card again. The reply still counts."""
    world = World()  # no marks: 2.3's begin and step writes
    instance_id, given = await world.fast_started()
    driver = _AdvanceAnswerLost(world, instance_id, fail_step(STEPS[1]), input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "compensated"
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATED
    assert [r["Step"] for r in requests(world) if r["Action"] == "do"] == STEPS[:2]


async def test_an_answer_to_a_step_whose_sending_write_failed_leaves_the_attempt_to_the_supervisor():
    world = World()
    instance_id, given = await world.fast_started()
    driver = _AdvanceAnswerLost(world, instance_id, ok, input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "unconfirmed"
    record = await world.record()
    # The write landed: the step before is done, this one Running until its deadline.
    assert record.ProcessState is ProcessState.PROCESSING
    assert record.Steps[STEPS[0]].Status is StepStatus.COMPLETED
    assert record.Steps[STEPS[1]].Status is StepStatus.RUNNING
    assert record.CompleteBy == record.Steps[STEPS[1]].CompleteBy


class _BeginAnswerLost(_AnswerLost):
    """The begin_attempt (its write and the first step's request; simulation
    seed 3005838)."""

    lost = staticmethod(lambda name, data: name == "begin_attempt")


async def test_a_refusal_to_the_first_step_whose_beginning_write_failed_still_ends_the_order():
    """Simulation seed 3005838 (3 orders): begin_attempt failed three times,
    its write and its request having landed; the inventory service refused,
    the refusal was unheard, and attempt 2 asked again. The reply counts."""
    world = World()  # no marks: 2.3's begin and step writes
    instance_id, given = await world.fast_started()
    driver = _BeginAnswerLost(world, instance_id, fail_step(STEPS[0]), input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "failed"
    record = await world.record()
    assert record.ProcessState is ProcessState.ERROR
    assert [r["Step"] for r in requests(world) if r["Action"] == "do"] == STEPS[:1]
    assert statuses(world)[-1] == "Failed"


async def test_an_answer_to_the_first_step_whose_beginning_write_failed_leaves_the_attempt_to_the_supervisor():
    world = World()
    instance_id, given = await world.fast_started()
    driver = _BeginAnswerLost(world, instance_id, ok, input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "unconfirmed"
    assert [n for n, _ in driver.calls][-1] == "load_plan"
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSING
    assert record.Steps[STEPS[0]].Status is StepStatus.RUNNING
    assert record.CompleteBy == record.Steps[STEPS[0]].CompleteBy


async def test_a_begin_that_failed_and_a_record_that_cannot_be_read_fail_the_attempt_as_before():
    world = World()
    instance_id, given = await world.fast_started()

    class _Unreadable(_BeginAnswerLost):
        async def _activity(self, name, data):
            if name == "load_plan":
                self.calls.append((name, data))
                raise ActivityFailure("read state: Cosmos DB answered 503")
            return await super()._activity(name, data)

    driver = _Unreadable(world, instance_id, ok, input=given)
    assert await driver.run() == "failed"
    assert "no answer in time" in (driver.error or "")
    assert [n for n, _ in driver.calls][-1] == "load_plan"


class _SendAnswerLost(_AnswerLost):
    """On a marked record, the send_step of the second step, as when the
    send's answer was lost and the link stayed down for the retries
    (simulation seed 100510)."""

    lost = staticmethod(lambda name, data: name == "send_step" and data.get("Step") == STEPS[1])


async def test_a_refusal_to_a_step_whose_send_failed_after_leaving_still_ends_the_order():
    """The refusal of a request whose send_step failed (after the request
    left) still reaches this attempt: the order compensates now, and no later
    attempt asks the payment service again."""
    world = World(marking=True)
    instance_id, given = await world.fast_started()
    driver = _SendAnswerLost(world, instance_id, fail_step(STEPS[1]), input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "compensated"
    assert [r["Step"] for r in requests(world) if r["Action"] == "do"] == STEPS[:2]
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATED
