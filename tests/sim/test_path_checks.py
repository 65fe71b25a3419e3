"""Checks on the path (issue 21) for slips that once only their own
unit tests caught: a restart spent on an attempt that never ran, a failed
delivery's back-off copy dropped as another delivery's, an attempt that
quit before its step's deadline with the reply still to come. Each fires on
what it is there for and stays quiet on its legitimate neighbours."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from azure.servicebus import ServiceBusMessage

from devstack.host.durable import TASK_FAILED, TASK_SCHEDULED, _event
from domain.ids import reply_event_name
from sim.bus import HANDLING
from sim.durable import Instance
from sim.system import Simulation
from tests.sim.test_check_premises import _checks
from tests.sim.test_check_premises import _run as _run_seed


def _run() -> Simulation:
    return _run_seed(1, 1)


def _as(sim: Simulation, actor: str, body) -> None:
    """Run `body()` as an actor of the simulation would (its task's name)."""

    async def run() -> None:
        sim.world._names[asyncio.current_task()] = actor
        body()

    asyncio.new_event_loop().run_until_complete(run())


def test_a_restart_is_counted_only_for_an_attempt_the_task_hub_started():
    """Seed 5000250 (mutant `starter-missing-instance-left`): a compensation
    written and never started, restarted as if it had run and died, spends
    a restart on nothing."""
    sim = _run()
    old = {
        "id": "o",
        "ProcessState": "Compensating",
        "LockedBy": "o:2",
        "CompensationRestarts": 0,
    }
    new = {**old, "LockedBy": "o:3", "CompensationRestarts": 1}
    _as(sim, "starter", lambda: sim._on_state_write(old, new))
    assert [c for c, _ in sim.violations] == ["a restart is counted only for an attempt that ran"]
    sim.violations.clear()
    # The attempt ran and failed: its restart is the budget's to count.
    sim.durable.instances["o:2"] = Instance("o:2", "workflow", "2.4", 1, status="Failed")
    _as(sim, "starter", lambda: sim._on_state_write(old, new))
    assert sim.violations == []
    # Started under its own id, with nothing counted: no restart spent.
    del sim.durable.instances["o:2"]
    _as(sim, "starter", lambda: sim._on_state_write(old, {**old, "LockedBy": "o:2"}))
    assert sim.violations == []


def test_a_failed_deliverys_copy_is_never_dropped_as_one_another_delivery_made():
    """Seed 5000216 (mutant `gate-copy-named-by-message`): a redelivery that
    failed again scheduled the copy an earlier delivery had made, which had
    already run; duplicate detection dropped it, and nothing came after.
    The SDK's own repeat of one delivery's schedule is dropped rightly."""
    sim = _run()
    queue = "orders-webshop"
    sender = sim.servicebus.get_queue_sender(queue)
    later = sim.world.clock.now + timedelta(seconds=5)

    def schedule(token: int) -> None:
        async def run() -> None:
            HANDLING.set(token)
            message = ServiceBusMessage(b"{}", message_id="retry/seq-9/1")
            message.scheduled_enqueue_time_utc = later
            await sender.send_messages(message)

        asyncio.new_event_loop().run_until_complete(run())

    schedule(41)
    schedule(41)  # the same delivery's repeat (its answer lost): dropped, no loss
    assert "a failed delivery's back-off copy comes after it" not in _checks(sim)
    schedule(42)  # another delivery's, while the first copy still waits: it runs after both
    assert "a failed delivery's back-off copy comes after it" not in _checks(sim)
    (copy,) = [m for m in sim.bus.queue(queue).sent if m.message_id == "retry/seq-9/1"]
    assert copy.made_by == 41
    copy.delivery_count = 1  # the first copy ran; a later failure's copy is lost
    schedule(43)
    assert "a failed delivery's back-off copy comes after it" in _checks(sim)


def _failed_attempt(
    sim: Simulation, activity: str, error: str, deadline_in: float, output: str | None = None
):
    """Order o's attempt o:1 failed after `activity` failed with `error`
    (ending with `output`, by default that error), its record still
    Processing under it with step `pay` Running until `deadline_in` seconds
    from now."""
    now = sim.world.clock.now
    inst = Instance("o:1", "workflow", "2.4", 1, status="Failed", output=output or error)
    inst.history = [
        _event(TASK_SCHEDULED, now, EventId=0, Name=activity),
        _event(TASK_FAILED, now, TaskScheduledId=0, Reason=error),
    ]
    sim.durable.instances["o:1"] = inst
    sim.state_c.docs[("o", "o")] = {
        "id": "o",
        "ProcessState": "Processing",
        "LockedBy": "o:1",
        "CompleteBy": (now + timedelta(seconds=deadline_in)).isoformat(),
        "Steps": {"pay": {"Status": "Running"}},
    }


def _reply(sim: Simulation, step: str = "pay") -> list[str]:
    async def run() -> None:
        # The SDK raises for an instance that ended; the check has seen it by then.
        with contextlib.suppress(Exception):
            await sim.durable.raise_event("o:1", reply_event_name(step, 1), {})

    sim.quit_early.clear()
    asyncio.new_event_loop().run_until_complete(run())
    return sim.quit_early


def test_an_attempt_that_quit_before_its_deadline_with_a_reply_to_come_is_caught():
    """Mutants `wf24-send-failure-ends-attempt` and
    `wf24-lost-advance-fails-attempt`: a send or an advance whose answer was
    lost ended the attempt, though its request had gone out; the reply then
    found it Failed, before the step's deadline."""
    sim = _run()
    _failed_attempt(sim, "send_step", "sending to agent-requests: no answer in time", 60)
    assert len(_reply(sim)) == 1
    # A reply to a step the record does not give the attempt, or after the
    # deadline (the attempt timed out rightly), is no sign of quitting.
    assert _reply(sim, "ship") == []
    _failed_attempt(sim, "send_step", "sending to agent-requests: no answer in time", 0.5)
    assert _reply(sim) == []
    # The store refused the plan a lost begin needs to know what was sent:
    # the attempt could not go on (the Supervisor retries it).
    _failed_attempt(sim, "load_plan", "read state o: Cosmos DB answered 503", 60)
    assert _reply(sim) == []
    # As the workflow ends then: with the lost begin's own error (seed 2100043).
    lost = "sending to agent-requests: no answer in time"
    _failed_attempt(sim, "load_plan", "read state o: Cosmos DB answered 429", 60, output=lost)
    assert _reply(sim) == []
    # A store failure of an advance is no such excuse: the request had left.
    _failed_attempt(sim, "advance_attempt", "replace state o: Cosmos DB answered 503", 60)
    assert len(_reply(sim)) == 1
    # An answer it had heard before it ended (a redelivered request's second).
    sim.durable.heard[("o:1", reply_event_name("pay", 1))] = ["{}"]
    assert _reply(sim) == []


def test_a_recovery_that_leaves_failurecount_at_its_default_is_caught():
    """Mutant `sm-failurecount-not-counted` (the Supervisor forgets to count
    the expired attempt) survived 1,000 one-order seeds: the store leaves a
    count at its default 0 out of the document, and the check took the
    absent count for a foreign document's. Absent is 0; only a count that is
    there and no number is skipped."""
    sim = _run()
    expired = (sim.world.clock.now - timedelta(minutes=5)).isoformat()
    old = {"id": "o", "ProcessState": "Processing", "LockedBy": "o:1", "CompleteBy": expired}
    pending = {"id": "o", "ProcessState": "Pending"}

    def recovered(before: dict, after: dict) -> list[str]:
        sim.violations.clear()
        _as(sim, "supervisor", lambda: sim._on_state_write(before, after))
        return [c for c, _ in sim.violations]

    assert recovered(old, pending) == ["FailureCount moves by one per recovery"]
    assert recovered(old, {**pending, "FailureCount": 1}) == []
    assert recovered({**old, "FailureCount": 1}, {**pending, "FailureCount": 1}) == [
        "FailureCount moves by one per recovery"
    ]
    assert recovered({**old, "FailureCount": 1}, {**pending, "FailureCount": 2}) == []
    # A foreign document's count (no number) is its own alert's to name.
    assert recovered({**old, "FailureCount": None}, pending) == []


def test_the_cap_check_counts_records_in_processing_and_not_a_foreign_document():
    """Admission (sim/path_checks.py `_check_admission_cap`): a claim that
    puts more records in Processing than MAX_PROCESSING fires; a foreign
    document left Processing (foreign_docs) was never admitted and counts
    for nothing."""
    import dataclasses

    sim = _run()
    sim.settings = dataclasses.replace(sim.settings, max_processing=1)
    sim.junk = ["JUNK-p"]
    for key in ("a", "JUNK-p"):
        sim.state_c.docs[(key, key)] = {"id": key, "ProcessState": "Processing"}
    claimed = sim.state_c.docs[("a", "a")]
    _as(sim, "starter", lambda: sim._check_admission_cap(claimed))
    assert sim.violations == []
    sim.state_c.docs[("b", "b")] = {"id": "b", "ProcessState": "Processing"}
    _as(sim, "starter", lambda: sim._check_admission_cap(sim.state_c.docs[("b", "b")]))
    assert [c for c, _ in sim.violations] == ["Processing never above MAX_PROCESSING"]


def test_the_cap_check_does_not_ask_just_after_a_count_missed_another_sessions_claim():
    """What the cap promises assumes every COUNT sees every landed claim
    (docs/design.md, admission): within MISSED_CLAIM_WINDOW of a COUNT whose
    lagging replica hid another session's claim (seed 33001029) the check does
    not ask; after it, it does again."""
    import dataclasses

    from sim.path_checks import MISSED_CLAIM_WINDOW

    sim = _run()
    sim.settings = dataclasses.replace(sim.settings, max_processing=1)
    for key in ("a", "b"):
        sim.state_c.docs[(key, key)] = {"id": key, "ProcessState": "Processing"}
    claimed = sim.state_c.docs[("b", "b")]
    sim.state_c.missed_claim_at = sim.world.clock.now - MISSED_CLAIM_WINDOW / 2
    _as(sim, "starter", lambda: sim._check_admission_cap(claimed))
    assert sim.violations == []
    sim.state_c.missed_claim_at = sim.world.clock.now - MISSED_CLAIM_WINDOW * 2
    _as(sim, "starter", lambda: sim._check_admission_cap(claimed))
    assert [c for c, _ in sim.violations] == ["Processing never above MAX_PROCESSING"]
