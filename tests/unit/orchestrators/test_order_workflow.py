"""`order_workflow` through the Durable SDK's replay, its failure and
compensation branches, with the real activities over fakes
(tests/unit/orchestrators/driver.py); the claim-planned attempt's own
properties are in test_attempt_plan.py."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from domain import state_machine as sm
from domain.models import OperatorAlert, ProcessState, StepStatus
from orchestrators.starter import Starter
from tests.builders import ReadClock, start_step
from tests.unit.orchestrators.driver import POLICY, SETTINGS, World
from tests.unit.orchestrators.driver import Driver as _Driver

Driver = _Driver


# What an agent can put in a reply (JSON: no lone surrogates); the state
# machine tests cover those.
LONG_UNICODE = ("Karte abgelehnt \u2014 \u4e0d\u8db3 \U0001f4b3 \x00\u200b\n" * 120)[:4096]


def ok(send):
    return ("ok", {"Reference": f"ref-{send.Step}-{send.Action}"})


def fail_step(step, outcome="permanent", error="card declined", undo=ok):
    def agent(send):
        if send.Action == "undo":
            return undo(send)
        if send.Step == step:
            return (outcome, error)
        return ok(send)

    return agent


def requests(world):
    return [json.loads(body) for body, _ in world.sent("agent-requests")]


def alerts(world):
    return [OperatorAlert.model_validate_json(body) for body, _ in world.sent("alerts")]


async def test_timer_first_leaves_the_record_to_the_supervisor():
    world = World()
    driver = Driver(world, await world.claimed(), lambda s: None)
    await driver.run()
    assert driver.output == {
        "Outcome": "timed_out",
        "Step": "reserve-inventory",
        "Detail": "deadline passed",
    }
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSING
    assert record.Steps["reserve-inventory"].Status is StepStatus.RUNNING


async def test_transient_reply_reason_is_kept_for_the_supervisor():
    """Defect 10: a transient reply's reason reaches LastError and the
    Supervisor's retry reason."""
    world = World()
    driver = Driver(
        world, await world.claimed(), fail_step("reserve-inventory", "transient", "inventory 503")
    )
    await driver.run()
    assert driver.output["Outcome"] == "timed_out"
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSING
    assert "inventory 503" in record.LastError
    later = record.CompleteBy + timedelta(seconds=10)
    recovered = sm.recover_expired(record, record.LockedBy, later, POLICY)
    assert "inventory 503" in recovered.LastError


async def test_permanent_failure_without_completed_steps_is_error_once():
    """Defect 3: a 4 KB Unicode provider message: Error at once, one request,
    an alert and a Failed status, no orchestration failure for the
    Supervisor to retry."""
    world = World()
    driver = Driver(
        world, await world.claimed(), fail_step("reserve-inventory", error=LONG_UNICODE[:500])
    )
    assert await driver.run() == "completed", driver.error
    assert driver.output["Outcome"] == "failed"
    record = await world.record()
    assert record.ProcessState is ProcessState.ERROR
    assert record.PendingStatus is None
    assert record.LastError.startswith("step reserve-inventory failed: Karte abgelehnt")
    assert len(requests(world)) == 1
    assert [a.Kind for a in alerts(world)] == ["OrderError"]
    assert world.statuses()[-1]["Status"] == "Failed"


@pytest.mark.parametrize("length", [0, 1, 221, 300, 499, 500])
async def test_provider_messages_of_any_length_end_in_compensation(length):
    """Defect 3: whatever the length, the Compensating write lands and the
    order ends Compensated (not a failed orchestration the Supervisor retries)."""
    world = World()
    error = LONG_UNICODE[:length] or "x"
    driver = Driver(world, await world.claimed(), fail_step("charge-payment", error=error))
    assert await driver.run() == "completed", driver.error
    assert driver.output["Outcome"] == "compensated"
    assert [r["Step"] for r in requests(world) if r["Action"] == "do"] == [
        "reserve-inventory",
        "charge-payment",
    ]


async def test_permanent_failure_after_completed_steps_undoes_every_sent_step():
    """Defect 2: the failed step's request was sent, so it is undone too
    (undo of what never happened is a no-op by the agent contract)."""
    world = World()
    driver = Driver(world, await world.claimed(), fail_step("arrange-shipment"))
    await driver.run()
    assert driver.output["Outcome"] == "compensated"
    undone = [r["Step"] for r in requests(world) if r["Action"] == "undo"]
    assert undone == ["arrange-shipment", "charge-payment", "reserve-inventory"]
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATED
    assert {e.Step: e.Outcome for e in record.Compensation} == {
        "reserve-inventory": "Done",
        "charge-payment": "Done",
        "arrange-shipment": "Done",
    }
    assert world.statuses()[-1]["Status"] == "Compensated"


async def test_operator_compensation_undoes_running_steps_of_an_errored_order():
    """Defect 2: the Supervisor gave up on an attempt whose payment request
    was sent (step Running); compensation must refund it."""
    world = World()
    iid = await world.claimed()
    t = world.now
    await world.store.update(
        "webshop:A1",
        lambda r: start_step(
            sm.complete_step(
                start_step(r, "reserve-inventory", t, t + timedelta(minutes=1)),
                iid,
                "reserve-inventory",
                t,
                "ref-1",
            ),
            "charge-payment",
            t,
            t + timedelta(minutes=1),
        ),
        iid,
    )
    policy = sm.RetryPolicy(threshold=1, long_retries=0)
    await world.store.update(
        "webshop:A1", lambda r: sm.recover_expired(r, iid, t + timedelta(minutes=5), policy), iid
    )
    await world.store.update("webshop:A1", lambda r: sm.request_compensation(r, t), sm_any())
    claimed, _ = await world.store.update(
        "webshop:A1", lambda r: sm.claim_compensation(r, t), sm_any()
    )
    driver = Driver(world, claimed.LockedBy, ok)
    await driver.run()
    assert driver.output["Outcome"] == "compensated"
    # The claim marked every step possibly sent: the shipment, never sent,
    # is undone too (a no-op by the agent contract: undoing too much is safe).
    assert [r["Step"] for r in requests(world) if r["Action"] == "undo"] == [
        "arrange-shipment",
        "charge-payment",
        "reserve-inventory",
    ]


def sm_any():
    from adapters.ports import ANY_OWNER

    return ANY_OWNER


async def test_compensation_that_partly_fails_ends_compensation_failed_with_alert():
    world = World()

    def undo(send):
        return ("permanent", "refund refused") if send.Step == "reserve-inventory" else ok(send)

    driver = Driver(world, await world.claimed(), fail_step("charge-payment", undo=undo))
    await driver.run()
    assert driver.output["Outcome"] == "compensation_failed"
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATION_FAILED
    assert {e.Step: e.Outcome for e in record.Compensation} == {
        "reserve-inventory": "Failed",
        "charge-payment": "Done",
    }
    assert [a.Kind for a in alerts(world)] == ["CompensationFailed"]
    assert world.statuses()[-1]["Status"] == "CompensationFailed"


class Client:
    """The Durable client the Starter talks to: instances it starts are run by
    `make_driver`; their runtime status is the driver's outcome."""

    def __init__(self, world, make_driver):
        self.world, self.make_driver, self.drivers = world, make_driver, {}

    async def start_new(self, name, instance_id, data):
        driver = self.make_driver(instance_id)
        self.drivers[instance_id] = driver
        await driver.run()

    async def get_status(self, instance_id):
        driver = self.drivers.get(instance_id)
        if driver is None:
            return None
        name = "Completed" if driver.outcome == "completed" else "Failed"
        return type("Status", (), {"runtime_status": type("R", (), {"name": name})()})()


def compensation_agent(send):
    return (
        ("permanent", "declined")
        if send.Step == "charge-payment" and send.Action == "do"
        else ok(send)
    )


async def _dying_compensation(world):
    """An order whose compensation instance dies after sending its first undo
    (every write after it fails): the record stays Compensating."""
    iid = await world.claimed()
    kinds = []

    def remember(name, data):
        if name == "write_state":
            kinds.append(data["Kind"])

    def fail(name, call):
        return name == "write_state" and kinds and kinds[-1] in ("undo_done", "undo_failed")

    first = Driver(world, iid, compensation_agent, fail=fail, before_activity=remember)
    assert await first.run() == "failed"
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATING
    assert record.LockedBy == iid
    return first


async def test_restarted_compensation_sends_new_message_ids_and_finishes():
    """Defect 8: the restart is a new attempt; its undo requests are not
    dropped as duplicates of the dead instance's, and the order ends
    Compensated (not a false CompensationFailed after waiting out deadlines)."""
    world = World()
    first = await _dying_compensation(world)
    client = Client(world, lambda iid: Driver(world, iid, compensation_agent))
    client.drivers[first.instance_id] = first
    starter = Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now))
    await starter.run(client)
    (restarted,) = [iid for iid in client.drivers if iid != first.instance_id]
    assert restarted == "webshop:A1:2"
    assert client.drivers[restarted].output["Outcome"] == "compensated"
    assert (await world.record()).ProcessState is ProcessState.COMPENSATED
    undo_ids = [
        mid for body, mid in world.sent("agent-requests") if json.loads(body)["Action"] == "undo"
    ]
    assert len(undo_ids) == len(set(undo_ids)) == 3  # 1 by the dead instance, 2 by the restart


async def _keeps_dying(world, settings):
    """Four Starter runs over a compensation whose every instance dies at
    its first undo write, with a restart budget of 2."""
    first = await _dying_compensation(world)

    def dying(iid):
        kinds = []
        return Driver(
            world,
            iid,
            compensation_agent,
            before_activity=lambda n, d: kinds.append(d["Kind"]) if n == "write_state" else None,
            fail=lambda n, c: n == "write_state" and bool(kinds) and kinds[-1].startswith("undo"),
        )

    client = Client(world, dying)
    client.drivers[first.instance_id] = first
    starter = Starter(
        settings,
        world.store,
        clock=ReadClock(lambda: world.now),
        publisher=world.bus,
        max_compensation_restarts=2,
    )
    return [await starter.run(client) for _ in range(4)]


async def test_compensation_restarts_have_a_budget_then_a_long_retry():
    """Defect 8 / note item 4: a compensation that keeps dying is not
    restarted forever; once its restarts are spent it waits a long retry
    (ADR 019e: a dying instance says nothing about the undos it did not
    reach), without an alert or a status."""
    world = World()
    reports = await _keeps_dying(world, SETTINGS)
    assert [r.compensation_restarts for r in reports] == [1, 1, 0, 0]
    assert [r.compensations_given_up for r in reports] == [0, 0, 0, 0]
    assert [r.compensations_waiting for r in reports] == [0, 0, 1, 1]
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATING
    assert record.NotBefore == world.now + SETTINGS.retry.long_delay
    assert record.CompensationLongRetries == 1
    assert record.CompensationRestarts == 0
    assert alerts(world) == []


async def test_compensation_restarts_end_in_an_alert_once_the_long_retries_are_spent():
    """With no long retry left, the spent restart budget is the verdict:
    CompensationFailed, an alert and its status."""
    world = World()
    spent = replace(SETTINGS, retry=replace(SETTINGS.retry, undo_long_retries=0))
    reports = await _keeps_dying(world, spent)
    assert [r.compensation_restarts for r in reports] == [1, 1, 0, 0]
    assert [r.compensations_given_up for r in reports] == [0, 0, 1, 0]
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATION_FAILED
    assert record.PendingStatus is None
    assert [a.Kind for a in alerts(world)] == ["CompensationFailed"]
    assert world.statuses()[-1]["Status"] == "CompensationFailed"


async def test_terminal_status_send_failure_is_delivered_later_by_the_starter():
    """Defect 6: every try of the Processed send fails; the orchestration
    still finishes, the status stays in the outbox, and the Starter sends it
    with the same message id."""
    world = World()
    real_send = world.bus.send

    async def flaky(queue, body, message_id, props=None):
        if queue == "replies-webshop" and "/status/Processed" in message_id:
            raise ConnectionError("reply queue unavailable")
        await real_send(queue, body, message_id, props)

    world.bus.send = flaky
    driver = Driver(world, await world.claimed(), ok)
    assert await driver.run() == "completed"
    # The finishing write landed; only its status is unconfirmed.
    assert driver.output["Outcome"] == "unconfirmed"
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSED
    assert record.PendingStatus is not None
    assert record.PendingStatus.Status.value == "Processed"
    message_id = record.PendingStatus.MessageId

    world.bus.send = real_send
    world.now += timedelta(minutes=1)
    starter = Starter(
        SETTINGS, world.store, clock=ReadClock(lambda: world.now), publisher=world.bus
    )
    report = await starter.run(Client(world, lambda iid: None))
    assert report.statuses_delivered == 1
    assert [mid for _, mid in world.sent("replies-webshop")][-1] == message_id
    assert (await world.record()).PendingStatus is None
    assert world.statuses()[-1]["Status"] == "Processed"


async def test_activity_retries_ride_out_brief_failures():
    world = World()
    driver = Driver(
        world,
        await world.claimed(),
        ok,
        fail=lambda name, call: name == "write_state" and call in (0, 1),
    )
    await driver.run()
    assert driver.output["Outcome"] == "processed"
