"""Version 1.0 of the order workflow, frozen: instances started under 1.0
replay this code until none is left (DESIGN.md §4 'Versioning'). New
instances run the current version in orchestrators.order_workflow. Do not
change what this code schedules, or in-flight 1.0 instances stop replaying.
Its activities answer 1.0's calls as before (write kinds and inputs are kept
backward compatible)."""

from __future__ import annotations

from datetime import timedelta

from domain.models import ProcessState, ReplyOutcome, StatusKind
from orchestrators import commands
from orchestrators.contracts import (
    Plan,
    StepPlan,
    reply_from_event,
)
from orchestrators.deadline import race
from orchestrators.workflow_steps import (
    alert,
    call_plain,
    ends_stale,
    finish,
    load_plan,
    request_step,
    status,
    write,
)

# --- version 1.0 ---------------------------------------------------------------------
#
# Scheduled plainly (`call_plain`): no trace context, as when its histories were written.


def _run_step(context, plan: Plan, step: StepPlan, action: str, attempt_try: int = 0):
    """Send one request (or run the inline step) and race it against its deadline."""
    deadline = context.current_utc_datetime + timedelta(seconds=plan.StepTimeoutSeconds)
    task = yield from request_step(call_plain, context, plan, step, action, deadline, attempt_try)
    result = yield from race(context, task, deadline)
    return None if result is None else reply_from_event(result)


@ends_stale
def run_v1(context):
    iid = context.instance_id
    plan = yield from load_plan(call_plain, context)
    if plan.State is ProcessState.COMPENSATING:
        # An operator asked for compensation and this attempt claimed it.
        done = [s for s in plan.Steps if s.Completed]
        return (yield from _compensate(context, plan, done))

    yield from status(
        call_plain, context, plan, StatusKind.PROCESSING, detail=f"attempt {plan.Attempt}"
    )
    completed = [s for s in plan.Steps if s.Completed]
    for step in plan.Steps:
        if step.Completed:
            continue  # resume: a previous attempt finished it
        deadline = context.current_utc_datetime + timedelta(seconds=plan.StepTimeoutSeconds)
        yield from write(
            call_plain,
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
                yield from write(call_plain, context, command, step.Name)
                return (yield from _compensate(context, plan, completed))
            yield from write(
                call_plain,
                context,
                commands.MarkFailed(InstanceId=iid, Step=step.Name, Reason=reason),
            )
            yield from alert(call_plain, context, plan, "OrderError", reason)
            yield from status(call_plain, context, plan, StatusKind.FAILED, step.Name, reason)
            return finish("failed", step.Name, reason)

        reference = (reply.Result or {}).get("Reference")
        yield from write(
            call_plain,
            context,
            commands.CompleteStep(InstanceId=iid, Step=step.Name, Reference=reference),
        )
        completed.append(step)
        yield from status(call_plain, context, plan, StatusKind.STEP_COMPLETED, step.Name)

    yield from write(call_plain, context, commands.MarkProcessed(InstanceId=iid))
    yield from status(call_plain, context, plan, StatusKind.PROCESSED)
    return finish("processed")


def _compensate(context, plan: Plan, completed: list[StepPlan]):
    """Undo completed steps in reverse order, each within its own try budget."""
    iid = context.instance_id
    yield from status(call_plain, context, plan, StatusKind.COMPENSATING)
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
        yield from write(call_plain, context, command)

    written = yield from write(call_plain, context, commands.FinishCompensation(InstanceId=iid))
    if written.State is ProcessState.COMPENSATED:
        yield from status(call_plain, context, plan, StatusKind.COMPENSATED)
        return finish("compensated")
    reason = f"compensation of order {plan.OrderID} failed"
    yield from alert(call_plain, context, plan, "CompensationFailed", reason)
    yield from status(call_plain, context, plan, StatusKind.COMPENSATION_FAILED, detail=reason)
    return finish("compensation_failed", detail=reason)
