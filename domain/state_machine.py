"""The state record's transitions (DESIGN.md §3) as pure functions.

Each function takes the record as read, checks that the transition is allowed
from its state and for its caller, and returns the record to write. It never
writes: the store adapter does that with a conditional replace on the etag the
record was read with, and (for orchestration writes) the `LockedBy` guard that
`require_owner` checks here too. Refusals raise:

- `IllegalTransition`: the record's state does not allow this move;
- `StaleError` (domain.errors): the caller no longer owns the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from domain.errors import DomainError, StaleError
from domain.ids import attempt_instance_id
from domain.models import (
    TERMINAL_STATES,
    CompensationEntry,
    HistoryEntry,
    OrderState,
    OrderSubmitted,
    ProcessState,
    StepState,
    StepStatus,
)

HISTORY_LIMIT = 20
FINISHED_RECORD_TTL_SECONDS = 90 * 24 * 3600


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

    @property
    def max_failures(self) -> int:
        return self.threshold + self.long_retries


def _with_history(
    record: OrderState, to: ProcessState, by: str, now: datetime, reason: str | None = None
) -> list[HistoryEntry]:
    entry = HistoryEntry(At=now, From=record.ProcessState, To=to, By=by, Reason=reason)
    return [*record.History, entry][-HISTORY_LIMIT:]


def _finish(record: OrderState, to: ProcessState, by: str, now: datetime, **changes) -> OrderState:
    """Common tail of every transition: history, timestamps, TTL when terminal."""
    reason = changes.pop("reason", None)
    history = _with_history(record, to, by, now, reason)
    ttl = FINISHED_RECORD_TTL_SECONDS if to in TERMINAL_STATES else None
    return record.model_copy(
        update={"ProcessState": to, "History": history, "UpdatedAt": now, "ttl": ttl, **changes},
        deep=True,
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


def new_record(order: OrderSubmitted, now: datetime, steps: list[str]) -> OrderState:
    """(none) -> Pending: the first write, by Submit."""
    return OrderState(
        id=order.OrderID,
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


def rejected_record(order: OrderSubmitted, now: datetime, reason: str) -> OrderState:
    """(none) -> Rejected: admission control refused the order (backlog)."""
    record = new_record(order, now, steps=[])
    return _finish(record, ProcessState.REJECTED, "submit", now, reason=reason, LastError=reason)


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


# --- Scheduler (orchestration) ---------------------------------------------------------


def start_step(
    record: OrderState, instance_id: str, step: str, now: datetime, deadline: datetime
) -> OrderState:
    """Processing -> Processing: the step is Running until `deadline`, which is
    also the record's CompleteBy (the Supervisor's view of this attempt)."""
    require_owner(record, instance_id)
    _require(record, ProcessState.PROCESSING, action="start a step of")
    steps = dict(record.Steps)
    current = steps.get(step, StepState())
    if current.Status is StepStatus.COMPLETED:
        raise IllegalTransition(f"step {step} of order {record.id} is already Completed")
    steps[step] = current.model_copy(
        update={
            "Status": StepStatus.RUNNING,
            "Attempt": record.Attempt,
            "StartedAt": now,
            "CompleteBy": deadline,
        }
    )
    return record.model_copy(
        update={"Steps": steps, "CompleteBy": deadline, "UpdatedAt": now}, deep=True
    )


def complete_step(
    record: OrderState, instance_id: str, step: str, now: datetime, reference: str | None = None
) -> OrderState:
    """Processing -> Processing: the step is Completed and enters the
    compensation log (what to undo, should a later step fail for good)."""
    require_owner(record, instance_id)
    _require(record, ProcessState.PROCESSING, action="complete a step of")
    steps = dict(record.Steps)
    current = steps.get(step, StepState())
    if current.Status is StepStatus.COMPLETED:
        return record  # idempotent: a replayed activity completes nothing twice
    steps[step] = current.model_copy(
        update={"Status": StepStatus.COMPLETED, "CompletedAt": now, "Reference": reference}
    )
    log = [*record.Compensation, CompensationEntry(Step=step, Reference=reference)]
    return record.model_copy(
        update={"Steps": steps, "Compensation": log, "UpdatedAt": now}, deep=True
    )


def mark_processed(record: OrderState, instance_id: str, now: datetime) -> OrderState:
    """Processing -> Processed: every step Completed."""
    require_owner(record, instance_id)
    _require(record, ProcessState.PROCESSING, action="finish")
    unfinished = [n for n, s in record.Steps.items() if s.Status is not StepStatus.COMPLETED]
    if unfinished:
        raise IllegalTransition(f"order {record.id} has unfinished steps: {', '.join(unfinished)}")
    return _finish(
        record, ProcessState.PROCESSED, instance_id, now, CompleteBy=None, LockedBy=None
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
    return _finish(
        record,
        ProcessState.ERROR,
        instance_id,
        now,
        reason=reason,
        LastError=reason[:500],
        CompleteBy=None,
        LockedBy=None,
        Steps=steps,
    )


# --- Compensation ---------------------------------------------------------------------


def begin_compensation(
    record: OrderState, instance_id: str, reason: str, now: datetime
) -> OrderState:
    """Processing -> Compensating: a step failed for good after earlier steps
    completed; the attempt that owns the record undoes them."""
    require_owner(record, instance_id)
    _require(record, ProcessState.PROCESSING, action="compensate")
    return _finish(
        record,
        ProcessState.COMPENSATING,
        instance_id,
        now,
        reason=reason,
        LastError=reason[:500],
        CompleteBy=None,
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
    entry = HistoryEntry(At=now, From=record.ProcessState, To=record.ProcessState, By=by,
                         Reason="compensation requested")
    return record.model_copy(
        update={
            "CompensationRequested": True,
            "History": [*record.History, entry][-HISTORY_LIMIT:],
            "UpdatedAt": now,
        },
        deep=True,
    )


def claim_compensation(record: OrderState, now: datetime, policy: RetryPolicy) -> OrderState:
    """Error / CompensationFailed -> Compensating, on an operator's request: a
    new attempt takes the lock (guarded by the etag, like a claim)."""
    _require(
        record,
        ProcessState.ERROR,
        ProcessState.COMPENSATION_FAILED,
        action="start compensating",
    )
    attempt = record.Attempt + 1
    log = [e.model_copy(update={"Outcome": "Pending", "Error": None}) if e.Outcome == "Failed" else e
           for e in record.Compensation]
    return _finish(
        record,
        ProcessState.COMPENSATING,
        "operator",
        now,
        reason="compensation requested",
        LockedBy=attempt_instance_id(record.id, attempt),
        Attempt=attempt,
        CompleteBy=None,
        Compensation=log,
        CompensationRequested=False,
    )


def record_undo(
    record: OrderState, instance_id: str, step: str, ok: bool, now: datetime, error: str | None = None
) -> OrderState:
    require_owner(record, instance_id)
    _require(record, ProcessState.COMPENSATING, action="record an undo of")
    log = []
    for entry in record.Compensation:
        if entry.Step == step:
            entry = entry.model_copy(
                update={"Outcome": "Done" if ok else "Failed", "At": now, "Error": error}
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
    failed = [e.Step for e in record.Compensation if e.Outcome != "Done"]
    if failed:
        reason = f"undo failed for step {failed[0]}"
        return _finish(
            record,
            ProcessState.COMPENSATION_FAILED,
            instance_id,
            now,
            reason=reason,
            LastError=reason,
            LockedBy=None,
        )
    return _finish(record, ProcessState.COMPENSATED, instance_id, now, LockedBy=None)


# --- Supervisor ---------------------------------------------------------------------


def is_expired(record: OrderState, now: datetime, slack: timedelta = timedelta(0)) -> bool:
    """`slack` keeps a supervisor whose clock runs ahead from stealing a live attempt."""
    return (
        record.ProcessState is ProcessState.PROCESSING
        and record.CompleteBy is not None
        and record.CompleteBy + slack < now
    )


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
    reason = f"attempt {record.Attempt} missed its deadline {record.CompleteBy.isoformat()}"
    if failures < policy.threshold:
        return _finish(
            record,
            ProcessState.PENDING,
            "supervisor",
            now,
            reason=reason,
            LastError=reason,
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
    final = f"{reason}; gave up after {failures} failed attempts"
    return _finish(
        record,
        ProcessState.ERROR,
        "supervisor",
        now,
        reason=final,
        LastError=final,
        FailureCount=failures,
        LockedBy=None,
        CompleteBy=None,
    )


# --- Operator ------------------------------------------------------------------------


def resubmit(record: OrderState, now: datetime, by: str = "operator") -> OrderState:
    """Error -> Pending with a fresh budget; completed steps stay completed, so
    the next attempt resumes after them."""
    _require(record, ProcessState.ERROR, action="resubmit")
    return _finish(
        record,
        ProcessState.PENDING,
        by,
        now,
        reason="resubmitted",
        LockedBy=None,
        CompleteBy=None,
        NotBefore=None,
        FailureCount=0,
        LongRetries=0,
    )
