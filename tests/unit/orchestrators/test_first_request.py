"""The Starter sends an attempt's first request itself, once the attempt has
started (ADR 021l): the attempt only waits for that reply. Through the Durable
SDK's replay (tests/unit/orchestrators/driver.py) with the real Starter and
activities over in-memory fakes."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

from domain import state_machine as sm
from domain.models import ProcessState
from orchestrators.policy import StarterPolicy
from orchestrators.starter import Starter, StarterReport
from tests.builders import ReadClock
from tests.unit.orchestrators.driver import (
    POLICY,
    SETTINGS,
    STEPS,
    Driver,
    StartingClient,
    World,
    ok,
    requests,
)


def _sends(driver: Driver) -> list[str]:
    return [d["Step"] for n, d in driver.calls if n == "send_step"]


async def test_the_first_request_leaves_with_the_start_and_the_attempt_sends_the_rest():
    world = World()
    instance_id = await world.claimed()
    given = world.inputs[instance_id]
    assert given["Sent"] == STEPS[0]
    # Sent before the attempt ran a single episode.
    assert [(r["InstanceId"], r["Step"]) for r in requests(world)] == [(instance_id, STEPS[0])]
    driver = Driver(world, instance_id, ok)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    assert _sends(driver) == STEPS[1:]
    assert [r["Step"] for r in requests(world)] == STEPS


async def test_a_first_request_the_bus_refuses_leaves_the_attempt_to_its_deadline():
    """The start stands; the attempt waits for a reply that cannot come and
    ends at its deadline, as after a send whose answer was lost; the record
    keeps the deadline for the Supervisor."""
    world = World()
    real_send = world.bus.send

    async def refusing(queue, body, message_id, props=None):
        if queue == "agent-requests":
            raise ConnectionError("agent-requests: connection reset")
        await real_send(queue, body, message_id, props)

    world.bus.send = refusing
    record, etag = await world.submitted()
    report = StarterReport()
    client = StartingClient()
    instance_id = await world.starter().claim_and_start(client, record, etag, report=report)
    assert instance_id is not None
    assert report.started == [instance_id]
    assert report.first_sends_failed == 1
    world.bus.send = real_send
    driver = Driver(world, instance_id, ok, input=client.started[instance_id])
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "timed_out"
    assert driver.output["Step"] == STEPS[0]
    assert _sends(driver) == []  # the attempt never sends the Starter's step
    stored = await world.record()
    assert stored.LockedBy == instance_id
    assert stored.CompleteBy is not None


async def test_a_retry_after_a_done_step_has_the_starter_send_the_next_one():
    world = World()
    first_id = await world.claimed()
    first = Driver(world, first_id, lambda send: None if send.Step == STEPS[1] else ok(send))
    assert await first.run() == "completed"
    assert first.output["Outcome"] == "timed_out"
    # The first step's reply reached the attempt but its one write never ran:
    # mark it done as an earlier build's write would have, then retry.
    record, etag = await world.store.read("webshop:A1")
    record = sm.complete_step(record, first_id, STEPS[0], world.now, "ref-0")
    etag = await world.store.replace(record, etag)
    world.now = record.CompleteBy + POLICY.claim_timeout
    back = sm.recover_expired(record, record.LockedBy, world.now, POLICY)
    await world.store.replace(back, etag)
    _, etag = await world.store.read("webshop:A1")
    client = StartingClient()
    second = await world.starter().claim_and_start(client, back, etag)
    assert second is not None
    given = client.started[second]
    assert given["Sent"] == STEPS[1]
    driver = Driver(world, second, ok, input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    assert _sends(driver) == STEPS[2:]


async def test_an_inline_first_step_is_run_by_the_attempt_not_sent_by_the_starter():
    world = World(step_modes={STEPS[0]: "inline"}, inline_agent=_InlineOk())
    instance_id = await world.claimed()
    assert "Sent" not in world.inputs[instance_id]
    assert requests(world) == []
    driver = Driver(world, instance_id, ok)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    assert _sends(driver) == STEPS[1:]


async def test_a_starter_built_without_requests_leaves_every_request_to_the_attempt():
    world = World()
    starter = Starter(
        StarterPolicy.from_settings(world.settings, STEPS),
        world.store,
        clock=ReadClock(lambda: world.now),
        publisher=world.bus,
        orders=world.orders,
    )
    record, etag = await world.submitted()
    client = StartingClient()
    instance_id = await starter.claim_and_start(client, record, etag)
    assert instance_id is not None
    given = client.started[instance_id]
    assert "Sent" not in given
    assert requests(world) == []
    driver = Driver(world, instance_id, ok, input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    assert _sends(driver) == STEPS


async def test_a_sent_that_is_not_the_first_step_to_do_is_sent_by_the_attempt():
    """An input whose `Sent` names another step than the Starter sends (the
    first to do, a remote one) is not trusted to have been sent: the attempt
    sends every step, and duplicate detection drops a second copy."""
    world = World()
    instance_id = await world.claimed()
    given = json.loads(json.dumps(world.inputs[instance_id]))
    given["Sent"] = STEPS[1]
    world.bus.sent.clear()
    driver = Driver(world, instance_id, ok, input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    assert _sends(driver) == STEPS


class _FirstAnsweredTwice(Driver):
    """The Starter's request is answered twice, as for a duplicate delivery of
    it: a refusal, then a transient answer."""

    def _answer(self, send):
        if send.Step != STEPS[0] or send.Action != "do":
            return super()._answer(send)
        for answer in (
            ("permanent", "HTTP 402: declined", timedelta(milliseconds=100)),
            ("transient", "deadline reached; last error: HTTP 429", timedelta(milliseconds=200)),
        ):
            self.agent = lambda _send, answer=answer: answer
            super()._answer(send)
        self.agent = ok
        return None


async def test_replies_raised_while_the_processing_status_is_retried_wait_for_the_attempt():
    """An application with progress statuses whose reply queue refuses: the
    Processing status is tried again and again while both answers to the
    Starter's request arrive. The wait for that reply is open meanwhile, so
    the first answer, the refusal, is the one taken (the SDK keeps only the
    last same-named event raised while nothing waits: seed 54000465)."""
    world = World(settings=replace(SETTINGS, progress_apps=frozenset({"webshop"})))
    real_send = world.bus.send

    async def refusing(queue, body, message_id, props=None):
        if queue == "replies-webshop":
            raise PermissionError(f"send to {queue} refused: Unauthorized")
        await real_send(queue, body, message_id, props)

    world.bus.send = refusing
    instance_id = await world.claimed()
    driver = _FirstAnsweredTwice(world, instance_id, ok)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "failed"
    assert "HTTP 402" in driver.output["Detail"]
    assert (await world.record()).ProcessState is ProcessState.ERROR


class _InlineOk:
    """The agent library run in an activity, answering ok."""

    async def handle(self, request):
        from domain.models import AgentReply

        return AgentReply(
            InstanceId=request.InstanceId,
            OrderID=request.OrderID,
            Step=request.Step,
            Action=request.Action,
            Attempt=request.Attempt,
            AppId=request.AppId,
            EventName=request.ReplyEvent,
            EventId=f"{request.ReplyEvent}/inline",
            Outcome="ok",
            Result={"Reference": f"ref-{request.Step}"},
        )
