"""The state record's transitions (docs/design.md §3) as pure functions: each
takes the record as read, checks the move is allowed from its state and for its
caller, and returns the record to write (the store adapter writes it on the
etag read, with the `LockedBy` guard `require_owner` checks). Refusals raise
`IllegalTransition` (the state does not allow the move) or `StaleError` (the
caller no longer owns the record)."""

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
MAX_COMPENSATION_RESTARTS = 3  # of a compensation whose instance died (docs/adr/003)
# Steps whose request may have reached the remote service: compensation undoes
# them all (undo of what never happened is a no-op by the agent contract).
SENT_STEP_STATES = frozenset({StepStatus.RUNNING, StepStatus.FAILED, StepStatus.COMPLETED})


@overload
def short_text(text: str, limit: int) -> str: ...
@overload
def short_text(text: None, limit: int) -> None: ...
def short_text(text: str | None, limit: int) -> str | None:
    """Outside text (a provider's error) fit for a bounded record field: at
    most `limit` characters, the start kept; control and format characters
    become spaces, whitespace runs collapse, lone surrogates are replaced.
    Card-number-like runs are masked after the clean-up (a control character
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
    """The outbox entry for a terminal status, its message id fixed once (ADR 001)."""
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
    # Long retries of a compensation whose undo ended unconfirmed (ADR 019a).
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
    """`now`, or the latest undo entry's At if later: entries are dated by
    their writers' clocks, and one of a dead attempt dated after the restart
    would pass for the new attempt's own write (orchestrators.starter._never_started)."""
    written = [e.At for e in record.Compensation if e.At is not None]
    return max([now, *written])


def _after_history(record: OrderState, now: datetime) -> datetime:
    """`now`, or just after the last transition if the writer's clock is
    behind: an undo entry is never dated before the restart that made it."""
    if not record.History:
        return now
    return max(now, record.History[-1].At + timedelta(microseconds=1))


def _finish(record: OrderState, to: ProcessState, by: str, now: datetime, **changes) -> OrderState:
    """Common tail of every transition: history, timestamps, TTL when terminal.
    `reason` goes to the history entry; `error` to it and to LastError."""
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
    lets go, the reason becomes LastError, the client's status waits in the outbox."""
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
    """(none) -> Pending: the first write, by Submit (`key`: domain.ids.order_key unless given)."""
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
    """Rejected -> Pending: the client sent the order again and the backlog
    has room; the same record starts over as a new order would. Only Submit,
    after its own admission check, makes this transition."""
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
    CompleteBy is set here, not at the start, so a starter that dies between
    claim and start leaves a record the Supervisor will find."""
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
    """`claim`, also marking each of `steps` (every step not Completed)
    Running for this attempt until `deadline`, the attempt's one deadline and
    the record's CompleteBy: compensation from the record alone then undoes
    whatever the attempt may have sent (docs/adr/021a-claim-marks-the-attempt.md)."""
    claimed = claim(record, now, policy)
    marked = dict(claimed.Steps)
    for name in steps:
        marked[name] = _running(claimed, name, now, deadline)
    return claimed.model_copy(update={"Steps": marked, "CompleteBy": deadline}, deep=True)


def _running(record: OrderState, step: str, now: datetime, deadline: datetime) -> StepState:
    """`step` Running for the record's attempt until `deadline`; a Completed step is refused."""
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
    """`steps` the claim marked Running that no attempt has sent (NotStarted
    before the claim, never sent by this one) are NotStarted again, so
    compensation does not undo what never happened. Other steps are left as they are."""
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
    # model_copy does not validate: bound the reference here, or this write
    # (after the side effect) would fail on every try.
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
    """Processing -> Processing: a transient reply for `step`. The reason is
    kept on the step and in LastError so the Supervisor's retry or Error names it."""
    require_owner(record, instance_id)
    _require(record, ProcessState.PROCESSING, action="note a transient failure of")
    steps = dict(record.Steps)
    current = steps.get(step, StepState())
    steps[step] = current.model_copy(update={"Error": short_text(reason, REASON_LIMIT)})
    return record.model_copy(
        update={"Steps": steps, "LastError": short_text(reason, ERROR_LIMIT), "UpdatedAt": now},
        deep=True,
    )


def mark_processed(
    record: OrderState, instance_id: str, now: datetime, outbox: bool = True
) -> OrderState:
    """Processing -> Processed: every step Completed; its status in the outbox,
    unless its index entry marks it unsent (ADR 021k)."""
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
        PendingStatus=pending_status(record, StatusKind.PROCESSED, now, "") if outbox else None,
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
    (SENT_STEP_STATES) and has no entry yet (ADR 003). Entries keep their
    completion order; new ones follow in step order, so the undo (in reverse)
    starts with the latest step."""
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
    new attempt takes the lock (guarded by the etag, like a claim). A terminal
    status still in the outbox stays there for the Starter to deliver; only
    the compensation's own terminal write replaces it."""
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
    Compensating under a new attempt (new message ids and a higher fencing
    token: docs/adr/003). Once `max_restarts` are spent: with `policy`, a long
    retry (NotBefore = now + long_delay, at most `policy.undo_long_retries`)
    unless an undo was refused and none is left to try (ADR 019e); else
    CompensationFailed (the caller raises the alert). A record waiting for
    its long retry is woken once NotBefore has passed, counting no restart (ADR 019a)."""
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
    CompensationFailed. A refused undo settles the verdict, but an undo still
    Pending is tried first, or what it holds stays held."""
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
    """A Compensating record in its long retry: nothing restarts it before NotBefore."""
    return (
        record.ProcessState is ProcessState.COMPENSATING
        and record.NotBefore is not None
        and record.NotBefore > now
    )


def _wake_compensation(record: OrderState, now: datetime) -> OrderState:
    """Compensating, its long retry due -> Compensating under a new attempt.
    CompensationRestarts is left as it is: the long retry was counted when deferred."""
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
    an answer that says what happened. The entry stays Pending, with why."""
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
    """Compensating -> Compensating until NotBefore (the long retry of an
    unconfirmed undo, ADR 019a), or CompensationFailed once
    `policy.undo_long_retries` are spent (the caller alerts). The owner keeps
    the lock until the Starter wakes it. Idempotent: a record already waiting
    is left as it is (a retried activity counts no second long retry)."""
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
    """The missed deadline, and any transient reason an agent gave during the attempt."""
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
    wait (long retry), or Error (budget spent). StaleError when LockedBy is no
    longer `expected_locked_by`, the one the Supervisor read."""
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
    """Clear the outbox entry `message_id` once sent; another entry is left alone."""
    if record.PendingStatus is None or record.PendingStatus.MessageId != message_id:
        return record
    return record.model_copy(update={"PendingStatus": None, "UpdatedAt": now}, deep=True)


def park_rejected(record: OrderState, now: datetime) -> OrderState:
    """Submit's Rejected status could not be sent: it waits in the outbox
    under Submit's own message id. A record no longer Rejected, or already
    holding an entry, is unchanged."""
    if record.ProcessState is not ProcessState.REJECTED or record.PendingStatus is not None:
        return record
    pending = pending_status(record, StatusKind.REJECTED, now, "", detail=record.LastError)
    return record.model_copy(update={"PendingStatus": pending, "UpdatedAt": now}, deep=True)


def unsent_processed(record: OrderState, instance_id: str) -> PendingStatus | None:
    """The Processed status a finishing write by `instance_id` left out of the
    outbox, as mark_processed would have put it (its time the write's); None
    for a record holding an entry or not made Processed by that attempt."""
    last = record.History[-1] if record.History else None
    if record.ProcessState is not ProcessState.PROCESSED or record.PendingStatus is not None:
        return None
    if last is None or last.By != instance_id:
        return None
    return pending_status(record, StatusKind.PROCESSED, last.At, "")


def park_processed(record: OrderState, instance_id: str) -> OrderState:
    """The status `unsent_processed` names parked in the outbox; else unchanged."""
    pending = unsent_processed(record, instance_id)
    return record if pending is None else record.model_copy(update={"PendingStatus": pending})


def mark_alert_left(record: OrderState, message_id: str) -> OrderState:
    """Outbox entry `message_id`'s status is sent, its operator alert not (the
    alerts queue refused it): the entry stays for the alert alone, one more
    try counted. Another entry is left alone."""
    if record.PendingStatus is None or record.PendingStatus.MessageId != message_id:
        return record
    pending = record.PendingStatus.model_copy(
        update={"Sent": True, "Tries": record.PendingStatus.Tries + 1}
    )
    return record.model_copy(update={"PendingStatus": pending}, deep=True)


def status_send_failed(record: OrderState, message_id: str) -> OrderState:
    """Count a failed delivery of outbox entry `message_id` (for operators)."""
    if record.PendingStatus is None or record.PendingStatus.MessageId != message_id:
        return record
    pending = record.PendingStatus.model_copy(update={"Tries": record.PendingStatus.Tries + 1})
    return record.model_copy(update={"PendingStatus": pending}, deep=True)


# --- Operator ------------------------------------------------------------------------


def resubmit(record: OrderState, now: datetime, by: str = "operator") -> OrderState:
    """Error -> Pending with a fresh budget; the next attempt resumes after the completed steps."""
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
