"""Version 1.0 of the order workflow, frozen: instances started under 1.0
replay this code until none is left (DESIGN.md §4 'Versioning'). New
instances run the current version in orchestrators.order_workflow. Do not
change what this code schedules, or in-flight 1.0 instances stop replaying.
Its activities answer 1.0's calls as before (write kinds and inputs are kept
backward compatible)."""

from __future__ import annotations

from datetime import timedelta

from azure.durable_functions import RetryOptions

from domain.ids import reply_event_name
from domain.models import ProcessState, ReplyOutcome, StatusKind
from orchestrators.contracts import (
    AlertNote,
    LoadPlanInput,
    Plan,
    SendRequest,
    StateWrite,
    StatusNote,
    StepPlan,
    WorkflowResult,
    WriteResult,
    reply_from_event,
)
from orchestrators.deadline import race

ACTIVITY_RETRY = RetryOptions(first_retry_interval_in_milliseconds=500, max_number_of_attempts=3)


def _call(context, name: str, data: dict):
    return context.call_activity_with_retry(name, ACTIVITY_RETRY, data)


# --- version 1.0 ---------------------------------------------------------------------


def _write(context, plan: Plan, kind: str, **fields):
    result = yield _call(
        context,
        "write_state",
        StateWrite(InstanceId=context.instance_id, Kind=kind, **fields).dump(),
    )
    return WriteResult.model_validate(result)


def _status(
    context, plan: Plan, status: StatusKind, step: str | None = None, detail: str | None = None
):
    yield _call(
        context,
        "report_status",
        StatusNote(
            InstanceId=context.instance_id,
            ReplyTo=plan.ReplyTo,
            Status=status,
            Step=step,
            Detail=detail,
        ).dump(),
    )


def _alert(context, plan: Plan, kind: str, reason: str):
    yield _call(
        context, "raise_alert", AlertNote(Kind=kind, OrderID=plan.OrderID, Reason=reason).dump()
    )


def _run_step(context, plan: Plan, step: StepPlan, action: str, attempt_try: int = 0):
    """Send one request (or run the inline step) and race it against its deadline."""
    deadline = context.current_utc_datetime + timedelta(seconds=plan.StepTimeoutSeconds)
    request = SendRequest(
        InstanceId=context.instance_id,
        Step=step.Name,
        Action=action,
        Try=attempt_try,
        Deadline=deadline,
        Payload=plan.Payload,
    )
    if step.Mode == "inline":
        task = context.call_activity("run_inline_step", request.dump())
    else:
        yield _call(context, "send_agent_request", request.dump())
        task = context.wait_for_external_event(
            reply_event_name(step.Name, plan.Attempt, request.label)
        )
    result = yield from race(context, task, deadline)
    return None if result is None else reply_from_event(result)


def _finish(outcome: str, step: str | None = None, detail: str | None = None) -> dict:
    return WorkflowResult(Outcome=outcome, Step=step, Detail=detail).dump()


def run_v1(context):
    plan = Plan.model_validate(
        (yield _call(context, "load_plan", LoadPlanInput(InstanceId=context.instance_id).dump()))
    )
    if plan.Stale:
        return _finish("stale", detail=plan.Reason)
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
        written = yield from _write(context, plan, "start_step", Step=step.Name, Deadline=deadline)
        if written.Stale:
            return _finish("stale", step.Name, written.Reason)

        reply = yield from _run_step(context, plan, step, "do")
        if reply is None or reply.Outcome is ReplyOutcome.TRANSIENT:
            # The step failed for this attempt. The record keeps CompleteBy =
            # the step's deadline; the Supervisor retries or gives up.
            detail = "deadline passed" if reply is None else reply.Error
            return _finish("timed_out", step.Name, detail)

        if reply.Outcome is ReplyOutcome.PERMANENT:
            reason = f"step {step.Name} failed: {reply.Error}"
            if completed:
                written = yield from _write(context, plan, "begin_compensation", Reason=reason)
                if written.Stale:
                    return _finish("stale", step.Name, written.Reason)
                return (yield from _compensate(context, plan, completed))
            written = yield from _write(context, plan, "failed", Step=step.Name, Reason=reason)
            if written.Stale:
                return _finish("stale", step.Name, written.Reason)
            yield from _alert(context, plan, "OrderError", reason)
            yield from _status(context, plan, StatusKind.FAILED, step.Name, reason)
            return _finish("failed", step.Name, reason)

        reference = (reply.Result or {}).get("Reference")
        written = yield from _write(
            context, plan, "complete_step", Step=step.Name, Reference=reference
        )
        if written.Stale:
            return _finish("stale", step.Name, written.Reason)
        completed.append(step)
        yield from _status(context, plan, StatusKind.STEP_COMPLETED, step.Name)

    written = yield from _write(context, plan, "processed")
    if written.Stale:
        return _finish("stale", detail=written.Reason)
    yield from _status(context, plan, StatusKind.PROCESSED)
    return _finish("processed")


def _compensate(context, plan: Plan, completed: list[StepPlan]):
    """Undo completed steps in reverse order, each within its own try budget."""
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
        written = yield from _write(
            context,
            plan,
            "undo_done" if ok else "undo_failed",
            Step=step.Name,
            Reason=None if ok else error,
        )
        if written.Stale:
            return _finish("stale", step.Name, written.Reason)

    written = yield from _write(context, plan, "finish_compensation")
    if written.Stale:
        return _finish("stale", detail=written.Reason)
    if written.State is ProcessState.COMPENSATED:
        yield from _status(context, plan, StatusKind.COMPENSATED)
        return _finish("compensated")
    reason = f"compensation of order {plan.OrderID} failed"
    yield from _alert(context, plan, "CompensationFailed", reason)
    yield from _status(context, plan, StatusKind.COMPENSATION_FAILED, detail=reason)
    return _finish("compensation_failed", detail=reason)
