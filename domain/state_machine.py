"""The state record's transitions (docs/design.md §3) as pure functions.

Each function takes the record as read, checks that the transition is allowed
from its state and for its caller, and returns the record to write. It never
writes: the store adapter does that with a conditional replace on the etag the
record was read with, and (for orchestration writes) the `LockedBy` guard that
`require_owner` checks here too. Refusals raise:

- `IllegalTransition`: the record's state does not allow this move;
- `StaleError` (domain.errors): the caller no longer owns the record.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, overload

from domain.errors import DomainError, StaleError
from domain.ids import attempt_instance_id, order_key, status_message_id
from domain.models import (
    TERMINAL_STATES,
    CompensationEntry,
    HistoryEntry,
    OrderState,
    OrderSubmitted,
    PendingStatus,
    ProcessState,
    StatusKind,
    StepState,
    StepStatus,
    mask_card_numbers,
    provider_reference,
)

HISTORY_LIMIT = 20
FINISHED_RECORD_TTL_SECONDS = 90 * 24 * 3600
REASON_LIMIT = 300  # HistoryEntry.Reason, StepState.Error
ERROR_LIMIT = 500  # LastError, CompensationEntry.Error, PendingStatus.Detail
# Restarts of a compensation whose instance died (docs/adr/003); a long retry
# of an unconfirmed undo is not one (RetryPolicy.undo_long_retries, ADR 019a).
MAX_COMPENSATION_RESTARTS = 3
# Steps whose request may have reached the remote service: compensation undoes
# them all (undo of what never happened is a no-op by the agent contract).
SENT_STEP_STATES = frozenset({StepStatus.RUNNING, StepStatus.FAILED, StepStatus.COMPLETED})


@overload
def short_text(text: str, limit: int) -> str: ...
@overload
def short_text(text: None, limit: int) -> None: ...
def short_text(text: str | None, limit: int) -> str | None:
    """Text from outside (a provider's error message) made safe for a bounded
    record field: any length, any code points in, at most `limit` characters
    out, keeping the start (where the useful part of an error usually is).

    Control and format characters become spaces, runs of whitespace collapse,
    and lone surrogates (which cannot be encoded as UTF-8, so no store could
    write them) are replaced. Card-number-like digit runs are masked
    (domain.models.mask_card_numbers): every reason, LastError, History entry,
    step and undo error and outbox detail passes here, and a provider may quote
    the card it declined. Masked after the clean-up (a control character
    between the digits must not hide a number) and before the cut (a number
    cut short must not slip through as a shorter run)."""
    if text is None:
        return None
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in text)
    text = mask_card_numbers(" ".join(text.split()))
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def pending_status(
    record: OrderState,
    status: StatusKind,
    now: datetime,
    qualifier: str,
    *,
    detail: str | None = None,
    step: str | None = None,
) -> PendingStatus:
    """The outbox entry for a terminal status (docs/adr/001-status-outbox.md).
    The message id is fixed here, once, so every later send repeats it."""
    return PendingStatus(
        Status=status,
        MessageId=status_message_id(record.id, status.value, qualifier),
        Detail=short_text(detail, ERROR_LIMIT),
        Step=step,
        At=now,
    )


class IllegalTransition(DomainError):
    """The record's current state does not allow the requested transition."""


@dataclass(frozen=True)
class RetryPolicy:
    """The end-to-end retry budget the Supervisor owns.

    `threshold` quick retries (each one a full attempt that timed out), then
    `long_retries` more after `long_delay` each, then Error. FailureCount can
    therefore never exceed threshold + long_retries (invariant 5)."""

    threshold: int = 10
    long_retries: int = 1
    long_delay: timedelta = timedelta(hours=1)
    claim_timeout: timedelta = timedelta(seconds=60)
    # A compensation whose undo ended unconfirmed (every try transient,
    # unanswered or lost) waits `long_delay` and is tried again, at
    # most this many times (a day at the default delay), then CompensationFailed
    # (docs/adr/019a-unconfirmed-undo-long-retry.md).
    undo_long_retries: int = 24

    @property
    def max_failures(self) -> int:
        return self.threshold + self.long_retries


def _with_history(
    record: OrderState, to: ProcessState, by: str, now: datetime, reason: str | None = None
) -> list[HistoryEntry]:
    entry = HistoryEntry(
        At=now, From=record.ProcessState, To=to, By=by, Reason=short_text(reason, REASON_LIMIT)
    )
    return [*record.History, entry][-HISTORY_LIMIT:]


def _after_undo_log(record: OrderState, now: datetime) -> datetime:
    """When a new compensation attempt is written: `now`, or later than every
    undo entry the record holds if one says so. The entries' At come from the
    clocks of the hosts that wrote them, and one running ahead would otherwise
    date an entry of the dead attempt after the restart that followed it; the
    Starter would then take it for the new attempt's own write and count a
    restart for an attempt that never started (orchestrators.starter._never_started)."""
    written = [e.At for e in record.Compensation if e.At is not None]
    return max([now, *written])


def _after_history(record: OrderState, now: datetime) -> datetime:
    """When an attempt's undo entry is written: `now`, or just after the
    record's last transition if the writer's clock is behind the clock that
    dated it, so an entry the new attempt writes is never dated before the
    restart that made it (_never_started)."""
    if not record.History:
        return now
    return max(now, record.History[-1].At + timedelta(microseconds=1))


def _finish(record: OrderState, to: ProcessState, by: str, now: datetime, **changes) -> OrderState:
    """Common tail of every transition: history, timestamps, TTL when terminal.
    `reason`: why, in the history entry; `error`: why, for a failure, which is
    the record's LastError too."""
    reason, error = changes.pop("reason", None), changes.pop("error", None)
    if error is not None:
        reason, changes["LastError"] = error, short_text(error, ERROR_LIMIT)
    history = _with_history(record, to, by, now, reason)
    ttl = FINISHED_RECORD_TTL_SECONDS if to in TERMINAL_STATES else None
    return record.model_copy(
        update={"ProcessState": to, "History": history, "UpdatedAt": now, "ttl": ttl, **changes},
        deep=True,
    )


_FAILURE_STATUS = {
    ProcessState.ERROR: StatusKind.FAILED,
    ProcessState.COMPENSATION_FAILED: StatusKind.COMPENSATION_FAILED,
}


def _end_in_failure(
    record: OrderState,
    to: ProcessState,
    by: str,
    now: datetime,
    reason: str,
    qualifier: str,
    step: str | None = None,
    **changes,
) -> OrderState:
    """Common tail of the transitions to Error or CompensationFailed: the owner
    lets go, the reason becomes LastError, and the client's Failed or
    CompensationFailed status waits in the outbox (docs/adr/001-status-outbox.md)."""
    status = _FAILURE_STATUS[to]
    return _finish(
        record,
        to,
        by,
        now,
        error=reason,
        LockedBy=None,
        PendingStatus=pending_status(record, status, now, qualifier, detail=reason, step=step),
        **changes,
    )


def require_owner(record: OrderState, instance_id: str) -> None:
    """The fencing check every orchestration write makes."""
    if record.LockedBy != instance_id:
        raise StaleError(
            f"order {record.id} is locked by {record.LockedBy!r}, not by {instance_id!r}"
        )


def _require(record: OrderState, *states: ProcessState, action: str) -> None:
    if record.ProcessState not in states:
        allowed = ", ".join(s.value for s in states)
        raise IllegalTransition(
            f"cannot {action} order {record.id} in state {record.ProcessState.value} "
            f"(allowed from: {allowed})"
        )


# --- Submit -------------------------------------------------------------------------


def new_record(
    order: OrderSubmitted, now: datetime, steps: list[str], key: str | None = None
) -> OrderState:
    """(none) -> Pending: the first write, by Submit. `key`: the order's key,
    domain.ids.order_key of its application and OrderID unless given."""
    return OrderState(
        id=key if key is not None else order_key(order.AppId, order.OrderID),
        ProcessState=ProcessState.PENDING,
        LockedBy=None,
        CompleteBy=None,
        FailureCount=0,
        Attempt=0,
        AppId=order.AppId,
        ReplyTo=order.ReplyTo,
        OrderDigest=order.digest(),
        Steps={name: StepState() for name in steps},
        History=[HistoryEntry(At=now, From=None, To=ProcessState.PENDING, By="submit")],
        CreatedAt=now,
        UpdatedAt=now,
    )


def rejected_record(
    order: OrderSubmitted, now: datetime, reason: str, key: str | None = None
) -> OrderState:
    """(none) -> Rejected: admission control refused the order (backlog)."""
    record = new_record(order, now, steps=[], key=key)
    return _finish(
        record,
        ProcessState.REJECTED,
        "submit",
        now,
        error=reason,
    )


def readmit(record: OrderState, now: datetime, steps: list[str]) -> OrderState:
    """Rejected -> Pending: the client sent the order again, as a Rejected
    status tells it to ("try later"), and the backlog now has room. The same
    record (its key, history and digest) starts over as a new order would;
    only Submit, after its own admission check, makes this transition."""
    _require(record, ProcessState.REJECTED, action="readmit")
    return _pending_afresh(
        record,
        "submit",
        now,
        "sent again with room in the backlog",
        LastError=None,
        ReceivedSent=False,
        PendingStatus=None,
        Steps={name: StepState() for name in steps},
        Compensation=[],
    )


def mark_received_sent(record: OrderState, now: datetime) -> OrderState:
    """Remember that `Received` went out, so a redelivery sends no second one."""
    return record.model_copy(update={"ReceivedSent": True, "UpdatedAt": now}, deep=True)


# --- Starter ------------------------------------------------------------------------


def is_claimable(record: OrderState, now: datetime) -> bool:
    return (
        record.ProcessState is ProcessState.PENDING
        and record.LockedBy is None
        and (record.NotBefore is None or record.NotBefore <= now)
    )


def claim(record: OrderState, now: datetime, policy: RetryPolicy) -> OrderState:
    """Pending, LockedBy null -> Processing, LockedBy = next attempt's instance id.

    CompleteBy is set here, not when the orchestration starts, so that a starter
    that dies between the claim and the start leaves a record the Supervisor
    will find (the gap the article leaves open)."""
    _require(record, ProcessState.PENDING, action="claim")
    if record.LockedBy is not None:
        raise IllegalTransition(f"order {record.id} is Pending but locked by {record.LockedBy}")
    if record.NotBefore is not None and record.NotBefore > now:
        raise IllegalTransition(
            f"order {record.id} waits for a long retry until {record.NotBefore.isoformat()}"
        )
    attempt = record.Attempt + 1
    return _finish(
        record,
        ProcessState.PROCESSING,
        "starter",
        now,
        LockedBy=attempt_instance_id(record.id, attempt),
        Attempt=attempt,
        CompleteBy=now + policy.claim_timeout,
        NotBefore=None,
    )


def claim_marking(
    record: OrderState, now: datetime, policy: RetryPolicy, steps: list[str], deadline: datetime
) -> OrderState:
    """The Starter's claim (docs/adr/021a-claim-marks-the-attempt.md): the
    claim of `claim`, which also marks each of `steps` (the attempt's steps
    to do: every step not Completed) Running for this attempt until
    `deadline`, the attempt's one deadline, which is also the record's
    CompleteBy. The record then shows every step this attempt may send as
    possibly sent before any is, so compensation from the record alone undoes
    whatever may have happened (undoing too much is safe), and the attempt
    needs no write until its end. A step already Completed is never
    marked (it is not one of `steps`: resume skips it)."""
    claimed = claim(record, now, policy)
    marked = dict(claimed.Steps)
    for name in steps:
        marked[name] = _running(claimed, name, now, deadline)
    return claimed.model_copy(update={"Steps": marked, "CompleteBy": deadline}, deep=True)


def _running(record: OrderState, step: str, now: datetime, deadline: datetime) -> StepState:
    """`step` Running for the record's attempt until `deadline` (a step
    already Completed is never sent again)."""
    current = record.Steps.get(step, StepState())
    if current.Status is StepStatus.COMPLETED:
        raise IllegalTransition(f"step {step} of order {record.id} is already Completed")
    return current.model_copy(
        update={
            "Status": StepStatus.RUNNING,
            "Attempt": record.Attempt,
            "StartedAt": now,
            "CompleteBy": deadline,
            "Error": None,
        }
    )


def unmark_unsent(record: OrderState, instance_id: str, steps: list[str]) -> OrderState:
    """`steps`, which this attempt's claim marked Running though no
    attempt had sent them before (NotStarted then) and this attempt never
    sent, are NotStarted again: the record shows possibly sent exactly what
    may have been, so compensation does not undo what never happened. A step
    not Running for this attempt is left as it is."""
    require_owner(record, instance_id)
    marked = dict(record.Steps)
    for name in steps:
        state = marked.get(name)
        if (
            state is not None
            and state.Status is StepStatus.RUNNING
            and state.Attempt == record.Attempt
        ):
            marked[name] = StepState()
    return record.model_copy(update={"Steps": marked}, deep=True)


# --- Scheduler (orchestration) ---------------------------------------------------------


def complete_step(
    record: OrderState,
    instance_id: str,
    step: str,
    now: datetime,
    reference: str | None = None,
) -> OrderState:
    """Processing -> Processing: the step is Completed and enters the
    compensation log (what to undo, should a later step fail for good)."""
    require_owner(record, instance_id)
    _require(record, ProcessState.PROCESSING, action="complete a step of")
    # model_copy does not validate: bound the provider's text here, or a long
    # reference would make this write (after the side effect) fail on every try.
    reference = provider_reference(reference)
    steps = dict(record.Steps)
    current = steps.get(step, StepState())
    if current.Status is StepStatus.COMPLETED:
        return record  # idempotent: a replayed activity completes nothing twice
    steps[step] = current.model_copy(
        update={
            "Status": StepStatus.COMPLETED,
            "CompletedAt": now,
            "Reference": reference,
            "Error": None,
        }
    )
    log = [e for e in record.Compensation if e.Step != step]
    log.append(CompensationEntry(Step=step, Reference=reference))
    return record.model_copy(
        update={"Steps": steps, "Compensation": log, "UpdatedAt": now}, deep=True
    )


def record_transient(
    record: OrderState, instance_id: str, step: str, reason: str, now: datetime
) -> OrderState:
    """Processing -> Processing: the agent gave up on `step` for now (a
    transient reply). The reason is kept on the step and in LastError so the
    Supervisor's retry or Error names it; the record stays for the Supervisor."""
    require_owner(record, instance_id)
    _require(record, ProcessState.PROCESSING, action="note a transient failure of")
    steps = dict(record.Steps)
    current = steps.get(step, StepState())
    steps[step] = current.model_copy(update={"Error": short_text(reason, REASON_LIMIT)})
    return record.model_copy(
        update={"Steps": steps, "LastError": short_text(reason, ERROR_LIMIT), "UpdatedAt": now},
        deep=True,
    )


def mark_processed(record: OrderState, instance_id: str, now: datetime) -> OrderState:
    """Processing -> Processed: every step Completed."""
    require_owner(record, instance_id)
    _require(record, ProcessState.PROCESSING, action="finish")
    unfinished = [n for n, s in record.Steps.items() if s.Status is not StepStatus.COMPLETED]
    if unfinished:
        raise IllegalTransition(f"order {record.id} has unfinished steps: {', '.join(unfinished)}")
    return _finish(
        record,
        ProcessState.PROCESSED,
        instance_id,
        now,
        CompleteBy=None,
        LockedBy=None,
        # One id per order, not per attempt: an order is Processed once, and an
        # attempt whose status went out before its write failed (ADR 021j)
        # must not let the next attempt's Processed reach the client as another.
        PendingStatus=pending_status(record, StatusKind.PROCESSED, now, ""),
    )


def mark_failed(
    record: OrderState, instance_id: str, step: str | None, reason: str, now: datetime
) -> OrderState:
    """Processing -> Error: an agent answered with a non-transient failure and
    there is nothing to undo (otherwise the orchestration compensates first)."""
    require_owner(record, instance_id)
    _require(record, ProcessState.PROCESSING, action="fail")
    steps = dict(record.Steps)
    if step is not None and step in steps:
        steps[step] = steps[step].model_copy(update={"Status": StepStatus.FAILED})
    return _end_in_failure(
        record,
        ProcessState.ERROR,
        instance_id,
        now,
        short_text(reason, ERROR_LIMIT),
        str(record.Attempt),
        step,
        CompleteBy=None,
        Steps=steps,
    )


# --- Compensation ---------------------------------------------------------------------


def undo_log(
    record: OrderState, steps: dict[str, StepState] | None = None
) -> list[CompensationEntry]:
    """The compensation log extended with every step whose request was sent
    (Running, Failed, Completed) and that has no entry yet: undoing too much is
    safe (undo of nothing is a no-op), undoing too little leaves a side effect
    behind. Entries keep their order (completion order); new ones follow in
    step order, so the undo (in reverse) starts with the latest step."""
    steps = record.Steps if steps is None else steps
    logged = {e.Step for e in record.Compensation}
    extra = [
        CompensationEntry(Step=name, Reference=state.Reference)
        for name, state in steps.items()
        if state.Status in SENT_STEP_STATES and name not in logged
    ]
    return [*record.Compensation, *extra]


def begin_compensation(
    record: OrderState, instance_id: str, reason: str, now: datetime, step: str
) -> OrderState:
    """Processing -> Compensating: step `step` failed for good after earlier
    steps completed; the attempt that owns the record undoes every step whose
    request was sent, the failed one included."""
    require_owner(record, instance_id)
    _require(record, ProcessState.PROCESSING, action="compensate")
    steps = dict(record.Steps)
    if step in steps and steps[step].Status is not StepStatus.COMPLETED:
        steps[step] = steps[step].model_copy(update={"Status": StepStatus.FAILED})
    log = undo_log(record, steps)
    return _finish(
        record,
        ProcessState.COMPENSATING,
        instance_id,
        now,
        error=reason,
        CompleteBy=None,
        Steps=steps,
        Compensation=log,
    )


def request_compensation(record: OrderState, now: datetime, by: str = "operator") -> OrderState:
    """Error / CompensationFailed: an operator asks for the completed steps to
    be undone (again). The Starter picks the request up with claim_compensation."""
    _require(
        record,
        ProcessState.ERROR,
        ProcessState.COMPENSATION_FAILED,
        action="request compensation of",
    )
    history = _with_history(record, record.ProcessState, by, now, "compensation requested")
    return record.model_copy(
        update={"CompensationRequested": True, "History": history, "UpdatedAt": now}, deep=True
    )


def claim_compensation(record: OrderState, now: datetime) -> OrderState:
    """Error / CompensationFailed -> Compensating, on an operator's request: a
    new attempt takes the lock (guarded by the etag, like a claim).

    A terminal status still in the outbox (Failed or CompensationFailed whose
    send failed so far) stays there: the client must learn of it (docs/design.md §4,
    status delivery), and the Starter delivers it, before the claim when it
    can (orchestrators/starter.py) and otherwise in its outbox pass. Only the
    compensation's own terminal write replaces it, if it is still unsent by
    then: the client then sees at least the final status."""
    _require(
        record,
        ProcessState.ERROR,
        ProcessState.COMPENSATION_FAILED,
        action="start compensating",
    )
    log = [
        e.model_copy(update={"Outcome": "Pending", "Error": None}) if e.Outcome == "Failed" else e
        for e in undo_log(record)
    ]
    return _compensation_attempt(
        record,
        "operator",
        now,
        "compensation requested",
        CompleteBy=None,
        Compensation=log,
        CompensationRequested=False,
        CompensationRestarts=0,
        CompensationLongRetries=0,
        NotBefore=None,
    )


def _compensation_attempt(
    record: OrderState, by: str, now: datetime, reason: str, **changes: Any
) -> OrderState:
    """Compensating under a new attempt (a new instance id, so new message
    ids and reply events for every undo), dated after the undo log."""
    attempt = record.Attempt + 1
    return _finish(
        record,
        ProcessState.COMPENSATING,
        by,
        _after_undo_log(record, now),
        reason=reason,
        LockedBy=attempt_instance_id(record.id, attempt),
        Attempt=attempt,
        **changes,
    )


def restart_compensation(
    record: OrderState,
    expected_locked_by: str,
    now: datetime,
    max_restarts: int = MAX_COMPENSATION_RESTARTS,
    policy: RetryPolicy | None = None,
) -> OrderState:
    """Compensating, its instance gone (failed, terminated, never started) ->
    Compensating under a new attempt, or, once `max_restarts` restarts are
    spent: with `policy`, a long retry (NotBefore = now + long_delay, the
    restarts counted afresh after it, at most `policy.undo_long_retries` long
    retries in all), unless an undo was refused and none is left to try; else
    CompensationFailed (the caller raises the alert). An instance that keeps
    dying says nothing about whether the undos it did not reach happened: a
    Cosmos throttling storm or a host outage can kill three restarts within a
    minute, and a verdict then would name undos never sent.

    A new attempt, not the same instance started again: its instance id, and
    so every undo request's message id and reply event, is new, so duplicate
    detection cannot drop the restarted requests (it would, for the old ids,
    and each undo try would then wait out its deadline). The attempt number
    is also the fencing token the remote service expects to grow.

    A record waiting for the long retry of an unconfirmed undo (NotBefore set
    by defer_compensation) is woken instead, once NotBefore has passed: a new
    attempt too, but no restart is counted (ADR 019a)."""
    if record.LockedBy != expected_locked_by:
        raise StaleError(f"order {record.id} changed owner since it was read")
    _require(record, ProcessState.COMPENSATING, action="restart compensating")
    if record.NotBefore is not None:
        return _wake_compensation(record, now)
    if record.CompensationRestarts >= max_restarts:
        return _restarts_spent(record, now, policy)
    return _compensation_attempt(
        record,
        "starter",
        now,
        f"compensation restarted ({record.CompensationRestarts + 1} of {max_restarts})",
        CompensationRestarts=record.CompensationRestarts + 1,
    )


def _restarts_spent(record: OrderState, now: datetime, policy: RetryPolicy | None) -> OrderState:
    """restart_compensation once the restarts are spent: a long retry, or
    CompensationFailed."""
    # A refused undo settles the verdict, but not the undos after it: one
    # still Pending (never reached, or unconfirmed) is tried before the
    # verdict, or what it holds (reserved inventory) stays held.
    refused = any(e.Outcome == "Failed" for e in record.Compensation)
    still_open = any(e.Outcome == "Pending" for e in record.Compensation)
    if (
        policy is not None
        and (still_open or not refused)
        and record.CompensationLongRetries < policy.undo_long_retries
    ):
        retries = record.CompensationLongRetries + 1
        return _finish(
            record,
            ProcessState.COMPENSATING,
            "starter",
            now,
            reason=(
                f"compensation restarted {record.CompensationRestarts} times without "
                f"finishing; long retry {retries} of {policy.undo_long_retries}"
            ),
            NotBefore=now + policy.long_delay,
            CompensationRestarts=0,
            CompensationLongRetries=retries,
        )
    reason = (
        f"compensation restarted {record.CompensationRestarts} times without finishing; giving up"
    )
    return _end_in_failure(
        record,
        ProcessState.COMPENSATION_FAILED,
        "starter",
        now,
        reason,
        f"restarts/{record.Attempt}",
        CompleteBy=None,
    )


def compensation_waits(record: OrderState, now: datetime) -> bool:
    """A Compensating record in its long retry (defer_compensation): nothing
    restarts it before its NotBefore."""
    return (
        record.ProcessState is ProcessState.COMPENSATING
        and record.NotBefore is not None
        and record.NotBefore > now
    )


def _wake_compensation(record: OrderState, now: datetime) -> OrderState:
    """Compensating, its long retry due -> Compensating under a new attempt
    (restart_compensation, for a record defer_compensation left waiting). Not
    a restart of a dead instance: CompensationRestarts is left as it is; the
    long retry was counted (and bounded) when it was deferred."""
    if compensation_waits(record, now):
        raise IllegalTransition(
            f"compensation of order {record.id} waits for its long retry until "
            f"{record.NotBefore.isoformat() if record.NotBefore else '?'}"
        )
    return _compensation_attempt(
        record,
        "starter",
        now,
        f"compensation long retry {record.CompensationLongRetries} (unconfirmed undo)",
        NotBefore=None,
    )


def record_undo_unconfirmed(
    record: OrderState, instance_id: str, step: str, now: datetime, error: str | None = None
) -> OrderState:
    """Compensating -> Compensating: every try of `step`'s undo ended without
    an answer that says what happened (transient, unanswered, lost). The
    entry stays Pending (still to undo: the next attempt tries it again, and
    the idempotent, fenced call answers what the remote did), with why."""
    require_owner(record, instance_id)
    _require(record, ProcessState.COMPENSATING, action="record an undo of")
    said = f"unconfirmed: {error}" if error else "unconfirmed"
    at = _after_history(record, now)
    log = [
        e.model_copy(update={"At": at, "Error": short_text(said, ERROR_LIMIT)})
        if e.Step == step and e.Outcome != "Done"
        else e
        for e in record.Compensation
    ]
    return record.model_copy(update={"Compensation": log, "UpdatedAt": now}, deep=True)


def defer_compensation(
    record: OrderState, instance_id: str, now: datetime, policy: RetryPolicy
) -> OrderState:
    """Compensating -> Compensating, waiting until NotBefore (the long retry of
    an unconfirmed undo), or CompensationFailed once
    `policy.undo_long_retries` long retries are spent (the caller alerts).

    The owner keeps the lock until the Starter restarts the compensation as a
    new attempt after NotBefore (restart_compensation). Idempotent for its
    owner: a record already waiting is left as it is (an activity retried
    after its write landed counts no second long retry)."""
    require_owner(record, instance_id)
    _require(record, ProcessState.COMPENSATING, action="defer compensating")
    if record.NotBefore is not None:
        return record
    if any(e.Outcome == "Failed" for e in record.Compensation):
        raise IllegalTransition(
            f"compensation of order {record.id} has a failed undo: finish it, do not defer it"
        )
    open_steps = [e for e in record.Compensation if e.Outcome != "Done"]
    first = open_steps[0] if open_steps else None
    what = f"undo of step {first.Step}" if first else "undo"
    cause = f" ({first.Error})" if first and first.Error else ""
    if record.CompensationLongRetries >= policy.undo_long_retries:
        reason = short_text(
            f"{what} still unconfirmed after {record.CompensationLongRetries} long retries"
            f"{cause}; giving up",
            ERROR_LIMIT,
        )
        return _end_in_failure(
            record,
            ProcessState.COMPENSATION_FAILED,
            instance_id,
            now,
            reason,
            f"unconfirmed/{record.Attempt}",
            CompleteBy=None,
            NotBefore=None,
        )
    wake = now + policy.long_delay
    return _finish(
        record,
        ProcessState.COMPENSATING,
        instance_id,
        now,
        error=f"{what} unconfirmed{cause}; long retry after {wake.isoformat()}",
        NotBefore=wake,
        CompensationLongRetries=record.CompensationLongRetries + 1,
    )


def record_undo(
    record: OrderState,
    instance_id: str,
    step: str,
    ok: bool,
    now: datetime,
    error: str | None = None,
) -> OrderState:
    require_owner(record, instance_id)
    _require(record, ProcessState.COMPENSATING, action="record an undo of")
    log = []
    for entry in record.Compensation:
        if entry.Step == step:
            entry = entry.model_copy(
                update={
                    "Outcome": "Done" if ok else "Failed",
                    "At": _after_history(record, now),
                    "Error": short_text(error, ERROR_LIMIT),
                }
            )
        log.append(entry)
    steps = dict(record.Steps)
    if ok and step in steps:
        steps[step] = steps[step].model_copy(update={"Status": StepStatus.COMPENSATED})
    return record.model_copy(
        update={"Compensation": log, "Steps": steps, "UpdatedAt": now}, deep=True
    )


def finish_compensation(record: OrderState, instance_id: str, now: datetime) -> OrderState:
    """Compensating -> Compensated, or CompensationFailed naming the failed step."""
    require_owner(record, instance_id)
    _require(record, ProcessState.COMPENSATING, action="finish compensating")
    # A refused undo is named before one still open (unconfirmed).
    failed = sorted(
        (e for e in record.Compensation if e.Outcome != "Done"), key=lambda e: e.Outcome != "Failed"
    )
    qualifier = str(record.Attempt)
    if failed:
        # Name the step and the cause: the operator's alert and the client's
        # status both carry this text.
        first = failed[0]
        cause = f": {first.Error}" if first.Error else ""
        reason = short_text(f"undo failed for step {first.Step}{cause}", ERROR_LIMIT)
        return _end_in_failure(
            record, ProcessState.COMPENSATION_FAILED, instance_id, now, reason, qualifier
        )
    return _finish(
        record,
        ProcessState.COMPENSATED,
        instance_id,
        now,
        LockedBy=None,
        # Every undo is done: an earlier undo failure no longer describes the order.
        LastError=None,
        PendingStatus=pending_status(record, StatusKind.COMPENSATED, now, qualifier),
    )


# --- Supervisor ---------------------------------------------------------------------


def is_expired(record: OrderState, now: datetime, slack: timedelta = timedelta(0)) -> bool:
    """`slack` keeps a supervisor whose clock runs ahead from stealing a live attempt."""
    return (
        record.ProcessState is ProcessState.PROCESSING
        and record.CompleteBy is not None
        and record.CompleteBy + slack < now
    )


def _expiry_reason(record: OrderState) -> str:
    """Why the attempt is being recovered: its missed deadline, and any
    transient reason an agent gave during it."""
    deadline = record.CompleteBy.isoformat() if record.CompleteBy else "(none)"
    reason = f"attempt {record.Attempt} missed its deadline {deadline}"
    said = [
        f"step {name}: {state.Error}"
        for name, state in record.Steps.items()
        if state.Error and state.Attempt == record.Attempt and state.Status is StepStatus.RUNNING
    ]
    if said:
        reason = short_text(f"{reason} ({'; '.join(said)})", ERROR_LIMIT)
    return reason


def recover_expired(
    record: OrderState,
    expected_locked_by: str | None,
    now: datetime,
    policy: RetryPolicy,
    slack: timedelta = timedelta(0),
) -> OrderState:
    """Processing, CompleteBy passed -> Pending (retry), Pending after a long
    wait (long retry), or Error (budget spent).

    `expected_locked_by` is the LockedBy the Supervisor read: if the record has
    moved on (a new attempt claimed it), this expiry was already handled."""
    if record.LockedBy != expected_locked_by:
        raise StaleError(f"order {record.id} changed owner since it was read")
    if not is_expired(record, now, slack):
        raise IllegalTransition(f"order {record.id} has not expired")
    failures = record.FailureCount + 1
    reason = _expiry_reason(record)
    if failures < policy.threshold:
        return _finish(
            record,
            ProcessState.PENDING,
            "supervisor",
            now,
            error=reason,
            FailureCount=failures,
            LockedBy=None,
            CompleteBy=None,
            NotBefore=None,
        )
    if failures < policy.max_failures:
        wake = now + policy.long_delay
        return _finish(
            record,
            ProcessState.PENDING,
            "supervisor",
            now,
            reason=f"{reason}; long retry after {wake.isoformat()}",
            LastError=reason,
            FailureCount=failures,
            LongRetries=record.LongRetries + 1,
            LockedBy=None,
            CompleteBy=None,
            NotBefore=wake,
        )
    final = short_text(f"{reason}; gave up after {failures} failed attempts", ERROR_LIMIT)
    return _end_in_failure(
        record,
        ProcessState.ERROR,
        "supervisor",
        now,
        final,
        f"supervisor/{record.Attempt}",
        FailureCount=failures,
        CompleteBy=None,
    )


# --- Status outbox --------------------------------------------------------------------


def mark_status_sent(record: OrderState, message_id: str, now: datetime) -> OrderState:
    """Clear the outbox entry `message_id` once its status is on the reply
    queue. Another entry (a later terminal status) is left alone."""
    if record.PendingStatus is None or record.PendingStatus.MessageId != message_id:
        return record
    return record.model_copy(update={"PendingStatus": None, "UpdatedAt": now}, deep=True)


def park_rejected(record: OrderState, now: datetime) -> OrderState:
    """Submit's Rejected status could not be sent: it waits in the outbox for
    the Starter, under the message id of Submit's own sends. A record no
    longer Rejected (readmitted), or already holding an entry, is unchanged."""
    if record.ProcessState is not ProcessState.REJECTED or record.PendingStatus is not None:
        return record
    pending = pending_status(record, StatusKind.REJECTED, now, "", detail=record.LastError)
    return record.model_copy(update={"PendingStatus": pending, "UpdatedAt": now}, deep=True)


def status_send_failed(record: OrderState, message_id: str) -> OrderState:
    """Count a failed delivery of outbox entry `message_id` (for operators)."""
    if record.PendingStatus is None or record.PendingStatus.MessageId != message_id:
        return record
    pending = record.PendingStatus.model_copy(update={"Tries": record.PendingStatus.Tries + 1})
    return record.model_copy(update={"PendingStatus": pending}, deep=True)


# --- Operator ------------------------------------------------------------------------


def resubmit(record: OrderState, now: datetime, by: str = "operator") -> OrderState:
    """Error -> Pending with a fresh budget; completed steps stay completed, so
    the next attempt resumes after them."""
    _require(record, ProcessState.ERROR, action="resubmit")
    return _pending_afresh(record, by, now, "resubmitted")


def _pending_afresh(
    record: OrderState, by: str, now: datetime, reason: str, **changes
) -> OrderState:
    """-> Pending, unlocked, with a fresh retry budget (readmit, resubmit)."""
    return _finish(
        record,
        ProcessState.PENDING,
        by,
        now,
        reason=reason,
        LockedBy=None,
        CompleteBy=None,
        NotBefore=None,
        FailureCount=0,
        LongRetries=0,
        **changes,
    )
