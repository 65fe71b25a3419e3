"""The order workflow orchestration: one instance per attempt (instance id
`{OrderID}:{Attempt}`).

Deterministic by construction: it only yields Durable context calls, reads time
from `context.current_utc_datetime`, and gets everything else (the record, the
order, the step plan) from activities, whose results the history replays.

Per remote step: compute the step's deadline once, here, and carry that one
value to the record (start_step: the step's CompleteBy, which is also the
record's, the Supervisor's view), to the durable timer and to the agent
request (docs/adr/002-one-deadline.md). Timer first: stop and leave the record
to the Supervisor. An agent that gave up transiently: note its reason on the
record, then stop the same way. Permanent failure: compensate every step whose
request was sent (the failed one included: undo of what never happened is a
no-op), or fail outright if no earlier step completed. Every write is guarded
by LockedBy = this instance: a stale write ends the attempt quietly, because
another attempt owns the order now.

Terminal statuses are written into the record's outbox by the same write that
makes it terminal; the orchestration then sends them, and if that send fails
for good the Starter sends them later (docs/adr/001-status-outbox.md), so the
orchestration finishes either way.

Versions: `context.version` (host.json `defaultVersion`) selects the code path.
An instance without a version was started before versions existed: it runs
1.0, never the newest. Old paths stay until no running instance needs them
(1.0: orchestrators.workflow_v1_0; 1.1 below). 2.0, the default, keeps every
guarantee above at a fraction of the cost: each happy-path activity is one
guarded write carrying the previous write's etag, followed by the message it
must be followed by (docs/adr/004-lean-workflow.md)."""

from __future__ import annotations

import contextlib
import json
import weakref
from datetime import timedelta
from typing import Any

from domain.ids import reply_event_name
from domain.models import AgentReply, ProcessState, ReplyOutcome, StatusKind
from orchestrators import commands, workflow_v1_0
from orchestrators.contracts import (
    Advance,
    Advanced,
    AttemptInput,
    Plan,
    SendRequest,
    StepPlan,
    reply_from_event,
)
from orchestrators.deadline import race
from orchestrators.workflow_steps import (
    ACTIVITY_RETRY,
    alert,
    ends_stale,
    finish,
    load_plan,
    request_step,
    status,
    unless_stale,
    write,
)

WORKFLOW_NAME = "order_workflow"
CURRENT_VERSION = "2.1"
# What an instance without a version runs: the code of its time, not the newest.
UNVERSIONED = "1.0"


def _call(context, name: str, data: dict):
    return context.call_activity_with_retry(name, ACTIVITY_RETRY, _traced(context, data))


def _traced(context, data: dict) -> dict:
    """`data` with the attempt's trace context (AttemptInput.Trace), so the
    activity's span joins the attempt's trace. The orchestrator opens no span
    itself: it copies a value from its own input, which replays identically."""
    trace = _input_trace(context)
    return {**data, "Trace": trace} if trace else data


# The trace context read from each episode's input once, not on every
# activity call: get_input() decodes the whole input (the record, the payload)
# again each time. Keyed weakly by the episode's context object, so the value
# lives exactly as long as the episode, and a replay reads the same input.
_episode_traces: weakref.WeakKeyDictionary[Any, dict | None] = weakref.WeakKeyDictionary()


def _input_trace(context) -> dict | None:
    try:
        return _episode_traces[context]
    except (KeyError, TypeError):
        pass
    trace = _read_input_trace(context)
    with contextlib.suppress(TypeError):  # a context that takes no weak reference
        _episode_traces[context] = trace
    return trace


def _read_input_trace(context) -> dict | None:
    raw = context.get_input()
    if isinstance(raw, str) and raw.startswith("{"):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    trace = raw.get("Trace") if isinstance(raw, dict) else None
    if isinstance(trace, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in trace.items()
    ):
        return trace
    return None


class UnknownWorkflowVersion(Exception):
    pass


def order_workflow(context):
    version = context.version or UNVERSIONED
    runner = VERSIONS.get(version)
    if runner is None:
        raise UnknownWorkflowVersion(
            f"instance {context.instance_id} has version {version!r}; this build knows "
            f"{', '.join(sorted(VERSIONS))}"
        )
    return (yield from runner(context))


# --- version 1.1 ---------------------------------------------------------------------


def _write(context, command, step: str | None = None):
    return (yield from write(_call, context, command, step))


def _status(
    context, plan: Plan, kind: StatusKind, step: str | None = None, detail: str | None = None
):
    yield from status(_call, context, plan, kind, step, detail)


def _terminal_status(
    context, plan: Plan, status: StatusKind, step: str | None = None, detail: str | None = None
):
    """Send the terminal status from the record's outbox. If every try fails,
    the entry stays in the outbox and the Starter delivers it: the
    orchestration still finishes with its outcome."""
    try:
        yield from _status(context, plan, status, step, detail)
    except Exception:  # the SDK raises the activity's failure here after its retries
        return False
    return True


def _alert(context, plan: Plan, kind: str, reason: str):
    yield from alert(_call, context, plan, kind, reason)


def _deadline(context, plan: Plan):
    """The one deadline of what comes next, computed once from replayed time."""
    return context.current_utc_datetime + timedelta(seconds=plan.StepTimeoutSeconds)


def _run_step(context, plan: Plan, step: StepPlan, action: str, deadline, attempt_try: int = 0):
    """Send one request (or run the inline step) and race it against `deadline`,
    the same value the record and the agent got."""
    task = yield from request_step(
        _call, context, plan, step, action, deadline, attempt_try, inline_input=_traced
    )
    result = yield from race(context, task, deadline)
    return _reply(context, plan, step.Name, action, result)


def _reply(context, plan: Plan, step: str, action: str, result) -> AgentReply | None:
    """The race's result as a reply: None when the deadline won; a transient
    reply naming the step and the failure when the inline step's activity
    failed (the SDK hands the failed task's exception over as its result)."""
    if result is None:
        return None
    if isinstance(result, Exception):
        return _inline_failure(context, plan, step, action, result)
    return reply_from_event(result)


def _inline_failure(context, plan: Plan, step: str, action: str, failure: Exception) -> AgentReply:
    """A failed inline step as the transient reply an agent would have sent:
    the attempt then stops like any transient failure, with this reason on
    the record (LastError, the step's error), which the Supervisor's retry,
    Error and alert quote. The failure's text is Durable's
    "{Reason} \\n {Details}"; the reason is the useful part (the activity
    puts the exception's type in it), the details a stack trace. Card
    numbers are masked and the text is cut by the reply's Error type, and
    again by the state machine when it is stored."""
    said = str(failure).split(" \n ", 1)[0].strip() or type(failure).__name__
    return AgentReply(
        InstanceId=context.instance_id,
        OrderID=plan.OrderID,
        Step=step,
        Action=action,
        Attempt=max(plan.Attempt, 1),
        EventName="inline",
        EventId="inline",
        Outcome=ReplyOutcome.TRANSIENT,
        Error=f"inline step {step} failed: {said}",
    )


@ends_stale
def run_v1_1(context):
    iid = context.instance_id
    plan = yield from load_plan(_call, context)
    if plan.State is ProcessState.COMPENSATING:
        # An operator asked for compensation, or a compensation is restarted:
        # the record's log says what is still to undo.
        return (yield from _compensate(context, plan, plan.Undo))

    yield from _status(context, plan, StatusKind.PROCESSING, detail=f"attempt {plan.Attempt}")
    completed = [s.Name for s in plan.Steps if s.Completed]
    for step in plan.Steps:
        if step.Completed:
            continue  # resume: a previous attempt finished it
        deadline = _deadline(context, plan)
        yield from _write(
            context, commands.StartStep(InstanceId=iid, Step=step.Name, Deadline=deadline)
        )

        reply = yield from _run_step(context, plan, step, "do", deadline)
        if reply is None:
            # The step failed for this attempt. The record keeps CompleteBy =
            # the step's deadline; the Supervisor retries or gives up.
            return finish("timed_out", step.Name, "deadline passed")
        if reply.Outcome is ReplyOutcome.TRANSIENT:
            # Same, but keep the agent's reason for the Supervisor and operators.
            return (yield from _transient(context, step.Name, reply.Error))
        if reply.Outcome is ReplyOutcome.PERMANENT:
            return (yield from _permanent(context, plan, step.Name, reply.Error, completed))

        reference = (reply.Result or {}).get("Reference")
        # The attempt's next deadline: reach the next write (next step or
        # Processed) by then. Not the finished step's deadline, which may be
        # about to pass.
        yield from _write(
            context,
            commands.CompleteStep(
                InstanceId=iid,
                Step=step.Name,
                Reference=reference,
                Deadline=_deadline(context, plan),
            ),
        )
        completed.append(step.Name)
        yield from _status(context, plan, StatusKind.STEP_COMPLETED, step.Name)

    yield from _write(context, commands.MarkProcessed(InstanceId=iid))
    yield from _terminal_status(context, plan, StatusKind.PROCESSED)
    return finish("processed")


def _transient(context, step: str, error: str | None):
    """A transient failure: note the agent's reason on the record and stop;
    the record keeps the step's deadline for the Supervisor."""
    yield from _write(
        context, commands.RecordTransient(InstanceId=context.instance_id, Step=step, Reason=error)
    )
    return finish("timed_out", step, error)


def _compensate(context, plan: Plan, undo: list[str]):
    """Undo `undo` (step names, in that order), each within its own try budget.
    Each try has its own message id and reply event (SendRequest.label), and
    a restarted compensation is a new attempt, so no try is ever taken for a
    re-send of another."""

    def undo_step(step: StepPlan):
        ok, error = False, "no reply before the deadline"
        for attempt_try in range(plan.UndoTries):
            deadline = _deadline(context, plan)
            reply = yield from _run_step(context, plan, step, "undo", deadline, attempt_try)
            if reply is not None and reply.Outcome is ReplyOutcome.OK:
                return True, None
            if reply is not None:
                error = reply.Error or reply.Outcome.value
                if reply.Outcome is ReplyOutcome.PERMANENT:
                    break
        return ok, error

    return (yield from _compensate_with(context, plan, undo, undo_step))


def _compensate_with(context, plan: Plan, undo: list[str], undo_step):
    """Undo `undo` (step names, in that order) with the version's `undo_step`
    (a generator returning (ok, error)), record each outcome, then finish."""
    yield from _status(context, plan, StatusKind.COMPENSATING)
    steps = {s.Name: s for s in plan.Steps}
    iid = context.instance_id
    for name in undo:
        ok, error = yield from undo_step(steps.get(name) or StepPlan(Name=name))
        yield from _write(
            context,
            commands.UndoDone(InstanceId=iid, Step=name)
            if ok
            else commands.UndoFailed(InstanceId=iid, Step=name, Reason=error),
        )
    return (yield from _finish_compensation(context, plan))


# --- version 2.0 ---------------------------------------------------------------------
#
# The same protocol as 1.1 at a fraction of the cost (docs/adr/004-lean-workflow.md):
# each activity is one guarded write and the message that must follow it, and
# carries the record's etag from the previous write instead of reading first.
# Happy path of n steps: n + 1 activities (begin + start step 1; complete step
# k + start step k+1; complete step n + Processed + its status). The failure
# paths (transient, permanent, compensation) are 1.1's, which are rare.


def _attempt_input(context) -> AttemptInput:
    raw = context.get_input()
    if isinstance(raw, str) and raw:
        return AttemptInput.model_validate_json(raw)
    if isinstance(raw, dict):
        return AttemptInput.model_validate(raw)
    return AttemptInput()


def _advance(context, name: str, data: Advance):
    return Advanced.model_validate((yield _call(context, name, data.dump())))


def _await_step(context, plan: Plan, step: StepPlan, deadline):
    """Wait for the reply to the request the write activity just sent (or run
    the inline step), racing the step's one deadline."""
    if step.Mode == "inline":
        request = SendRequest(
            InstanceId=context.instance_id, Step=step.Name, Deadline=deadline, Payload=plan.Payload
        )
        task = context.call_activity("run_inline_step", _traced(context, request.dump()))
    else:
        task = context.wait_for_external_event(reply_event_name(step.Name, plan.Attempt, "do"))
    result = yield from race(context, task, deadline)
    return _reply(context, plan, step.Name, "do", result)


@ends_stale
def run_v2_0(context):
    return (yield from _run_v2(context, _compensate))


def _run_v2(context, compensate):
    """2.0 and 2.1: the lean happy path; `compensate` is the version's undo."""
    iid = context.instance_id
    given = _attempt_input(context)
    timeout = given.StepTimeoutSeconds
    if timeout is None:
        # Started without input (by hand, or an older starter): learn the
        # step timeout first; begin then reads the record itself.
        timeout = (yield from load_plan(_call, context)).StepTimeoutSeconds
        given = AttemptInput(IndexedAt=given.IndexedAt)
    step_timeout = timedelta(seconds=timeout)
    # The first step's one deadline, computed here from replayed time.
    deadline = context.current_utc_datetime + step_timeout
    begun = yield from _advance(
        context,
        "begin_attempt",
        Advance(
            InstanceId=iid,
            Begin=True,
            Record=given.Record,
            Etag=given.Etag,
            Deadline=deadline,
            IndexedAt=given.IndexedAt,
            Payload=given.Payload or {},
        ),
    )
    unless_stale(begun)
    plan = begun.Plan
    if plan.State is ProcessState.COMPENSATING:
        return (yield from compensate(context, plan, plan.Undo))

    steps = {s.Name: s for s in plan.Steps}
    completed = [s.Name for s in plan.Steps if s.Completed]
    record, etag = begun.Record, begun.Etag
    current = begun.Started
    reference = None

    def complete(**then) -> Advance:
        """The write that completes `current` and does `then` (start the next
        step, or finish), on the record as the previous write left it."""
        return Advance(
            InstanceId=iid,
            Record=record,
            Etag=etag,
            Complete=current,
            Reference=reference,
            Payload=plan.Payload,
            Progress=plan.Progress,
            **then,
        )

    while current is not None:
        step = steps[current]
        reply = yield from _await_step(context, plan, step, deadline)
        if reply is None:
            # The step failed for this attempt; the record keeps CompleteBy =
            # the step's deadline, and the Supervisor retries or gives up.
            return finish("timed_out", current, "deadline passed")
        if reply.Outcome is ReplyOutcome.TRANSIENT:
            return (yield from _transient(context, current, reply.Error))
        if reply.Outcome is ReplyOutcome.PERMANENT:
            return (
                yield from _permanent(context, plan, current, reply.Error, completed, compensate)
            )

        reference = (reply.Result or {}).get("Reference")
        after = [
            s
            for s in plan.Steps
            if not s.Completed and s.Name not in completed and s.Name != current
        ]
        nxt = after[0].Name if after else None
        if nxt is None:
            break
        # The next step's one deadline: the same write completes this step
        # and starts the next, so the record's CompleteBy moves straight to it.
        deadline = context.current_utc_datetime + step_timeout
        moved = yield from _advance(
            context, "advance_attempt", complete(Start=nxt, Deadline=deadline)
        )
        unless_stale(moved, current)
        completed.append(current)
        record, etag, current = moved.Record, moved.Etag, nxt

    try:
        done = yield from _advance(
            context, "advance_attempt", complete(Finish=True, IndexedAt=given.IndexedAt)
        )
    except Exception:  # the SDK raises the activity's failure here after its retries
        # Either the write did not land (the record keeps the last step's
        # deadline: the Supervisor retries the attempt, which resumes at
        # Processed) or the status is still in the outbox (the Starter sends it).
        return finish("unconfirmed", current, "finishing write or its status failed")
    # Outside the try: a stale finish ends as "stale", not "unconfirmed".
    unless_stale(done, current)
    return finish("processed")


def _permanent(
    context, plan: Plan, step: str, error: str | None, completed: list[str], compensate=_compensate
):
    """A non-transient failure: compensate every sent step (this one first),
    or fail outright when no earlier step completed (as 1.1)."""
    iid = context.instance_id
    reason = f"step {step} failed: {error}"
    if completed:
        yield from _write(
            context, commands.BeginCompensation(InstanceId=iid, Step=step, Reason=reason)
        )
        return (yield from compensate(context, plan, [step, *reversed(completed)]))
    yield from _write(context, commands.MarkFailed(InstanceId=iid, Step=step, Reason=reason))
    yield from _alert(context, plan, "OrderError", reason)
    yield from _terminal_status(context, plan, StatusKind.FAILED, step, reason)
    return finish("failed", step, reason)


# --- version 2.1 ---------------------------------------------------------------------
#
# 2.0 with one change in compensation (known defect N3): an undo try whose
# deadline passed may still be answered; its answer is taken while a later
# try waits. 2.0 ignored it: when the later tries then failed (an outage), the
# order ended CompensationFailed although the undo had happened. Taking the
# answer changes what an instance does after a late reply, so it is a new
# version: a 2.0 instance replays 2.0's code (which ignored that reply). Its
# undo requests say until when an answer counts (ListenUntil), so the agent
# still calls for a try redelivered after that try's deadline (ADR 005).


@ends_stale
def run_v2_1(context):
    return (yield from _run_v2(context, _compensate_v2_1))


def _compensate_v2_1(context, plan: Plan, undo: list[str]):
    """1.1/2.0's compensation, with each step's undo taken from whichever of
    its tries answers first (_undo_step_v2_1)."""
    return (
        yield from _compensate_with(
            context, plan, undo, lambda step: _undo_step_v2_1(context, plan, step)
        )
    )


def _undo_step_v2_1(context, plan: Plan, step: StepPlan):
    """Undo `step` within plan.UndoTries tries, each with its own request (own
    message id and reply event) and deadline. While a try waits, the replies
    of earlier tries still count: an earlier try's late success ends the undo
    as done (the remote service applied it: the idempotency key is the same
    for every try). Late failures of earlier tries only keep the last error;
    a permanent answer from any try ends the undo as failed, as in 2.0. The
    last try, answered transiently, still waits until its deadline for the
    earlier tries that have not answered (the budget 2.0 already allowed).

    Each pending task is waited on again in the next race as the same task
    object, never a second wait for the same event name (issue #507), and an
    answer that arrived while no race was running resolves the next race at
    once.

    The undo has one deadline, `undo_by` (its first try's start + UndoTries x
    step timeout, 2.0's budget); the last try waits until then. Every try's
    request carries it as ListenUntil: an agent that gets a try again after
    that try's own deadline (its earlier delivery crashed or lost its lock,
    so it may never have answered) still makes the idempotent call, and its
    answer still counts (ADR 005). Returns (ok, error)."""
    ok_error = (False, "no reply before the deadline")
    earlier: list = []  # tasks of earlier tries that have not answered yet
    undo_by = context.current_utc_datetime + timedelta(
        seconds=plan.StepTimeoutSeconds * plan.UndoTries
    )
    for attempt_try in range(plan.UndoTries):
        deadline = min(_deadline(context, plan), undo_by)
        # Its inline activity carries no trace context, as 2.1 was written.
        current = yield from request_step(
            _call, context, plan, step, "undo", deadline, attempt_try, listen_until=undo_by
        )
        # The last try waits for the earlier ones until the undo's deadline.
        timer = context.create_timer(undo_by if attempt_try + 1 == plan.UndoTries else deadline)
        waiting = [current, *earlier]
        while True:
            winner = yield context.task_any([*waiting, timer])
            if winner is timer:
                break  # this try's deadline: its task joins the earlier ones
            waiting.remove(winner)
            reply = _reply(context, plan, step.Name, "undo", winner.result)
            if reply is None:  # an event without data answers nothing (the bridge always sends one)
                continue
            if reply.Outcome is ReplyOutcome.OK:
                if not timer.is_completed:
                    timer.cancel()
                return True, None
            ok_error = (False, reply.Error or reply.Outcome.value)
            if reply.Outcome is ReplyOutcome.PERMANENT:
                if not timer.is_completed:
                    timer.cancel()
                return ok_error
            if winner is current and (attempt_try + 1 < plan.UndoTries or not waiting):
                if not timer.is_completed:
                    timer.cancel()
                break  # this try gave up for now: the next try, earlier ones still count
            # An earlier try's late failure, or the last try's: earlier tries
            # may still answer until this try's deadline.
        earlier = waiting
    return ok_error


def _finish_compensation(context, plan: Plan):
    """The compensation's terminal write and its status (and alert)."""
    written = yield from _write(
        context, commands.FinishCompensation(InstanceId=context.instance_id)
    )
    if written.State is ProcessState.COMPENSATED:
        yield from _terminal_status(context, plan, StatusKind.COMPENSATED)
        return finish("compensated")
    reason = f"compensation of order {plan.OrderID} failed"
    yield from _alert(context, plan, "CompensationFailed", reason)
    yield from _terminal_status(context, plan, StatusKind.COMPENSATION_FAILED, detail=reason)
    return finish("compensation_failed", detail=reason)


VERSIONS = {"1.0": workflow_v1_0.run_v1, "1.1": run_v1_1, "2.0": run_v2_0, "2.1": run_v2_1}
