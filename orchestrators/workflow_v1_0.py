"""Version 1.0 of the order workflow, frozen: instances started under 1.0
(and instances without a version, started before versions existed) replay
this code until none is left. New instances run the live version
(orchestrators/workflow_v2_1.py). Do not change what this code schedules, or
in-flight 1.0 instances stop replaying: the history corpus
(tests/fixtures/histories/1.0-*.json, replayed by
tests/unit/orchestrators/test_history_corpus.py) fails first. Its activities
answer 1.0's calls as before (write kinds and inputs are kept backward
compatible). This file holds every helper 1.0 reaches; it imports only the
activity contracts, the state commands and the domain
(docs/adr/018d-one-file-per-workflow-version.md).

Every activity is scheduled plainly (`_call`): no trace context, as when its
histories were written."""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from azure.durable_functions import RetryOptions

from domain.ids import reply_event_name
from domain.models import ProcessState, ReplyOutcome, StatusKind
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

VERSION = "1.0"

# Activities are idempotent, so a brief store or bus hiccup is retried here
# rather than failing the attempt. Three tries inside a few seconds.
ACTIVITY_RETRY = RetryOptions(first_retry_interval_in_milliseconds=500, max_number_of_attempts=3)


class StaleAttempt(Exception):
    """Another attempt owns the order now: this attempt ends quietly. Raised
    by `unless_stale` only, and caught by `ends_stale`."""

    def __init__(self, reason: str | None, step: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step = step


def finish(outcome: str, step: str | None = None, detail: str | None = None) -> dict:
    return WorkflowResult(Outcome=outcome, Step=step, Detail=detail).dump()


Body = Callable[[Any], Generator[Any, Any, Any]]


def ends_stale(body: Body) -> Body:
    """A StaleAttempt from anywhere in `body` ends the orchestration with the
    "stale" result, naming the step it was at and the reason."""

    @functools.wraps(body)
    def run(context):
        try:
            return (yield from body(context))
        except StaleAttempt as stale:
            return finish("stale", stale.step, stale.reason)

    return run


def _run_step(context, plan: Plan, step: StepPlan, action: str, attempt_try: int = 0):
    """Send one request (or run the inline step) and race it against its deadline."""
    deadline = context.current_utc_datetime + timedelta(seconds=plan.StepTimeoutSeconds)
    task = yield from _request(context, plan, step, action, deadline, attempt_try)
    result = yield from _race(context, task, deadline)
    return None if result is None else reply_from_event(result)


@ends_stale
def run(context):
    iid = context.instance_id
    plan = yield from _load_plan(context)
    if plan.State is ProcessState.COMPENSATING:
        # An operator asked for compensation and this attempt claimed it.
        done = [s for s in plan.Steps if s.Completed]
        return (yield from _compensate(context, plan, done))

    yield from _status(context, plan, StatusKind.PROCESSING, detail=f"attempt {plan.Attempt}")
    completed = [s for s in plan.Steps if s.Completed]
    for step in plan.Steps:
        if step.Completed:
            continue  # resume: a previous attempt finished it
        deadline = context.current_utc_datetime + timedelta(seconds=plan.StepTimeoutSeconds)
        yield from _write(
            context,
            commands.StartStep(InstanceId=iid, Step=step.Name, Deadline=deadline),
        )

        reply = yield from _run_step(context, plan, step, "do")
        if reply is None or reply.Outcome is ReplyOutcome.TRANSIENT:
            # The step failed for this attempt. The record keeps CompleteBy =
            # the step's deadline; the Supervisor retries or gives up.
            detail = "deadline passed" if reply is None else reply.Error
            return finish("timed_out", step.Name, detail)

        if reply.Outcome is ReplyOutcome.PERMANENT:
            reason = f"step {step.Name} failed: {reply.Error}"
            if completed:
                # 1.0 names no step in this write (it undoes Completed steps only).
                command = commands.BeginCompensation(InstanceId=iid, Reason=reason)
                yield from _write(context, command, step.Name)
                return (yield from _compensate(context, plan, completed))
            yield from _write(
                context,
                commands.MarkFailed(InstanceId=iid, Step=step.Name, Reason=reason),
            )
            yield from _alert(context, plan, "OrderError", reason)
            yield from _status(context, plan, StatusKind.FAILED, step.Name, reason)
            return finish("failed", step.Name, reason)

        reference = (reply.Result or {}).get("Reference")
        yield from _write(
            context,
            commands.CompleteStep(InstanceId=iid, Step=step.Name, Reference=reference),
        )
        completed.append(step)
        yield from _status(context, plan, StatusKind.STEP_COMPLETED, step.Name)

    yield from _write(context, commands.MarkProcessed(InstanceId=iid))
    yield from _status(context, plan, StatusKind.PROCESSED)
    return finish("processed")


def _compensate(context, plan: Plan, completed: list[StepPlan]):
    """Undo completed steps in reverse order, each within its own try budget."""
    iid = context.instance_id
    yield from _status(context, plan, StatusKind.COMPENSATING)
    for step in reversed(completed):
        ok, error = False, "no reply before the deadline"
        for attempt_try in range(plan.UndoTries):
            reply = yield from _run_step(context, plan, step, "undo", attempt_try)
            if reply is not None and reply.Outcome is ReplyOutcome.OK:
                ok = True
                break
            if reply is not None:
                error = reply.Error or reply.Outcome.value
                if reply.Outcome is ReplyOutcome.PERMANENT:
                    break
        command = (
            commands.UndoDone(InstanceId=iid, Step=step.Name)
            if ok
            else commands.UndoFailed(InstanceId=iid, Step=step.Name, Reason=error)
        )
        yield from _write(context, command)

    written = yield from _write(context, commands.FinishCompensation(InstanceId=iid))
    if written.State is ProcessState.COMPENSATED:
        yield from _status(context, plan, StatusKind.COMPENSATED)
        return finish("compensated")
    reason = f"compensation of order {plan.OrderID} failed"
    yield from _alert(context, plan, "CompensationFailed", reason)
    yield from _status(context, plan, StatusKind.COMPENSATION_FAILED, detail=reason)
    return finish("compensation_failed", detail=reason)


def _call(context, name: str, data: dict):
    return context.call_activity_with_retry(name, ACTIVITY_RETRY, data)


class _MaybeStale(Protocol):
    @property
    def Stale(self) -> bool: ...  # noqa: N802 (the contracts' field name)

    @property
    def Reason(self) -> str | None: ...  # noqa: N802


R = TypeVar("R", bound=_MaybeStale)


def unless_stale(result: R, step: str | None = None) -> R:
    if result.Stale:
        raise StaleAttempt(result.Reason, step)
    return result


def _load_plan(context):
    plan = Plan.model_validate(
        (yield _call(context, "load_plan", LoadPlanInput(InstanceId=context.instance_id).dump()))
    )
    return unless_stale(plan)


def _write(context, command: commands.StateWrite, step: str | None = None):
    """Write `command`; stale names `step`, by default the command's own."""
    result = WriteResult.model_validate((yield _call(context, "write_state", command.dump())))
    return unless_stale(result, step or getattr(command, "Step", None))


def _request(context, plan: Plan, step: StepPlan, action: str, deadline, attempt_try: int = 0):
    """Send the request for `step` (or start its inline activity) and return
    the task its answer completes."""
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
        return context.call_activity("run_inline_step", request.dump())
    yield _call(context, "send_agent_request", request.dump())
    return context.wait_for_external_event(reply_event_name(step.Name, plan.Attempt, request.label))


def _race(context, task, deadline: datetime):
    """`task`'s result, or None when the durable timer at `deadline` fired first
    (the timer is cancelled when the task wins)."""
    timer = context.create_timer(deadline)
    winner = yield context.task_any([task, timer])
    if winner is timer:
        return None
    if not timer.is_completed:
        timer.cancel()
    return task.result


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


def _alert(context, plan: Plan, kind: str, reason: str):
    yield _call(
        context, "raise_alert", AlertNote(Kind=kind, OrderID=plan.OrderID, Reason=reason).dump()
    )
