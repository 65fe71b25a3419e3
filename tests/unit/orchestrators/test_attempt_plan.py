"""The attempt its claim planned (ADR 021a), through the Durable SDK's
replay with the real activities over fakes (driver.py): one write on the
happy path, the attempt's one deadline everywhere, compensation of every step
the record shows as possibly sent, a retry that sends every step again under
the same idempotency keys, and progress statuses that never stop the work."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from domain import state_machine as sm
from domain.errors import TransientError
from domain.ids import app_tag
from domain.models import ProcessState, StepStatus
from domain.steps import DEFAULT_CATALOG
from orchestrators.contracts import AttemptStart, step_payload
from tests.fakes import CountingOrders, CountingStateStore, FakeIndex, FakeOrders
from tests.unit.orchestrators.driver import (
    POLICY,
    SETTINGS,
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


Driver = _Driver


async def test_the_claim_marks_every_step_running_until_the_attempts_one_deadline():
    world = World()
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
    world = World(store=CountingStateStore(), orders=CountingOrders())
    instance_id, given = await world.fast_started()
    replaces_before = world.store.requests.get("replace", 0)
    driver = Driver(world, instance_id, ok, input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    # The Starter sent the first step's request as it started the attempt (ADR 021l).
    assert given["Sent"] == STEPS[0]
    assert [n for n, _ in driver.calls] == ["send_step"] * (len(STEPS) - 1) + ["finish_attempt"]
    assert [(r["Step"], r["Action"]) for r in requests(world)] == [(n, "do") for n in STEPS]
    # The one finishing write (Processed, its status in the outbox), then the
    # status sent and the outbox cleared: never a status before its write lands.
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
    assert record.PendingStatus is None
    assert statuses(world) == ["Processed"]
    # The payload rode in every request's input: no activity reads the orders DB;
    # each carries its step's part (the fields its catalog entry names).
    payload = given["Payload"]
    sends = [d for n, d in driver.calls if n == "send_step"]
    assert [d["Payload"] for d in sends] == [
        DEFAULT_CATALOG.part(d["Step"], payload) for d in sends
    ]
    assert [r["Payload"] for r in requests(world)] == [
        DEFAULT_CATALOG.part(r["Step"], payload) for r in requests(world)
    ]
    assert "PaymentReference" not in requests(world)[0]["Payload"]
    assert world.orders.requests.get("read", 0) == 0


async def test_a_timer_claim_reads_the_order_once_and_no_activity_reads_it():
    """The Starter reads the payload once per claim it won (not per record
    it looked at) and puts it in the input; the steps, and the undos of a
    compensation begun on a decline, carry it from there."""
    world = World(orders=CountingOrders())
    instance_id = await world.claimed()
    assert world.orders.requests == {"create": 1, "read": 1}
    order = world.orders.orders["webshop:A1"]
    assert world.inputs[instance_id]["Payload"] == step_payload(order)
    record, etag = await world.store.read("webshop:A1")  # now claimed: not claimable
    assert await world.starter().claim_and_start(StartingClient(), record, etag) is None
    driver = Driver(world, instance_id, fail_step(STEPS[1]))
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "compensated"
    assert world.orders.requests == {"create": 1, "read": 1}
    sent = requests(world)
    assert [r["Action"] for r in sent] == ["do", "do", "undo", "undo"]
    assert all(r["Payload"] == DEFAULT_CATALOG.part(r["Step"], step_payload(order)) for r in sent)


async def test_a_claim_whose_order_read_fails_starts_and_its_requests_read_it():
    """A failed read neither loses nor holds up the claim: the attempt
    starts without the payload, and each of its requests reads it."""
    world = World(orders=_FailingFirstRead())
    instance_id = await world.claimed()
    assert "Payload" not in world.inputs[instance_id]
    assert (await world.record()).LockedBy == instance_id
    driver = Driver(world, instance_id, ok)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    order = world.orders.orders["webshop:A1"]
    assert [r["Payload"] for r in requests(world)] == [
        DEFAULT_CATALOG.part(step, step_payload(order)) for step in STEPS
    ]
    assert world.orders.reads == 1 + len(STEPS)


class _FailingFirstRead(FakeOrders):
    """The orders DB, its first read failing as an outage would."""

    reads = 0

    async def get(self, order_id):
        self.reads += 1
        if self.reads == 1:
            raise TransientError("orders DB unavailable")
        return await super().get(order_id)


async def test_the_finish_retires_the_attempts_index_entry():
    world = World(index=FakeIndex())
    instance_id, given = await world.fast_started()
    assert world.index.entries  # indexed at the attempt's deadline by the claim
    assert await Driver(world, instance_id, ok, input=given).run() == "completed"
    assert world.index.requests == {"add": 1, "discard": 1}
    assert world.index.entries == {}


async def test_a_decline_after_a_done_step_compensates_exactly_what_may_have_happened():
    world = World()
    instance_id, given = await world.fast_started()
    # Every step to do is fresh on a first claim: the input leaves that implied.
    assert "Fresh" not in given
    assert AttemptStart.of_instance(given, instance_id).Fresh == STEPS
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
    world = World()
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
    world = World()
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
    world = World()
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
    world = World()
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
    world = World()
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


class _SendAnswerLost(_Driver):
    """The send_step of the second step lands (its request leaves) and then
    fails on every try, as when the send's answer was lost and the link
    stayed down for the retries (the activity is idempotent: a retry sends
    again)."""

    async def _activity(self, name, data):
        result = await super()._activity(name, data)
        if name == "send_step" and data.get("Step") == STEPS[1]:
            raise ActivityFailure("sending to agent-requests: no answer in time")
        return result


async def test_a_refusal_to_a_step_whose_send_failed_after_leaving_still_ends_the_order():
    """The refusal of a request whose send_step failed (after the request
    left) still reaches this attempt: the order compensates now, and no later
    attempt asks the payment service again."""
    world = World()
    instance_id, given = await world.fast_started()
    driver = _SendAnswerLost(world, instance_id, fail_step(STEPS[1]), input=given)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "compensated"
    assert [r["Step"] for r in requests(world) if r["Action"] == "do"] == STEPS[:2]
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATED


class _AnsweredTwice(_Driver):
    """The request of `step` is answered twice, as for a duplicate delivery of it: a
    refusal, then a transient answer (the duplicate's calls were paced until the
    deadline). When the attempt sends it (send_step), the request leaves but the send
    fails on every try (its answer lost), so both replies arrive while the send is still
    being retried; when the Starter sent it (the first step, ADR 021l), both may arrive
    before the attempt's first episode."""

    def __init__(self, *args, step: str, **kwargs) -> None:
        self.step = step  # before the driver answers the Starter's request
        super().__init__(*args, **kwargs)

    async def _activity(self, name, data):
        result = await super()._activity(name, data)
        if name == "send_step" and data.get("Step") == self.step:
            raise ActivityFailure("sending to agent-requests: no answer in time")
        return result

    def _answer(self, send):
        if send.Step != self.step or send.Action != "do":
            return super()._answer(send)
        answers = [
            ("permanent", "HTTP 402: declined", timedelta(milliseconds=100)),
            ("transient", "deadline reached; last error: HTTP 429", timedelta(milliseconds=200)),
        ]
        for answer in answers:
            self.agent = lambda _send, answer=answer: answer
            super()._answer(send)
        self.agent = ok
        return None


@pytest.mark.parametrize(
    ("step", "outcome", "state"),
    [
        (STEPS[0], "failed", ProcessState.ERROR),
        (STEPS[1], "compensated", ProcessState.COMPENSATED),
    ],
    ids=["sent-by-the-starter", "sent-by-the-attempt"],
)
async def test_the_first_of_two_replies_is_the_one_taken(step, outcome, state):
    """Scale seed 54000465: the Durable Python SDK keeps only the last same-named event
    raised while no task waits for it, so an attempt that opened its reply's wait only
    after the send took the later transient answer, timed out, and a second attempt asked
    the service again for an answer already refused. The wait is open during the send,
    and for the Starter's request from the attempt's first episode: the refusal, the
    first reply, ends the order now."""
    world = World()
    instance_id, given = await world.fast_started()
    driver = _AnsweredTwice(world, instance_id, ok, input=given, step=step)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == outcome
    assert (await world.record()).ProcessState is state
    # No later attempt: nobody asks the service again for an answer already refused.
    assert {r["InstanceId"] for r in requests(world)} == {instance_id}


def _refusing(world, refused):
    """The bus refuses every send whose message id `refused(message_id)`
    names, for good (a reply queue disabled, deleted, or its role gone)."""
    real_send = world.bus.send

    async def send(queue, body, message_id, props=None):
        if refused(queue, message_id):
            raise PermissionError(f"send to {queue} refused: Unauthorized")
        await real_send(queue, body, message_id, props)

    world.bus.send = send


async def test_a_processed_status_the_reply_queue_refuses_waits_in_the_outbox():
    """The status goes first only when it can: refused, the finishing write
    keeps it in the outbox (for the Starter) and the order is Processed."""
    world = World()
    _refusing(world, lambda queue, mid: "/status/Processed" in mid)
    driver = Driver(world, await world.claimed(), ok)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "unconfirmed"  # the status is not out yet
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSED
    assert record.PendingStatus is not None
    assert record.PendingStatus.Status.value == "Processed"


async def test_progress_statuses_come_without_a_write_of_their_own():
    world = World(settings=replace(SETTINGS, progress_apps=frozenset({"webshop"})))
    driver = Driver(world, await world.claimed(), ok)
    assert await driver.run() == "completed"
    assert statuses(world) == ["Processing", *(["StepCompleted"] * len(STEPS)), "Processed"]
    assert [n for n, _ in driver.calls if n in ("write_state", "finish_attempt")] == [
        "finish_attempt"
    ]


async def test_a_reply_queue_that_refuses_for_good_does_not_stop_a_progress_attempt():
    """Progress statuses are best effort: a permanent refusal of the
    application's reply queue leaves every step to run (issue 43, item 3)."""
    world = World(settings=replace(SETTINGS, progress_apps=frozenset({"webshop"})))
    _refusing(
        world, lambda queue, mid: queue == "replies-webshop" and "/status/Processed" not in mid
    )
    driver = Driver(world, await world.claimed(), ok)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    assert [r["Step"] for r in requests(world)] == STEPS
    assert (await world.record()).ProcessState is ProcessState.PROCESSED


async def test_a_reply_queue_that_refuses_for_good_does_not_stop_a_compensation():
    """The Compensating status is best effort: every undo is still sent, and
    the terminal status waits in the outbox (issue 43, item 2)."""
    world = World()
    _refusing(world, lambda queue, mid: queue == "replies-webshop")
    driver = Driver(world, await world.claimed(), fail_step(STEPS[1]))
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "compensated"
    # The refused step and the one done before it; the shipment was never sent.
    assert [r["Step"] for r in requests(world) if r["Action"] == "undo"] == [STEPS[1], STEPS[0]]
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATED
    assert record.PendingStatus is not None
    assert record.PendingStatus.Status.value == "Compensated"


async def test_an_etag_changed_by_another_writer_is_re_read_and_the_write_still_lands():
    """A precondition failure while this attempt still owns the record (here
    a write that changes nothing of the protocol) is re-read and decided:
    the finishing write is applied to the fresh version."""
    world = World()
    instance_id = await world.claimed()

    async def before(name, data):
        if name == "finish_attempt":
            record, etag = await world.store.read("webshop:A1")
            await world.store.replace(record.model_copy(update={"UpdatedAt": world.now}), etag)

    driver = Driver(world, instance_id, ok, before_activity=before)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    assert statuses(world) == ["Processed"]


async def test_the_fast_path_and_the_timer_starter_never_both_claim():
    world = World()
    record, etag = await world.submitted()
    timer_client, fast_client = StartingClient(), StartingClient()
    report = await world.starter().run(timer_client)
    fast = await world.starter().start_submitted(fast_client, record, etag)
    assert report.claimed == 1
    assert fast is None
    assert list(timer_client.started) == ["webshop:A1:1"]
    assert fast_client.started == {}
    assert (await world.record()).Attempt == 1


async def test_the_fast_path_respects_the_processing_cap_the_last_run_saw():
    world = World(settings=replace(SETTINGS, max_processing=1))
    await world.fast_started("A0")
    starter = world.starter()
    await starter.run(StartingClient())  # measures Processing = 1: at the cap
    record, etag = await world.submitted("A2")
    assert await starter.start_submitted(StartingClient(), record, etag) is None
    assert (await world.record("A2")).ProcessState is ProcessState.PENDING


async def test_the_input_leaves_out_the_app_and_reply_queue_its_order_key_names():
    """The history holds the input encoded twice: an AppId the order key
    names in full (domain.ids.app_of_key) and the reply queue named after it
    are left out and put back from the instance id; a queue of another name,
    or an AppId the key shortens, stays. Requests name the app all the same."""
    world = World()
    instance_id, given = await world.fast_started()
    assert "AppId" not in given["Plan"]
    assert "ReplyTo" not in given["Plan"]
    whole = AttemptStart.of_instance(given, instance_id).Plan
    assert whole is not None
    assert (whole.AppId, whole.ReplyTo) == ("webshop", "replies-webshop")
    assert await Driver(world, instance_id, ok, input=given).run() == "completed"
    assert {r["AppId"] for r in requests(world)} == {"webshop"}

    other = whole.model_copy(update={"ReplyTo": "replies-webshop-eu"})
    kept = AttemptStart(Plan=other).dump()["Plan"]
    assert kept["ReplyTo"] == "replies-webshop-eu"
    assert "AppId" not in kept
    assert AttemptStart.of_instance({"Plan": kept}, instance_id).Plan.ReplyTo == (
        "replies-webshop-eu"
    )
    long_app = "a-long-application-name"
    key = f"{app_tag(long_app)}:A1"
    shortened = whole.model_copy(
        update={"AppId": long_app, "OrderID": key, "ReplyTo": f"replies-{long_app}"}
    )
    dumped = AttemptStart(Plan=shortened).dump()["Plan"]
    assert dumped["AppId"] == long_app
    assert dumped["ReplyTo"] == f"replies-{long_app}"
