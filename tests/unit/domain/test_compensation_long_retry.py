"""The state machine's side of an unconfirmed undo (workflow 2.2, ADR 019a):
recording it, deferring the compensation to a long retry, waking it, the
bound, and what an operator's request resets."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from domain import state_machine as sm
from domain.errors import StaleError
from domain.models import ProcessState
from tests.builders import start_step
from tests.unit.domain.conftest import NOW, STEPS


@pytest.fixture
def compensating(processing):
    iid = processing.LockedBy
    record = start_step(processing, STEPS[0], NOW, NOW + timedelta(seconds=60))
    record = sm.complete_step(record, iid, STEPS[0], NOW, "ref-0")
    record = start_step(record, STEPS[1], NOW, NOW + timedelta(seconds=60))
    return sm.begin_compensation(record, iid, "declined", NOW, STEPS[1])


def _unconfirmed(record, step=STEPS[0]):
    return sm.record_undo_unconfirmed(record, record.LockedBy, step, NOW, "HTTP 504")


def test_an_unconfirmed_undo_stays_to_undo_with_why(compensating):
    record = _unconfirmed(compensating)
    (entry,) = [e for e in record.Compensation if e.Step == STEPS[0]]
    assert entry.Outcome == "Pending"
    assert entry.Error == "unconfirmed: HTTP 504"
    # dated after the transition into Compensating, which is dated NOW too
    assert entry.At == NOW + timedelta(microseconds=1)
    assert record.ProcessState is ProcessState.COMPENSATING


def test_defer_waits_a_long_delay_and_counts_it(compensating, policy):
    iid = compensating.LockedBy
    record = sm.record_undo(compensating, iid, STEPS[1], True, NOW)
    record = sm.defer_compensation(_unconfirmed(record), iid, NOW, policy)
    assert record.ProcessState is ProcessState.COMPENSATING
    assert record.LockedBy == iid
    assert record.NotBefore == NOW + policy.long_delay
    assert record.CompensationLongRetries == 1
    assert f"undo of step {STEPS[0]} unconfirmed (unconfirmed: HTTP 504)" in record.LastError
    assert record.History[-1].By == iid
    assert record.PendingStatus is None  # no verdict, no status
    assert sm.compensation_waits(record, NOW + policy.long_delay - timedelta(seconds=1))
    assert not sm.compensation_waits(record, NOW + policy.long_delay)
    # An activity re-run after the write landed counts no second long retry.
    assert sm.defer_compensation(record, iid, NOW + timedelta(seconds=5), policy) == record


def test_a_refused_undo_is_finished_not_deferred(compensating, policy):
    iid = compensating.LockedBy
    record = sm.record_undo(compensating, iid, STEPS[1], False, NOW, "refund refused")
    with pytest.raises(sm.IllegalTransition):
        sm.defer_compensation(_unconfirmed(record), iid, NOW, policy)
    finished = sm.finish_compensation(_unconfirmed(record), iid, NOW)
    assert finished.ProcessState is ProcessState.COMPENSATION_FAILED
    # The refused step is named before the one still open.
    assert finished.LastError.startswith(f"undo failed for step {STEPS[1]}: refund refused")


def test_the_starter_wakes_it_after_not_before_as_a_new_attempt(compensating, policy):
    iid = compensating.LockedBy
    deferred = sm.defer_compensation(_unconfirmed(compensating), iid, NOW, policy)
    with pytest.raises(sm.IllegalTransition):
        sm.restart_compensation(deferred, iid, NOW + timedelta(minutes=59))
    with pytest.raises(StaleError):
        sm.restart_compensation(deferred, "someone-else", NOW + policy.long_delay)
    woken = sm.restart_compensation(deferred, iid, NOW + policy.long_delay)
    assert woken.ProcessState is ProcessState.COMPENSATING
    assert woken.Attempt == deferred.Attempt + 1
    assert woken.LockedBy.endswith(f":{woken.Attempt}")
    assert woken.NotBefore is None
    assert woken.CompensationRestarts == deferred.CompensationRestarts == 0
    assert woken.CompensationLongRetries == 1


def test_waking_spends_no_restart_even_when_the_restarts_are_spent(compensating, policy):
    iid = compensating.LockedBy
    spent = compensating.model_copy(update={"CompensationRestarts": sm.MAX_COMPENSATION_RESTARTS})
    deferred = sm.defer_compensation(_unconfirmed(spent), iid, NOW, policy)
    woken = sm.restart_compensation(deferred, iid, NOW + policy.long_delay)
    assert woken.ProcessState is ProcessState.COMPENSATING


def test_past_its_long_retries_it_ends_compensation_failed(compensating, policy):
    bounded = replace(policy, undo_long_retries=2)
    record = _unconfirmed(compensating)
    for n in range(2):
        record = sm.defer_compensation(record, record.LockedBy, NOW, bounded)
        assert record.CompensationLongRetries == n + 1
        record = _unconfirmed(sm.restart_compensation(record, record.LockedBy, record.NotBefore))
    last = record.LockedBy
    ended = sm.defer_compensation(record, last, NOW, bounded)
    assert ended.ProcessState is ProcessState.COMPENSATION_FAILED
    assert ended.LockedBy is None
    assert ended.NotBefore is None
    assert "still unconfirmed after 2 long retries" in ended.LastError
    assert ended.PendingStatus is not None
    assert ended.PendingStatus.Status.value == "CompensationFailed"
    assert ended.History[-1].By == last


def test_an_operators_compensation_starts_with_fresh_counts(compensating, policy):
    bounded = replace(policy, undo_long_retries=0)
    ended = sm.defer_compensation(_unconfirmed(compensating), compensating.LockedBy, NOW, bounded)
    assert ended.CompensationLongRetries == 0
    ended = ended.model_copy(update={"CompensationLongRetries": 5})
    claimed = sm.claim_compensation(sm.request_compensation(ended, NOW), NOW)
    assert claimed.CompensationLongRetries == 0
    assert claimed.NotBefore is None
    assert [e.Outcome for e in claimed.Compensation if e.Step == STEPS[0]] == ["Pending"]


def test_a_record_without_the_field_reads_as_none_spent(compensating):
    data = compensating.model_dump(mode="json")
    data.pop("CompensationLongRetries")
    assert type(compensating).model_validate(data).CompensationLongRetries == 0


# --- a compensation whose instance keeps dying: a long retry, not a verdict ---


def _restarted_until_spent(record):
    """Restart the compensation's dead instance until the budget is spent."""
    for _ in range(sm.MAX_COMPENSATION_RESTARTS):
        record = sm.restart_compensation(record, record.LockedBy, NOW)
    assert record.CompensationRestarts == sm.MAX_COMPENSATION_RESTARTS
    return record


def test_spent_restarts_wait_a_long_retry_instead_of_failing(compensating, policy):
    """Seeds 720021 and 720209: a throttling storm killed three restarts in a
    minute, and the verdict named undos never sent. With the policy, the
    record waits a long retry, its restarts counted afresh."""
    spent = _restarted_until_spent(compensating)
    dead = spent.LockedBy
    waiting = sm.restart_compensation(spent, dead, NOW, policy=policy)
    assert waiting.ProcessState is ProcessState.COMPENSATING
    assert waiting.LockedBy == dead  # the wake makes the new attempt
    assert waiting.NotBefore == NOW + policy.long_delay
    assert waiting.CompensationRestarts == 0
    assert waiting.CompensationLongRetries == 1
    assert waiting.PendingStatus is None  # no verdict, no status
    assert sm.compensation_waits(waiting, NOW)
    woken = sm.restart_compensation(waiting, dead, NOW + policy.long_delay, policy=policy)
    assert woken.Attempt == waiting.Attempt + 1
    assert woken.NotBefore is None


def test_spent_restarts_still_fail_without_the_policy_or_after_a_refusal(compensating, policy):
    spent = _restarted_until_spent(compensating)
    failed = sm.restart_compensation(spent, spent.LockedBy, NOW)
    assert failed.ProcessState is ProcessState.COMPENSATION_FAILED
    refused = sm.record_undo(spent, spent.LockedBy, STEPS[1], False, NOW, "refund refused")
    settled = sm.record_undo(refused, refused.LockedBy, STEPS[0], True, NOW)
    failed = sm.restart_compensation(settled, settled.LockedBy, NOW, policy=policy)
    assert failed.ProcessState is ProcessState.COMPENSATION_FAILED


def test_a_refusal_still_waits_for_the_undos_not_yet_tried(compensating, policy):
    """Seed 2001677: the payment's undo was refused, then three executions
    died before the inventory's undo was sent. The verdict is settled, but
    the undo left to try is tried first: a long retry, not CompensationFailed
    with the inventory still held."""
    spent = _restarted_until_spent(compensating)
    refused = sm.record_undo(spent, spent.LockedBy, STEPS[1], False, NOW, "refund refused")
    assert [e.Outcome for e in refused.Compensation if e.Step == STEPS[0]] == ["Pending"]
    waiting = sm.restart_compensation(refused, refused.LockedBy, NOW, policy=policy)
    assert waiting.ProcessState is ProcessState.COMPENSATING
    assert waiting.NotBefore == NOW + policy.long_delay
    assert waiting.PendingStatus is None
    woken = sm.restart_compensation(waiting, waiting.LockedBy, waiting.NotBefore, policy=policy)
    assert woken.Attempt == waiting.Attempt + 1
    # The refusal is kept: the woken attempt tries the open undo, then ends
    # CompensationFailed naming the refused one.
    woken = sm.record_undo(woken, woken.LockedBy, STEPS[0], True, NOW)
    ended = sm.finish_compensation(woken, woken.LockedBy, NOW)
    assert ended.ProcessState is ProcessState.COMPENSATION_FAILED
    assert "refund refused" in ended.LastError


def test_spent_restarts_fail_once_the_long_retries_are_spent(compensating, policy):
    spent = _restarted_until_spent(compensating)
    spent = spent.model_copy(update={"CompensationLongRetries": policy.undo_long_retries})
    failed = sm.restart_compensation(spent, spent.LockedBy, NOW, policy=policy)
    assert failed.ProcessState is ProcessState.COMPENSATION_FAILED
    assert failed.PendingStatus is not None


def test_a_new_compensation_attempt_is_dated_after_every_undo_entry_it_saw(compensating, policy):
    """Simulation seed 3324363: an undo entry dated by a clock ahead of the
    Starter's read as the next attempt's own write (orchestrators.starter
    `_never_started`). Every write that hands the compensation to a new
    attempt (a restart, a wake, an operator's claim) is dated after the
    entries, whatever the writer's clock says."""
    iid = compensating.LockedBy
    ahead = NOW + timedelta(seconds=2)
    record = sm.record_undo(compensating, iid, STEPS[0], False, ahead, "refused")
    restarted = sm.restart_compensation(record, iid, NOW, policy=policy)
    assert restarted.History[-1].At >= ahead
    failed = sm.finish_compensation(record, iid, NOW)
    assert failed.ProcessState is ProcessState.COMPENSATION_FAILED
    claimed = sm.claim_compensation(sm.request_compensation(failed, NOW), NOW)
    assert claimed.History[-1].At >= ahead
