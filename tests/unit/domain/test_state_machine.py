"""Every row of DESIGN.md §3's transition table, and the edges it forbids."""

from __future__ import annotations

from datetime import timedelta

import pytest

from domain import state_machine as sm
from domain.errors import StaleError
from domain.models import MAX_REFERENCE, OrderState, ProcessState, StepStatus
from tests.builders import start_step
from tests.unit.domain.conftest import NOW, STEPS

LATER = NOW + timedelta(minutes=5)


def run_all_steps(record):
    for step in STEPS:
        record = start_step(record, step, NOW, NOW + timedelta(seconds=60))
        record = sm.complete_step(record, record.LockedBy, step, NOW, reference=f"ref-{step}")
    return record


# --- (none) -> Pending ---------------------------------------------------------------


def test_new_record_is_pending_unlocked_with_no_deadline(order):
    record = sm.new_record(order, NOW, STEPS)
    assert record.ProcessState is ProcessState.PENDING
    assert record.LockedBy is None
    assert record.CompleteBy is None
    assert record.FailureCount == 0
    assert record.Attempt == 0
    assert record.ReplyTo == "replies-webshop"
    assert record.id == "webshop:ORD-1"
    assert record.order_id == "ORD-1"
    assert record.OrderDigest == order.digest()
    assert set(record.Steps) == set(STEPS)
    assert all(s.Status is StepStatus.NOT_STARTED for s in record.Steps.values())


def test_rejected_record_is_terminal_with_reason(order):
    record = sm.rejected_record(order, NOW, "backlog above 10")
    assert record.ProcessState is ProcessState.REJECTED
    assert record.LastError == "backlog above 10"
    assert record.ttl is not None


# --- Pending -> Processing (Starter) ---------------------------------------------------


def test_claim_sets_lock_attempt_and_deadline(pending, policy):
    record = sm.claim(pending, NOW, policy)
    assert record.ProcessState is ProcessState.PROCESSING
    assert record.LockedBy == "webshop:ORD-1:1"
    assert record.Attempt == 1
    # set at claim time so a starter crash before the start is still recovered
    assert record.CompleteBy == NOW + policy.claim_timeout


@pytest.mark.parametrize(
    "state",
    [s for s in ProcessState if s is not ProcessState.PENDING],
)
def test_claim_refused_outside_pending(pending, policy, state):
    record = pending.model_copy(update={"ProcessState": state})
    with pytest.raises(sm.IllegalTransition):
        sm.claim(record, NOW, policy)


def test_claim_refused_when_locked(pending, policy):
    with pytest.raises(sm.IllegalTransition):
        sm.claim(pending.model_copy(update={"LockedBy": "webshop:ORD-1:9"}), NOW, policy)


def test_claim_refused_during_long_retry_wait(pending, policy):
    waiting = pending.model_copy(update={"NotBefore": LATER})
    assert not sm.is_claimable(waiting, NOW)
    with pytest.raises(sm.IllegalTransition):
        sm.claim(waiting, NOW, policy)
    assert sm.claim(waiting, LATER, policy).ProcessState is ProcessState.PROCESSING


def test_second_attempt_gets_a_new_instance_id(pending, policy):
    first = sm.claim(pending, NOW, policy)
    back = sm.recover_expired(first, first.LockedBy, LATER, policy)
    second = sm.claim(back, LATER, policy)
    assert second.LockedBy == "webshop:ORD-1:2"
    assert second.Attempt == 2


# --- Processing -> Processing (orchestration progress) -----------------------------------


def test_complete_step_by_owner(processing):
    record = start_step(processing, STEPS[0], NOW, NOW + timedelta(seconds=30))
    record = sm.complete_step(record, "webshop:ORD-1:1", STEPS[0], NOW, reference="res-1")
    assert record.Steps[STEPS[0]].Status is StepStatus.COMPLETED
    assert [e.Step for e in record.Compensation] == [STEPS[0]]


def test_complete_step_twice_is_idempotent(processing):
    record = sm.complete_step(processing, "webshop:ORD-1:1", STEPS[0], NOW)
    assert sm.complete_step(record, "webshop:ORD-1:1", STEPS[0], NOW) == record


def test_a_claim_never_marks_a_completed_step(pending, policy):
    done = pending.Steps[STEPS[0]].model_copy(update={"Status": StepStatus.COMPLETED})
    record = pending.model_copy(update={"Steps": {**pending.Steps, STEPS[0]: done}})
    with pytest.raises(sm.IllegalTransition, match="already Completed"):
        sm.claim_marking(record, NOW, policy, [STEPS[0]], LATER)


@pytest.mark.parametrize(
    "write",
    [
        lambda r: sm.complete_step(r, "webshop:ORD-1:0", STEPS[0], NOW),
        lambda r: sm.mark_processed(r, "webshop:ORD-1:0", NOW),
        lambda r: sm.mark_failed(r, "webshop:ORD-1:0", STEPS[0], "boom", NOW),
        lambda r: sm.begin_compensation(r, "webshop:ORD-1:0", "boom", NOW, STEPS[0]),
    ],
    ids=["complete_step", "processed", "failed", "compensate"],
)
def test_stale_attempt_never_writes(processing, write):
    """Invariant 3: a write without the lock is refused as stale."""
    with pytest.raises(StaleError):
        write(processing)


# --- Processing -> Processed / Error ----------------------------------------------------


def test_processed_when_all_steps_completed(processing):
    record = sm.mark_processed(run_all_steps(processing), "webshop:ORD-1:1", NOW)
    assert record.ProcessState is ProcessState.PROCESSED
    assert record.LockedBy is None
    assert record.CompleteBy is None
    assert record.ttl == sm.FINISHED_RECORD_TTL_SECONDS


def test_processed_refused_with_unfinished_steps(processing):
    with pytest.raises(sm.IllegalTransition, match="unfinished"):
        sm.mark_processed(processing, "webshop:ORD-1:1", NOW)


def test_error_on_permanent_agent_failure(processing):
    record = sm.mark_failed(processing, "webshop:ORD-1:1", STEPS[0], "card declined", NOW)
    assert record.ProcessState is ProcessState.ERROR
    assert record.LastError == "card declined"
    assert record.Steps[STEPS[0]].Status is StepStatus.FAILED


@pytest.mark.parametrize(
    "state",
    [ProcessState.PENDING, ProcessState.PROCESSED, ProcessState.ERROR, ProcessState.REJECTED],
)
def test_orchestration_writes_need_processing(processing, state):
    record = processing.model_copy(update={"ProcessState": state})
    with pytest.raises(sm.IllegalTransition):
        sm.mark_failed(record, "webshop:ORD-1:1", None, "x", NOW)


# --- Supervisor ---------------------------------------------------------------------------


def test_recover_expired_below_threshold_returns_to_pending(processing, policy):
    record = sm.recover_expired(processing, "webshop:ORD-1:1", LATER, policy)
    assert record.ProcessState is ProcessState.PENDING
    assert record.LockedBy is None
    assert record.CompleteBy is None
    assert record.FailureCount == 1
    assert "missed its deadline" in record.LastError


def test_recover_refuses_unexpired(processing, policy):
    with pytest.raises(sm.IllegalTransition):
        sm.recover_expired(processing, "webshop:ORD-1:1", NOW, policy)


def test_recover_refuses_when_owner_changed(processing, policy):
    with pytest.raises(StaleError):
        sm.recover_expired(processing, "webshop:ORD-1:0", LATER, policy)


def test_clock_skew_slack_protects_a_live_attempt(processing, policy):
    just_after = processing.CompleteBy + timedelta(seconds=5)
    assert sm.is_expired(processing, just_after)
    assert not sm.is_expired(processing, just_after, slack=timedelta(seconds=10))
    with pytest.raises(sm.IllegalTransition):
        sm.recover_expired(
            processing, "webshop:ORD-1:1", just_after, policy, slack=timedelta(seconds=10)
        )


def test_budget_quick_then_long_retry_then_error(pending, policy):
    """Invariant 5: FailureCount never exceeds threshold + long retries."""
    record, now, outcomes = pending, NOW, []
    for _ in range(20):
        if record.ProcessState is ProcessState.ERROR:
            break
        now = max(now, record.NotBefore or now)
        record = sm.claim(record, now, policy)
        now = record.CompleteBy + timedelta(seconds=1)
        record = sm.recover_expired(record, record.LockedBy, now, policy)
        outcomes.append((record.ProcessState, record.NotBefore is not None))
    assert outcomes == [
        (ProcessState.PENDING, False),
        (ProcessState.PENDING, False),
        (ProcessState.PENDING, True),  # threshold reached: wait long_delay
        (ProcessState.ERROR, False),
    ]
    assert record.FailureCount == policy.max_failures == 4
    assert record.LongRetries == 1


def test_recover_refused_outside_processing(pending, policy):
    with pytest.raises(sm.IllegalTransition):
        sm.recover_expired(pending.model_copy(update={"CompleteBy": NOW}), None, LATER, policy)


# --- Compensation ---------------------------------------------------------------------------


def test_compensation_in_reverse_order_to_compensated(processing):
    record = processing
    for step in STEPS[:2]:
        record = sm.complete_step(record, "webshop:ORD-1:1", step, NOW, reference=f"ref-{step}")
    record = sm.begin_compensation(record, "webshop:ORD-1:1", "shipping refused", NOW, STEPS[2])
    assert record.ProcessState is ProcessState.COMPENSATING
    assert [e.Step for e in record.Compensation] == STEPS  # the failed step's too
    for entry in reversed(record.Compensation):
        record = sm.record_undo(record, "webshop:ORD-1:1", entry.Step, True, NOW)
    record = sm.finish_compensation(record, "webshop:ORD-1:1", NOW)
    assert record.ProcessState is ProcessState.COMPENSATED
    assert record.Steps[STEPS[0]].Status is StepStatus.COMPENSATED


def test_compensation_failure_names_the_step(processing):
    record = sm.complete_step(processing, "webshop:ORD-1:1", STEPS[0], NOW)
    record = sm.begin_compensation(record, "webshop:ORD-1:1", "later step refused", NOW, STEPS[1])
    record = sm.record_undo(record, "webshop:ORD-1:1", STEPS[1], True, NOW)
    record = sm.record_undo(record, "webshop:ORD-1:1", STEPS[0], False, NOW, error="refund refused")
    record = sm.finish_compensation(record, "webshop:ORD-1:1", NOW)
    assert record.ProcessState is ProcessState.COMPENSATION_FAILED
    assert STEPS[0] in record.LastError
    # ... and the cause, which the alert and the client's status carry too
    assert "refund refused" in record.LastError
    assert "refund refused" in record.PendingStatus.Detail


def test_a_compensation_that_succeeds_clears_the_old_undo_failure(processing):
    record = sm.complete_step(processing, "webshop:ORD-1:1", STEPS[0], NOW)
    record = sm.begin_compensation(record, "webshop:ORD-1:1", "later step refused", NOW, STEPS[1])
    record = sm.record_undo(record, "webshop:ORD-1:1", STEPS[1], True, NOW)
    record = sm.record_undo(record, "webshop:ORD-1:1", STEPS[0], False, NOW, error="refund refused")
    assert record.LastError is not None
    record = sm.record_undo(record, "webshop:ORD-1:1", STEPS[0], True, NOW)  # the operator's retry
    record = sm.finish_compensation(record, "webshop:ORD-1:1", NOW)
    assert record.ProcessState is ProcessState.COMPENSATED
    assert record.LastError is None


def test_operator_compensation_takes_a_new_lock(processing, policy):
    record = sm.complete_step(processing, "webshop:ORD-1:1", STEPS[0], NOW)
    record = sm.mark_failed(record, "webshop:ORD-1:1", STEPS[1], "declined", NOW)
    record = sm.claim_compensation(record, LATER)
    assert record.ProcessState is ProcessState.COMPENSATING
    assert record.LockedBy == "webshop:ORD-1:2"
    with pytest.raises(StaleError):
        sm.record_undo(record, "webshop:ORD-1:1", STEPS[0], True, LATER)


@pytest.mark.parametrize(
    "state",
    [ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.PROCESSED, ProcessState.REJECTED],
)
def test_operator_compensation_only_from_error_states(processing, policy, state):
    with pytest.raises(sm.IllegalTransition):
        sm.claim_compensation(processing.model_copy(update={"ProcessState": state}), NOW)


# --- Operator resubmit --------------------------------------------------------------------


def test_resubmit_error_to_pending_keeps_completed_steps(processing):
    record = sm.complete_step(processing, "webshop:ORD-1:1", STEPS[0], NOW)
    record = sm.mark_failed(record, "webshop:ORD-1:1", STEPS[1], "declined", NOW)
    record = sm.resubmit(record, LATER)
    assert record.ProcessState is ProcessState.PENDING
    assert record.LockedBy is None
    assert record.FailureCount == 0
    assert record.Steps[STEPS[0]].Status is StepStatus.COMPLETED


@pytest.mark.parametrize("state", [s for s in ProcessState if s is not ProcessState.ERROR])
def test_resubmit_only_from_error(processing, state):
    with pytest.raises(sm.IllegalTransition):
        sm.resubmit(processing.model_copy(update={"ProcessState": state}), NOW)


def test_history_is_bounded(pending, policy):
    record, now = pending, NOW
    for _ in range(30):
        record = sm.claim(record, now, policy)
        now = record.CompleteBy + timedelta(seconds=1)
        record = sm.recover_expired(record, record.LockedBy, now, sm.RetryPolicy(threshold=1000))
    assert len(record.History) == sm.HISTORY_LIMIT


def test_operator_requests_compensation_then_starter_claims_it(processing, policy):
    record = sm.complete_step(processing, "webshop:ORD-1:1", STEPS[0], NOW)
    record = sm.mark_failed(record, "webshop:ORD-1:1", STEPS[1], "declined", NOW)
    record = sm.request_compensation(record, LATER)
    assert record.CompensationRequested
    assert record.ProcessState is ProcessState.ERROR
    claimed = sm.claim_compensation(record, LATER)
    assert claimed.ProcessState is ProcessState.COMPENSATING
    assert not claimed.CompensationRequested
    with pytest.raises(sm.IllegalTransition):
        sm.claim_compensation(claimed, LATER)


@pytest.mark.parametrize(
    "state", [ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.PROCESSED]
)
def test_compensation_can_only_be_requested_for_failed_orders(processing, state):
    with pytest.raises(sm.IllegalTransition):
        sm.request_compensation(processing.model_copy(update={"ProcessState": state}), NOW)


# --- provider text (issue 11, defect 3) ----------------------------------------------

_AWKWARD = [
    "",
    "x" * 221,
    "\u00e9" * 4096,
    "\ud800bad surrogate",
    "tab\tnew\nline\x00nul",
    "\U0001f4b3" * 600,
    "\u202eright-to-left " * 100,
]


@pytest.mark.parametrize("text", _AWKWARD)
def test_any_provider_text_fits_every_record_field(processing, text):
    """A provider message of any length or content never makes a write fail
    validation: LastError, the history reason and the compensation log."""
    iid = processing.LockedBy
    t = NOW + timedelta(seconds=1)
    failed = sm.mark_failed(processing, iid, "reserve-inventory", f"step failed: {text}", t)
    OrderState.model_validate(failed.model_dump())
    started = sm.complete_step(
        start_step(processing, "reserve-inventory", t, t),
        iid,
        "reserve-inventory",
        t,
        "ref",
    )
    comp = sm.begin_compensation(
        start_step(started, "charge-payment", t, t), iid, text, t, "charge-payment"
    )
    undone = sm.record_undo(comp, iid, "charge-payment", False, t, text)
    transient = sm.record_transient(started, iid, "charge-payment", text, t)
    for record in (comp, undone, transient):
        OrderState.model_validate(record.model_dump())
        record.model_dump_json()  # encodable: no lone surrogates left


def test_short_text_keeps_the_useful_start():
    text = "card declined: insufficient funds " + "detail " * 200
    short = sm.short_text(text, 100)
    assert short.startswith("card declined: insufficient funds")
    assert len(short) == 100


def _reserved(record, t):
    """`record` with its first step (reserve-inventory) started and done at `t`."""
    iid = record.LockedBy
    started = start_step(record, "reserve-inventory", t, t)
    return sm.complete_step(started, iid, "reserve-inventory", t, "ref")


def test_begin_compensation_logs_every_sent_step(processing):
    """Defect 2: Running and Failed steps enter the undo log, not only Completed ones."""
    iid = processing.LockedBy
    t = NOW
    record = _reserved(processing, t)
    record = sm.begin_compensation(
        start_step(record, "charge-payment", t, t), iid, "declined", t, "charge-payment"
    )
    assert [e.Step for e in record.Compensation] == ["reserve-inventory", "charge-payment"]
    assert record.Steps["charge-payment"].Status.value == "Failed"


def test_the_failed_step_is_undone_even_when_unmarked(processing):
    """2.4's finish unmarks the steps this attempt never sent (unmark_unsent)
    and then begins the compensation, or fails the order, naming the failed
    step: that step is Failed, so in the undo log, even if a caller had made
    it NotStarted first (the guard that makes sim/mutants.json's
    wf24-unsent-includes-failed equivalent)."""
    iid = processing.LockedBy
    t = NOW
    record = start_step(_reserved(processing, t), "charge-payment", t, t)
    unmarked = sm.unmark_unsent(record, iid, ["charge-payment"])
    assert unmarked.Steps["charge-payment"].Status.value == "NotStarted"
    begun = sm.begin_compensation(unmarked, iid, "declined", t, "charge-payment")
    assert [e.Step for e in begun.Compensation] == ["reserve-inventory", "charge-payment"]
    failed = sm.mark_failed(
        sm.unmark_unsent(
            start_step(processing, "reserve-inventory", t, t), iid, ["reserve-inventory"]
        ),
        iid,
        "reserve-inventory",
        "declined",
        t,
    )
    assert failed.Steps["reserve-inventory"].Status.value == "Failed"
    assert [e.Step for e in sm.undo_log(failed)] == ["reserve-inventory"]


# --- an undelivered terminal status survives an operator's compensation (review defect 2) --


def test_claiming_a_compensation_keeps_an_undelivered_failed_status(processing, policy):
    """The Failed status still in the outbox (its send failed; the Starter has
    not delivered it yet) must reach the client: claiming the compensation
    keeps it for the Starter to deliver, instead of dropping it."""
    record = sm.mark_failed(processing, "webshop:ORD-1:1", STEPS[1], "declined", NOW)
    unsent = record.PendingStatus
    record = sm.request_compensation(record, LATER)
    claimed = sm.claim_compensation(record, LATER)
    assert claimed.ProcessState is ProcessState.COMPENSATING
    assert claimed.PendingStatus == unsent
    # and a restart of that compensation keeps it too
    restarted = sm.restart_compensation(claimed, claimed.LockedBy, LATER)
    assert restarted.PendingStatus == unsent


def test_the_final_status_replaces_one_still_undelivered_when_compensation_ends(processing, policy):
    """DESIGN §4: the client sees every terminal status, or at least the final
    one. An entry still undelivered when the compensation ends gives way to
    the final status (one outbox entry; the History keeps the transition)."""
    record = sm.complete_step(processing, "webshop:ORD-1:1", STEPS[0], NOW)
    record = sm.mark_failed(record, "webshop:ORD-1:1", STEPS[1], "declined", NOW)
    claimed = sm.claim_compensation(sm.request_compensation(record, LATER), LATER)
    assert claimed.PendingStatus.Status.value == "Failed"
    for step in (STEPS[1], STEPS[0]):
        claimed = sm.record_undo(claimed, claimed.LockedBy, step, True, LATER)
    done = sm.finish_compensation(claimed, claimed.LockedBy, LATER)
    assert done.PendingStatus.Status.value == "Compensated"
    assert [h.To.value for h in done.History][-3:] == ["Error", "Compensating", "Compensated"]


def test_clearing_a_sent_status_leaves_the_entry_that_replaced_it(processing, policy):
    """The sender of the Failed status clears it by its message id: when the
    compensation's final status replaced it meanwhile (its send still in
    flight), the clear leaves the Compensated entry to be sent (ADR 001;
    mutant `outbox-clear-any-entry`, sim/mutants.json, which the
    simulation's interleavings did not reach)."""
    record = sm.complete_step(processing, "webshop:ORD-1:1", STEPS[0], NOW)
    record = sm.mark_failed(record, "webshop:ORD-1:1", STEPS[1], "declined", NOW)
    failed_id = record.PendingStatus.MessageId
    claimed = sm.claim_compensation(sm.request_compensation(record, LATER), LATER)
    for step in (STEPS[1], STEPS[0]):
        claimed = sm.record_undo(claimed, claimed.LockedBy, step, True, LATER)
    done = sm.finish_compensation(claimed, claimed.LockedBy, LATER)
    assert done.PendingStatus.MessageId != failed_id
    assert sm.mark_status_sent(done, failed_id, LATER).PendingStatus == done.PendingStatus
    assert sm.mark_status_sent(done, done.PendingStatus.MessageId, LATER).PendingStatus is None


@pytest.mark.parametrize(
    "reference",
    [
        "R" * 5000,
        "réf-ünïcødé-参照-🧾" * 20,
        "line\nbreak\x00nul\u202etrl",
        "4111 1111 1111 1111",
        12345678901234567890,
        {"nested": {"Reference": ["a", 1, None]}},
    ],
)
def test_any_provider_reference_is_recorded_within_bounds(processing, reference):
    """Issue 21 item 3 (seeds 15, 28): the step's side effect already happened,
    so whatever the provider called it must not make the write fail; the record
    keeps bounded, clean text with no card number, and reads back."""
    done = sm.complete_step(processing, processing.LockedBy, "reserve-inventory", NOW, reference)
    kept = done.Steps["reserve-inventory"].Reference
    assert kept is not None
    assert len(kept) <= MAX_REFERENCE
    assert "4111" not in kept
    assert all(ch.isprintable() for ch in kept)
    assert done.Compensation[-1].Reference == kept
    assert OrderState.model_validate(done.model_dump()) == done


@pytest.mark.parametrize("reference", [None, "", "   "])
def test_an_empty_provider_reference_is_recorded_as_none(processing, reference):
    done = sm.complete_step(processing, processing.LockedBy, "reserve-inventory", NOW, reference)
    assert done.Steps["reserve-inventory"].Reference is None


def test_a_field_this_version_does_not_know_is_kept_through_its_writes(processing):
    """Issue 21 item 4: a newer version (a rolling deploy, a rollback) or a
    portal edit adds a field; this version reads the record, writes it, and
    the field is still there, where before the record could not be read."""
    doc = processing.model_dump(mode="json")
    doc["NewerVersionField"] = {"Since": "3.0"}
    doc["Steps"] = {"reserve-inventory": {"Status": "NotStarted", "NewerStepField": 1}}
    record = OrderState.model_validate(doc)
    done = sm.complete_step(record, record.LockedBy, "reserve-inventory", NOW, "ref-1")
    dumped = done.model_dump(mode="json")
    assert dumped["NewerVersionField"] == {"Since": "3.0"}
    assert dumped["Steps"]["reserve-inventory"]["NewerStepField"] == 1
    assert dumped["Steps"]["reserve-inventory"]["Status"] == "Completed"


def test_a_value_this_version_cannot_take_still_refuses_the_record(processing):
    doc = processing.model_dump(mode="json")
    doc["FailureCount"] = "many"
    with pytest.raises(ValueError, match="FailureCount"):
        OrderState.model_validate(doc)
