"""Version 1.1 of the order workflow, frozen: instances started under 1.1
replay this code until none is left. New instances run the live version
(orchestrators/workflow_v2_1.py). Do not change what this code schedules, or
in-flight 1.1 instances stop replaying: the history corpus
(tests/fixtures/histories/1.1-*.json, replayed by
tests/unit/orchestrators/test_history_corpus.py) fails first. This file holds
every helper 1.1 reaches, copied from the shared module they lived in when
1.1 was current; it imports only the activity contracts, the state commands
and the domain (docs/adr/018d-one-file-per-workflow-version.md).

1.1 reads the plan, then per step: write start_step (the step's one
deadline), send the request (or run the inline step) and race its reply
against that deadline, write complete_step, report StepCompleted; then
Processed. Every activity carries the attempt's trace context."""

from __future__ import annotations

import contextlib
import functools
import json
import weakref
from collections.abc import Callable, Generator
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from azure.durable_functions import RetryOptions

from domain.ids import reply_event_name
from domain.models import AgentReply, ProcessState, ReplyOutcome, StatusKind
from orchestrators import commands
from orchestrators.contracts import (
    AlertNote,
    LoadPlanInput,
    Plan,
    SendRequest,
    StatusNote,
    StepPlan,
    WorkflowResult,
    WriteResult,
    reply_from_event,
)

VERSION = "1.1"

# Activities are idempotent, so a brief store or bus hiccup is retried here
# rather than failing the attempt (which the Supervisor would then retry as a
# whole). Three tries inside a few seconds stay well inside a step deadline.
ACTIVITY_RETRY = RetryOptions(first_retry_interval_in_milliseconds=500, max_number_of_attempts=3)


class StaleAttempt(Exception):
    """Another attempt owns the order now (a write or the plan came back
    stale): this attempt ends quietly. Raised by `unless_stale` only, and
    caught by `ends_stale`."""

    def __init__(self, reason: str | None, step: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step = step


def finish(outcome: str, step: str | None = None, detail: str | None = None) -> dict:
    return WorkflowResult(Outcome=outcome, Step=step, Detail=detail).dump()


Body = Callable[[Any], Generator[Any, Any, Any]]


def ends_stale(body: Body) -> Body:
    """Decorates a workflow body (a generator of the context): a StaleAttempt
    from anywhere in it ends the orchestration with the "stale" result,
    naming the step it was at and the reason."""

    @functools.wraps(body)
    def run(context):
        try:
            return (yield from body(context))
        except StaleAttempt as stale:
            return finish("stale", stale.step, stale.reason)

    return run


@ends_stale
def run(context):
    iid = context.instance_id
    plan = yield from _load_plan(context)
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


def _deadline(context, plan: Plan):
    """The one deadline of what comes next, computed once from replayed time."""
    return context.current_utc_datetime + timedelta(seconds=plan.StepTimeoutSeconds)


def _run_step(context, plan: Plan, step: StepPlan, action: str, deadline, attempt_try: int = 0):
    """Send one request (or run the inline step) and race it against `deadline`,
    the same value the record and the agent got."""
    task = yield from _request(context, plan, step, action, deadline, attempt_try)
    result = yield from _race(context, task, deadline)
    return _reply(context, plan, step.Name, action, result)


def _request(context, plan: Plan, step: StepPlan, action: str, deadline, attempt_try: int = 0):
    """Send the request for `step` (or start its inline activity, with the
    attempt's trace context) and return the task its answer completes. Each
    undo try has its own message id and reply event (SendRequest.label)."""
    request = SendRequest(
        InstanceId=context.instance_id,
        Step=step.Name,
        Action=action,
        Try=attempt_try,
        Deadline=deadline,
        Payload=plan.Payload,
        ListenUntil=None,
        AppId=plan.AppId,
    )
    if step.Mode == "inline":
        return context.call_activity("run_inline_step", _traced(context, request.dump()))
    yield _call(context, "send_agent_request", request.dump())
    return context.wait_for_external_event(reply_event_name(step.Name, plan.Attempt, request.label))


# --- scheduling an activity, with the attempt's trace context ---------------------------


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


# --- the steps' pieces --------------------------------------------------------------


def _load_plan(context):
    plan = Plan.model_validate(
        (yield _call(context, "load_plan", LoadPlanInput(InstanceId=context.instance_id).dump()))
    )
    return unless_stale(plan)


class _MaybeStale(Protocol):
    @property
    def Stale(self) -> bool: ...  # noqa: N802 (the contracts' field name)

    @property
    def Reason(self) -> str | None: ...  # noqa: N802


R = TypeVar("R", bound=_MaybeStale)


def unless_stale(result: R, step: str | None = None) -> R:
    """`result`, unless it says the attempt is stale: then StaleAttempt,
    naming `step` (the step the attempt was at) in the workflow's result."""
    if result.Stale:
        raise StaleAttempt(result.Reason, step)
    return result


def _race(context, task, deadline: datetime):
    """Wait for `task` (an external event or an activity) or the durable timer,
    whichever completes first (DESIGN.md §4 'Deadline race'); when the task
    wins, the timer is cancelled so the instance does not linger until it
    fires. The task's result, or None when the deadline passed first."""
    timer = context.create_timer(deadline)
    winner = yield context.task_any([task, timer])
    if winner is timer:
        return None
    if not timer.is_completed:
        timer.cancel()
    return task.result


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


# --- failures ------------------------------------------------------------------------------


def _transient(context, step: str, error: str | None):
    """A transient failure: note the agent's reason on the record and stop;
    the record keeps the step's deadline for the Supervisor."""
    yield from _write(
        context, commands.RecordTransient(InstanceId=context.instance_id, Step=step, Reason=error)
    )
    return finish("timed_out", step, error)


def _permanent(context, plan: Plan, step: str, error: str | None, completed: list[str]):
    """A non-transient failure: compensate every sent step (this one first),
    or fail outright when no earlier step completed."""
    iid = context.instance_id
    reason = f"step {step} failed: {error}"
    if completed:
        yield from _write(
            context, commands.BeginCompensation(InstanceId=iid, Step=step, Reason=reason)
        )
        return (yield from _compensate(context, plan, [step, *reversed(completed)]))
    yield from _write(context, commands.MarkFailed(InstanceId=iid, Step=step, Reason=reason))
    yield from _alert(context, plan, "OrderError", reason)
    yield from _terminal_status(context, plan, StatusKind.FAILED, step, reason)
    return finish("failed", step, reason)


def _write(context, command: commands.StateWrite, step: str | None = None):
    """Write `command`; stale names `step`, by default the command's own."""
    result = WriteResult.model_validate((yield _call(context, "write_state", command.dump())))
    return unless_stale(result, step or getattr(command, "Step", None))


def _status(
    context, plan: Plan, kind: StatusKind, step: str | None = None, detail: str | None = None
):
    yield _call(
        context,
        "report_status",
        StatusNote(
            InstanceId=context.instance_id,
            ReplyTo=plan.ReplyTo,
            Status=kind,
            Step=step,
            Detail=detail,
        ).dump(),
    )


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
    yield _call(
        context, "raise_alert", AlertNote(Kind=kind, OrderID=plan.OrderID, Reason=reason).dump()
    )


# --- compensation ---------------------------------------------------------------------------


def _compensate(context, plan: Plan, undo: list[str]):
    """Undo `undo` (step names, in that order), each within its own try budget,
    record each outcome, then finish. Each try has its own message id and
    reply event (SendRequest.label), and a restarted compensation is a new
    attempt, so no try is ever taken for a re-send of another."""
    yield from _status(context, plan, StatusKind.COMPENSATING)
    steps = {s.Name: s for s in plan.Steps}
    iid = context.instance_id
    for name in undo:
        ok, error = yield from _undo_step(context, plan, steps.get(name) or StepPlan(Name=name))
        yield from _write(
            context,
            commands.UndoDone(InstanceId=iid, Step=name)
            if ok
            else commands.UndoFailed(InstanceId=iid, Step=name, Reason=error),
        )
    return (yield from _finish_compensation(context, plan))


def _undo_step(context, plan: Plan, step: StepPlan):
    """Undo `step` within plan.UndoTries tries, each racing its own deadline;
    a later try does not listen for an earlier one's answer. (ok, error)."""
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
