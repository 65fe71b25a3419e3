"""Workflow 2.0 through the Durable SDK's replay with the real activities over
fakes (tests/unit/orchestrators/driver.py): the cost of an order (counted,
deterministic), and every guarantee of 1.1 kept at that cost."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from adapters.ports import ANY_OWNER
from domain import state_machine as sm
from domain.models import OperatorAlert, ProcessState, StepStatus
from orchestrators import order_workflow as wf
from orchestrators.starter import Starter
from tests.builders import ReadClock
from tests.fakes import CountingOrders, CountingStateStore, FakeIndex
from tests.unit.orchestrators.driver import (
    POLICY,
    SETTINGS,
    STATUS_QUEUE,
    STEPS,
    TIMER_CREATED,
    Driver,
    StartingClient,
    World,
    fail_step,
    ok,
    requests,
    statuses,
)


def alerts(world):
    return [OperatorAlert.model_validate_json(body) for body, _ in world.sent("alerts")]


async def started(world, **fields):
    instance_id, attempt_input = await world.fast_started(**fields)
    return instance_id, attempt_input


def test_every_older_version_stays_registered():
    # Instances started before the upgrades replay them (ADR 005, ADR 019a);
    # the live version is 2.4 (test_workflow_v2_4.py).
    assert {"1.0", "1.1", "2.0", "2.1", "2.2", "2.3"} < set(wf.VERSIONS)


# --- cost per order ------------------------------------------------------------------


# (path, Supervisor scan) -> Cosmos requests per order, itemised in the test.
EXPECTED_COSMOS = {
    ("fast", "query"): 8,
    ("fast", "index"): 10,
    ("timer", "query"): 9,
    ("timer", "index"): 11,
}


# 2.3 (docs/adr/020b-workflow-2-3.md): no record in any input, so an activity
# that did not write the version its etag names reads it: "one worker" runs
# every activity of the attempt in one process (its own last write is known:
# only begin reads, the claim was the claimer's), "every worker" runs each in
# a fresh one (each write reads first; each next step reads its payload).
EXTRA_READS_2_3 = {
    ("one worker", "fast"): ({"read": 1}, {}),
    ("one worker", "timer"): ({"read": 1}, {}),
    ("every worker", "fast"): ({"read": 4}, {"read": 2}),
    ("every worker", "timer"): ({"read": 4}, {"read": 2}),
}


@pytest.mark.parametrize(
    ("version", "workers"),
    [("2.2", "every worker"), ("2.3", "one worker"), ("2.3", "every worker")],
)
@pytest.mark.parametrize("path", ["fast", "timer"])
@pytest.mark.parametrize("scan", ["query", "index"])
async def test_cost_of_a_three_step_order_on_the_happy_path(path, scan, version, workers):
    """The figures of issue 12, counted (not timed) through Submit's two
    creates, the claim (Submit's fast path, or the timer Starter), the
    orchestration's activities and the messages they send. Printed for the
    record (pytest -s)."""
    world = World(
        store=CountingStateStore(),
        orders=CountingOrders(),
        index=FakeIndex() if scan == "index" else None,
    )
    if path == "fast":
        instance_id, attempt_input = await started(world)
    else:
        await world.submitted()
        client = StartingClient()
        await world.starter().run(client)
        [(instance_id, attempt_input)] = client.started.items()
        # The timer's run-level requests (two COUNTs, the gauge, three small
        # queries) are amortised over its batch of up to 50 orders: not counted here.
        world.store.requests.pop("query", None)
    if workers == "one worker":
        acts = world.activities()
        world.activities = lambda: acts  # type: ignore[method-assign]
    driver = Driver(world, instance_id, ok, version=version, input=attempt_input)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"

    activities = len(driver.calls)
    # The driver's history lacks only the ExecutionCompleted the host appends.
    history_events = len(driver.history) + 1
    cosmos = world.store.total + world.orders.total + (world.index.total if world.index else 0)
    sent_by_us = len(world.bus.sent)  # agent requests and statuses this code sent
    replies = len(requests(world))  # the scripted agent answers each request once
    # Submit's two messages: the order posted to `orders` and Received (Submit's code).
    sb_messages = 2 + sent_by_us + replies
    print(
        f"\nv2.0 per order ({path} start, {scan} scan): activities={activities} "
        f"history_events={history_events} episodes={driver.episodes} cosmos_requests={cosmos} "
        f"state={world.store.requests} orders={world.orders.requests} "
        f"index={world.index.requests if world.index else {}} sb_messages={sb_messages}"
    )

    assert [n for n, _ in driver.calls] == ["begin_attempt"] + ["advance_attempt"] * 3
    assert activities <= 5
    assert history_events <= 40
    assert sb_messages <= 9
    assert statuses(world) == ["Processed"]
    # Submit's create, 1 claim (a replace on the etag the create or the query
    # returned), 4 guarded writes carrying their etag, 1 outbox clear: no read
    # (2.2); 2.3 reads what its input no longer carries (EXTRA_READS_2_3).
    # 2.2 on the claimer's 2.3 input (no record): its begin reads the record.
    state_reads, order_reads = (
        EXTRA_READS_2_3[workers, path] if version == "2.3" else ({"read": 1}, {})
    )
    assert world.store.requests == {"create": 1, "replace": 6, **state_reads}
    # Submit's create; the order read only when the claimer did not pass the order.
    plan_read = 0 if path == "fast" else 1
    reads = plan_read + order_reads.get("read", 0)
    assert world.orders.requests == ({"create": 1, "read": reads} if reads else {"create": 1})
    if scan == "index":
        # One recovery-index entry per attempt, retired by the attempt itself.
        assert world.index.requests == {"add": 1, "discard": 1}
        assert world.index.entries == {}
    extra = sum(state_reads.values()) + sum(order_reads.values())
    assert cosmos == EXPECTED_COSMOS[path, scan] + extra
    if (path == "fast" or scan == "query") and not extra:
        assert cosmos <= 10
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSED
    assert record.PendingStatus is None


async def test_the_timer_starter_claims_with_one_request_per_order():
    world = World(store=CountingStateStore())
    for order_id in ("A1", "A2", "A3"):
        await world.submitted(order_id)
    before = dict(world.store.requests)
    client = StartingClient()
    report = await world.starter().run(client)
    assert report.claimed == 3
    assert sorted(client.started) == ["webshop:A1:1", "webshop:A2:1", "webshop:A3:1"]
    claims = world.store.requests.get("replace", 0) - before.get("replace", 0)
    reads = world.store.requests.get("read", 0) - before.get("read", 0)
    assert (claims, reads) == (3, 0)
    for data in client.started.values():
        assert data["Etag"]
        # 2.3's input names the claimed version by its etag; no record rides along.
        assert "Record" not in data


async def test_progress_statuses_are_opt_in_per_application():
    world = World(settings=replace(SETTINGS, progress_apps=frozenset({"webshop"})))
    instance_id, attempt_input = await started(world)
    assert await Driver(world, instance_id, ok, input=attempt_input).run() == "completed"
    assert statuses(world) == ["Processing", *["StepCompleted"] * 3, "Processed"]

    other = World(settings=replace(SETTINGS, progress_apps=frozenset({"another-app"})))
    instance_id, attempt_input = await started(other)
    assert await Driver(other, instance_id, ok, input=attempt_input).run() == "completed"
    assert statuses(other) == ["Processed"]


async def test_an_instance_started_without_input_reads_what_it_needs():
    world = World()
    instance_id = await world.claimed()
    driver = Driver(world, instance_id, ok)
    assert await driver.run() == "completed"
    assert [n for n, _ in driver.calls] == ["load_plan", "begin_attempt"] + ["advance_attempt"] * 3
    assert (await world.record()).ProcessState is ProcessState.PROCESSED


# --- the guarantees, at that cost ------------------------------------------------------


async def test_one_deadline_reaches_record_timer_and_agent_request():
    world = World()
    instance_id, attempt_input = await started(world)
    seen = []

    async def before(name, data):
        if name == "advance_attempt" and data.get("Start"):
            seen.append((await world.record()).Steps[data["Complete"]].CompleteBy)

    driver = Driver(world, instance_id, ok, input=attempt_input, before_activity=before)
    assert await driver.run() == "completed"
    sent = [r["Deadline"] for r in requests(world)]
    timers = [e["FireAt"] for e in driver.history if e["EventType"] == TIMER_CREATED]
    starts = [driver.calls[0][1]["Deadline"]] + [
        d["Deadline"] for n, d in driver.calls[1:] if d.get("Start")
    ]

    assert len(sent) == len(timers) == len(starts) == 3
    for a, b, c in zip(sent, timers, starts, strict=True):
        assert sm_time(a) == sm_time(b) == sm_time(c)
    # ... and the record's step deadline (read just before the next write).
    assert seen == [sm_time(s) for s in starts[:2]]


def sm_time(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_each_write_moves_complete_by_straight_to_the_next_steps_deadline():
    world = World()
    instance_id, attempt_input = await started(world)
    deadlines = []

    async def before(name, data):
        if name == "advance_attempt":
            deadlines.append((await world.record()).CompleteBy)

    driver = Driver(world, instance_id, ok, input=attempt_input, before_activity=before)
    assert await driver.run() == "completed"
    starts = [sm_time(driver.calls[0][1]["Deadline"])] + [
        sm_time(d["Deadline"]) for n, d in driver.calls[1:] if d.get("Start")
    ]
    assert deadlines == starts


async def test_resume_skips_steps_a_previous_attempt_completed():
    world = World()
    record, etag = await world.submitted()
    t = world.now
    claimed = sm.claim(record, t, POLICY)
    claimed = sm.start_step(claimed, claimed.LockedBy, STEPS[0], t, t + timedelta(seconds=60))
    claimed = sm.complete_step(claimed, claimed.LockedBy, STEPS[0], t, "ref-0")
    back = sm.recover_expired(claimed, claimed.LockedBy, t + timedelta(minutes=5), POLICY)
    await world.store.replace(back, etag)
    world.now = t + timedelta(minutes=5)
    _, etag = await world.store.read("webshop:A1")
    client = StartingClient()
    instance_id = await world.starter().start_submitted(client, back, etag)
    driver = Driver(world, instance_id, ok, input=client.started[instance_id])
    assert await driver.run() == "completed"
    assert [r["Step"] for r in requests(world)] == STEPS[1:]
    assert (await world.record()).ProcessState is ProcessState.PROCESSED


async def test_timer_first_leaves_the_record_to_the_supervisor():
    world = World()
    instance_id, attempt_input = await started(world)
    driver = Driver(
        world,
        instance_id,
        lambda send: None if send.Step == STEPS[1] else ok(send),
        input=attempt_input,
    )
    assert await driver.run() == "completed"
    assert driver.output == {"Outcome": "timed_out", "Step": STEPS[1], "Detail": "deadline passed"}
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSING
    assert record.LockedBy == instance_id
    assert record.CompleteBy == record.Steps[STEPS[1]].CompleteBy
    assert record.Steps[STEPS[0]].Status is StepStatus.COMPLETED


async def test_transient_reply_reason_is_kept_for_the_supervisor():
    world = World()
    instance_id, attempt_input = await started(world)
    driver = Driver(
        world, instance_id, fail_step(STEPS[0], "transient", "provider down"), input=attempt_input
    )
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "timed_out"
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSING
    assert record.LastError == "provider down"


async def test_permanent_failure_without_completed_steps_is_error_with_alert_and_status():
    world = World()
    instance_id, attempt_input = await started(world)
    driver = Driver(world, instance_id, fail_step(STEPS[0]), input=attempt_input)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "failed"
    record = await world.record()
    assert record.ProcessState is ProcessState.ERROR
    assert record.PendingStatus is None
    assert [a.Kind for a in alerts(world)] == ["OrderError"]
    assert statuses(world) == ["Failed"]


async def test_permanent_failure_after_completed_steps_undoes_every_sent_step():
    world = World()
    instance_id, attempt_input = await started(world)
    driver = Driver(world, instance_id, fail_step(STEPS[2]), input=attempt_input)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "compensated"
    undone = [r["Step"] for r in requests(world) if r["Action"] == "undo"]
    assert undone == [STEPS[2], STEPS[1], STEPS[0]]
    record = await world.record()
    assert record.ProcessState is ProcessState.COMPENSATED
    assert statuses(world) == ["Compensating", "Compensated"]


@pytest.mark.parametrize("at_call", [0, 1, 2, 3])
async def test_a_stale_attempt_never_changes_the_record(at_call):
    """Just before write `at_call` (begin, advance, advance, finish), the
    Supervisor takes the order back and a new attempt claims it: the old
    attempt's carried etag fails, the re-read shows another owner, and the
    attempt ends quietly without writing or sending anything more."""
    world = World()
    instance_id, attempt_input = await started(world)
    calls = []

    async def before(name, data):
        calls.append(name)
        if len(calls) - 1 != at_call:
            return
        record, etag = await world.store.read("webshop:A1")
        later = world.now + timedelta(minutes=5)
        back = sm.recover_expired(record, record.LockedBy, later, POLICY)
        await world.store.replace(sm.claim(back, later, POLICY), etag)

    driver = Driver(world, instance_id, ok, input=attempt_input, before_activity=before)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "stale"
    record = await world.record()
    assert record.LockedBy == "webshop:A1:2"
    assert record.ProcessState is ProcessState.PROCESSING
    # Steps completed before the steal stay (write k completes step k-1);
    # nothing after it was written.
    assert [n for n, s in record.Steps.items() if s.Status is StepStatus.COMPLETED] == STEPS[
        : max(at_call - 1, 0)
    ]
    assert len(requests(world)) == at_call  # nothing sent after the steal
    assert statuses(world) == []


async def test_an_etag_changed_by_another_writer_is_re_read_and_the_write_still_lands():
    """A precondition failure while this attempt still owns the record (here:
    a write that changes nothing of the protocol) is re-read and decided:
    the write is applied to the fresh version."""
    world = World()
    instance_id, attempt_input = await started(world)

    async def before(name, data):
        if name == "advance_attempt":
            record, etag = await world.store.read("webshop:A1")
            await world.store.replace(record.model_copy(update={"UpdatedAt": world.now}), etag)

    driver = Driver(world, instance_id, ok, input=attempt_input, before_activity=before)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    assert statuses(world) == ["Processed"]


@pytest.mark.parametrize("at_call", [0, 1, 3])
async def test_a_crash_between_the_write_and_its_message_is_recovered_by_the_retry(at_call):
    """The send after write `at_call` fails: the write has landed, the
    activity fails, Durable retries it; the retry finds its own write (stale
    etag, re-read, already there) and sends again with the same message id."""
    world = World()
    instance_id, attempt_input = await started(world)
    calls = []

    def before(name, data):
        calls.append(name)
        if len(calls) - 1 == at_call:
            world.bus.fail_next = ConnectionError("bus down after the write")

    driver = Driver(world, instance_id, ok, input=attempt_input, before_activity=before)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "processed"
    assert [r["Step"] for r in requests(world)] == STEPS  # each request once
    assert statuses(world) == ["Processed"]
    assert len(driver.calls) == 5  # one retry
    assert (await world.record()).PendingStatus is None


async def test_a_status_that_cannot_be_sent_stays_in_the_outbox_for_the_starter():
    world = World()
    instance_id, attempt_input = await started(world)

    class Down(Exception):
        pass

    real_send = world.bus.send

    async def send(queue, body, message_id, props=None):
        if queue == STATUS_QUEUE:
            raise Down("reply queue unavailable")
        return await real_send(queue, body, message_id, props)

    world.bus.send = send
    driver = Driver(world, instance_id, ok, input=attempt_input)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "unconfirmed"
    record = await world.record()
    assert record.ProcessState is ProcessState.PROCESSED
    assert record.PendingStatus is not None

    world.bus.send = real_send
    world.now += timedelta(minutes=5)
    report = await Starter(
        SETTINGS, world.store, clock=ReadClock(lambda: world.now), publisher=world.bus
    ).run(StartingClient())
    assert report.statuses_delivered == 1
    assert statuses(world) == ["Processed"]
    assert (await world.record()).PendingStatus is None


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


async def test_a_version_1_1_instance_in_flight_finishes_on_1_1():
    """Started before the upgrade (version 1.1 in its history), replayed by
    this build where 2.0 is the default: it runs 1.1's activities to the end."""
    world = World()
    instance_id = await world.claimed()
    driver = Driver(world, instance_id, ok, version="1.1")
    assert await driver.run() == "completed"
    names = {n for n, _ in driver.calls}
    assert "load_plan" in names
    assert "write_state" in names
    assert not names & {"begin_attempt", "advance_attempt"}
    assert (await world.record()).ProcessState is ProcessState.PROCESSED


async def test_an_operator_compensation_runs_on_2_0_from_the_record_log():
    """The Starter starts compensations without input: 2.0 reads the record,
    finds it Compensating and undoes every step whose request was sent."""
    world = World()
    instance_id, attempt_input = await started(world)
    driver = Driver(
        world,
        instance_id,
        lambda send: None if send.Step == STEPS[1] else ok(send),
        input=attempt_input,
    )
    assert await driver.run() == "completed"  # step 2 timed out: Running, request sent
    t = world.now + timedelta(minutes=5)
    policy = sm.RetryPolicy(threshold=1, long_retries=0)
    await world.store.update(
        "webshop:A1", lambda r: sm.recover_expired(r, instance_id, t, policy), instance_id
    )
    await world.store.update("webshop:A1", lambda r: sm.request_compensation(r, t), ANY_OWNER)
    world.now = t
    client = StartingClient()
    report = await world.starter().run(client)
    assert report.compensations == 1
    [(compensating, data)] = client.started.items()
    assert data is None
    world.bus.sent.clear()
    driver = Driver(world, compensating, ok)
    assert await driver.run() == "completed"
    assert driver.output["Outcome"] == "compensated"
    assert [r["Step"] for r in requests(world) if r["Action"] == "undo"] == [STEPS[1], STEPS[0]]
    assert (await world.record()).ProcessState is ProcessState.COMPENSATED
