"""Issue 43's worlds (sim/options.py `_slow_world`): overload (every order in
the first seconds against rate-limited services, the task hub's queues
backed up), services that answer 429 with a Retry-After, and a client's reply
queue that refuses every send for hours; and the checks on the path and at
the end that guard what those worlds open. Each check fires on what it is
there for and stays quiet on its legitimate neighbours."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace

from devstack.host.durable import TASK_FAILED, TASK_SCHEDULED, _event
from sim.durable import Instance
from sim.system import Simulation, options_for, simulate
from sim.world import START
from tests.sim.test_check_premises import _checks
from tests.sim.test_check_premises import _run as _run_seed

_SLOW = {"rate_limit": 0.0, "overload": False, "episode_wait": 0.0, "episode_stalls": 0.0}


def _as(sim: Simulation, actor: str, body) -> None:
    """Run `body()` as an actor of the simulation would (its task's name)."""

    async def run() -> None:
        sim.world._names[asyncio.current_task()] = actor
        body()

    asyncio.new_event_loop().run_until_complete(run())


def test_the_slow_worlds_are_drawn_from_their_own_streams_and_only_for_new_seeds():
    drawn = [options_for(seed, 3) for seed in range(1, 401)]
    rated = [o for o in drawn if o.faults.rate_limit]
    refusing = [o for o in drawn if o.faults.refusing_reply]
    alone = [o for o in drawn if o.faults.overload and not o.faults.crash and not o.faults.delay]
    assert 40 <= len(rated) <= 160
    assert 20 <= len(refusing) <= 80
    assert alone, "no schedule of overload alone for check (e) to judge"
    for o in refusing:
        assert o.faults.refusing_reply in ("disabled", "deleted", "forbidden", "full")
        assert 3600 <= o.faults.refusing_seconds <= 3 * 3600
    for seed, o in zip(range(1, 401), drawn, strict=True):
        without = options_for(seed, 3, slow_world=False)
        assert not without.faults.rate_limit
        assert not without.faults.refusing_reply
        # Every other draw of the seed is what it was (the overload's burst
        # of arrivals is the overload's own).
        slow = replace(
            o.faults,
            **_SLOW,
            burst=without.faults.burst,
            refusing_reply="",
            refusing_seconds=0.0,
        )
        assert replace(o, faults=slow) == without


def _overload_alone() -> int:
    return next(
        seed
        for seed in range(1, 400)
        if (f := options_for(seed, 3).faults).overload
        and f.rate_limit
        and replace(f, **_SLOW, burst=False, hostile=0) == type(f)()
    )


def test_a_rate_limited_service_answers_429_with_retry_after_and_every_order_is_processed():
    seed = _overload_alone()
    sim = simulate(Simulation(seed, 3))
    paced = [line for line in sim.world.trace if "-> 429 (retry after" in line]
    assert paced, "no call met the rate limit"
    assert sim.world.counters["rate_limited"] == len(paced)
    assert all(outcome != "paced" or op for _, op, _, outcome in sim.remote.calls)
    # The agent took each 429 as pacing: no request died of it.
    dead = sim.bus.queue("agent-requests").dead
    assert not [m for m in dead if m.dead_letter_reason == "ProcessingFailed"]
    assert sim.violations == []
    docs = [sim.state_c.docs[(oid, oid)] for oid in sim.order_ids]
    assert {d["ProcessState"] for d in docs} == {"Processed"}


def _refusing_seed() -> int:
    return next(seed for seed in range(1, 400) if options_for(seed, 3).faults.refusing_reply)


def test_a_reply_queue_refusing_for_hours_refuses_as_the_sdk_does_and_gets_its_statuses_after():
    # Seed 55: a reply queue disabled for hours from the fault window on, with
    # terminal statuses owed to it (seed 26 was, before the merged admission and
    # status-before-write changes moved its draws).
    sim = simulate(Simulation(55, 3))
    ((queue, (start, until, kind)),) = sim.world.faults.refusing.items()
    assert kind == "disabled"
    assert until - start >= timedelta(hours=1)
    refused = [line for line in sim.world.trace if f"refused: the queue is {kind}" in line]
    assert any("/status/" in line for line in refused), "no status met the refusing queue"
    # Nothing reached the queue while it refused; what it was owed came after.
    assert not [m for m in sim.bus.queue(queue).sent if start <= m.sent_at < until]
    assert [m for m in sim.bus.queue(queue).sent if m.sent_at >= until]
    assert sim.end >= until
    assert sim.violations == []
    # The Starter probed the queue (26 refused sends in its 107 minutes: one
    # every STATUS_BACKOFF_MAX after the doublings), not every 30 s scan (214).
    assert 0 < len(sim.starter_refused[queue]) <= 30
    assert "a refusing reply queue is probed, not resent to every scan" not in _checks(sim)
    sim.starter_refused[queue] += [until] * 100  # a Starter resending every scan
    assert "a refusing reply queue is probed, not resent to every scan" in _checks(sim)


def test_without_the_slow_worlds_no_call_is_paced_and_no_queue_refuses():
    seed = _refusing_seed()
    options = options_for(seed, 3)
    sim = simulate(
        Simulation(
            seed,
            3,
            options=replace(
                options,
                faults=replace(options.faults, **_SLOW, refusing_reply="", refusing_seconds=0.0),
            ),
        )
    )
    assert sim.world.counters["rate_limited"] == 0
    assert sim.world.counters["queue_refused"] == 0
    assert not sim.world.faults.refusing


def test_a_reply_raised_on_another_instance_or_under_another_attempts_event_is_caught():
    """Mutant `bridge-gone-to-next`: a gone attempt's reply handed to the next."""
    sim = _run_seed(1, 1)
    reply = {"InstanceId": "o:1", "EventName": "reply-payment-1"}

    def raise_as_bridge(instance: str, event: str) -> None:
        sim.replying[asyncio.current_task()] = json.dumps(reply).encode()
        sim._on_raise(instance, event)

    _as(sim, "bridge", lambda: raise_as_bridge("o:1", "reply-payment-1"))
    assert sim.reply_misrouted == []
    _as(sim, "bridge", lambda: raise_as_bridge("o:2", "reply-payment-2"))
    assert len(sim.reply_misrouted) == 1
    assert "every reply event an instance takes names that instance and attempt" in _checks(sim)


def test_a_timer_off_the_records_deadline_is_caught_but_not_an_activitys_retry_timer():
    """Mutant `wf-timer-off-deadline`."""
    sim = _run_seed(1, 1)
    due = START + timedelta(seconds=60)
    sim.state_c.docs[("o", "o")] = {
        "id": "o",
        "ProcessState": "Processing",
        "LockedBy": "o:1",
        "CompleteBy": due.isoformat(),
    }
    sim._on_timer("o:1", due, START)
    sim._on_timer("o:1", START + timedelta(milliseconds=500), START)  # a retry's wait
    sim._on_timer("o:2", due + timedelta(seconds=2), START)  # not the owner
    assert sim.timer_off_deadline == []
    sim._on_timer("o:1", due + timedelta(seconds=2), START)
    assert len(sim.timer_off_deadline) == 1
    assert "the timer fires at the record's deadline" in _checks(sim)


def test_a_write_answered_as_landed_that_this_attempt_never_wrote_is_caught():
    """Mutant `act-landed-any-writer`."""
    sim = _run_seed(1, 1)
    sim.wrote_states["o:1"] = {"Processing", "Processed"}
    sim._on_activity_result("o:1", "finish_attempt", {"State": "Processed", "Etag": "e"})
    sim._on_activity_result("o:2", "finish_attempt", {"Stale": True, "Reason": "locked"})
    sim._on_activity_result("o:2", "send_step", None)
    assert sim.landed_not_written == []
    sim._on_activity_result("o:2", "finish_attempt", json.dumps({"State": "Processed"}))
    assert len(sim.landed_not_written) == 1
    assert "a write counts as landed only if this attempt wrote it" in _checks(sim)


def test_a_supervisor_run_that_stops_after_a_page_with_progress_is_caught():
    """Mutant `sup-one-page`."""
    sim = _run_seed(1, 1)
    report = SimpleNamespace(skipped=0, pass_finished=False, pages=1)
    quick = timedelta(seconds=1)
    sim._check_read_on(report, [0], quick)  # the last page recovered nothing
    sim._check_read_on(SimpleNamespace(skipped=0, pass_finished=True, pages=1), [2], quick)
    sim._check_read_on(report, [2], sim.settings.supervisor_run_budget)  # its budget spent
    many = SimpleNamespace(skipped=0, pass_finished=False, pages=sim.settings.supervisor_max_pages)
    sim._check_read_on(many, [1] * many.pages, quick)
    assert sim.stopped_reading == []
    sim._check_read_on(report, [2], quick)
    assert len(sim.stopped_reading) == 1
    assert "a Supervisor run that made progress reads on" in _checks(sim)


def test_an_order_not_processed_under_overload_alone_is_caught():
    sim = _run_seed(1, 1)
    sim.o = replace(sim.o, faults=replace(sim.o.faults, overload=True, burst=True, rate_limit=0.1))
    assert "goodput under overload bounded below" not in _checks(sim)
    oid = sim.order_ids[0]
    sim.state_c.docs[(oid, oid)] = {**sim.state_c.docs[(oid, oid)], "ProcessState": "Error"}
    assert "goodput under overload bounded below" in _checks(sim)
    # With another fault the bound does not apply.
    sim.o = replace(sim.o, faults=replace(sim.o.faults, crash=0.01))
    assert "goodput under overload bounded below" not in _checks(sim)


def test_an_orchestration_stopped_by_a_refused_status_is_caught():
    """Mutant `wf-compensating-status-blocks`."""
    sim = _run_seed(1, 1)
    inst = Instance("o:2", "order_workflow", "1.0", 1, status="Failed", output="boom")
    inst.history = [
        _event(TASK_SCHEDULED, START, EventId=0, Name="report_status"),
        _event(TASK_FAILED, START, TaskScheduledId=0, Reason="status not sent"),
    ]
    sim.durable.instances["o:2"] = inst
    sim.status_refused["o:2"] = "Compensating"
    assert "no compensation delayed by a status" in _checks(sim)
    inst.history[0] = _event(TASK_SCHEDULED, START, EventId=0, Name="write_state")
    assert "no compensation delayed by a status" not in _checks(sim)


def test_a_breaker_open_on_a_service_that_only_paced_is_caught():
    """Mutant `remote-429-breaker-failure`: 429s counted as failures."""
    sim = _run_seed(1, 1)
    error = "circuit open for payment: /payment/charge not called"
    body = json.dumps({"Outcome": "transient", "Error": error}).encode()
    sim.bus.send("agent-responses", body, "o:1/reply-payment-1", {})
    assert "a breaker opens only on a failing service" in _checks(sim)
    sent = sim.bus.queue("agent-responses").sent[-1].sent_at
    # It had failed a call just before: the breaker's to count.
    sim.remote.failures["payment"] = [sent - timedelta(seconds=20)]
    assert "a breaker opens only on a failing service" not in _checks(sim)
    # A failure longer ago than the breaker's reset and a call's timeout
    # opened no breaker that is still open (5xx early in a schedule, 429s later).
    sim.remote.failures["payment"] = [sent - timedelta(seconds=30 + 60 + 1)]
    assert "a breaker opens only on a failing service" in _checks(sim)
    # Seed 12000363: the gate's back-off copy of such a reply, sent long after
    # the refusal, is not judged by its own time (its original is).
    from adapters.settlement import ORIGINAL_ID_PROPERTY

    sim.remote.failures["payment"] = [sent - timedelta(seconds=20)]
    copy_props = {ORIGINAL_ID_PROPERTY: "o:1/reply-payment-1"}
    sim.world.clock.now += timedelta(minutes=10)
    sim.bus.send("agent-responses", body, "retry/seq-1/1/seq-2", copy_props)
    assert "a breaker opens only on a failing service" not in _checks(sim)


def test_a_stalled_episode_waits_minutes_and_only_while_faults_last():
    """FaultConfig.episode_stalls: what lets an attempt reach its finishing
    write after another attempt's whole run (mutant `act-landed-any-writer`)."""
    sim = _run_seed(1, 1)
    faults = sim.world.faults
    faults.config.episode_stalls = 1.0
    faults.active = True
    assert all(60 <= (sim.durable._episode_wait() or 0) <= 240 for _ in range(20))
    faults.config.episode_stalls, faults.config.episode_wait = 0.0, 30.0
    assert all(0 <= (sim.durable._episode_wait() or 0) <= 30 for _ in range(20))
    faults.active = False
    assert sim.durable._episode_wait() is None
