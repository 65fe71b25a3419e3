"""What every version of the order workflow does the same way: read the plan,
write the record, report a status, raise an alert, end with a result, and end
quietly when another attempt owns the order (`StaleAttempt`).

Each helper that schedules an activity takes `call`, the version's way of
scheduling one (1.0 plainly, later versions with the attempt's trace context),
so a 1.0 instance yields exactly the actions its history holds. Generators,
used with `yield from`; deterministic like the rest of the orchestration."""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from typing import Any, Protocol, TypeVar

from azure.durable_functions import RetryOptions

from domain.ids import reply_event_name
from domain.models import StatusKind
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
)

# Activities are idempotent, so a brief store or bus hiccup is retried here
# rather than failing the attempt (which the Supervisor would then retry as a
# whole). Three tries inside a few seconds stay well inside a step deadline.
ACTIVITY_RETRY = RetryOptions(first_retry_interval_in_milliseconds=500, max_number_of_attempts=3)

Call = Callable[[Any, str, dict], Any]


def call_plain(context, name: str, data: dict):
    return context.call_activity_with_retry(name, ACTIVITY_RETRY, data)


class StaleAttempt(Exception):
    """Another attempt owns the order now (a write or the plan came back
    stale): this attempt ends quietly. Raised by `unless_stale` only, and
    caught once per workflow version by `ends_stale`."""

    def __init__(self, reason: str | None, step: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step = step


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


def finish(outcome: str, step: str | None = None, detail: str | None = None) -> dict:
    return WorkflowResult(Outcome=outcome, Step=step, Detail=detail).dump()


Body = Callable[[Any], Generator[Any, Any, Any]]


def ends_stale(body: Body) -> Body:
    """Decorates a workflow version (a generator of the context): a
    StaleAttempt from anywhere in it ends the orchestration with the "stale"
    result, naming the step it was at and the reason."""

    @functools.wraps(body)
    def run(context):
        try:
            return (yield from body(context))
        except StaleAttempt as stale:
            return finish("stale", stale.step, stale.reason)

    return run


def load_plan(call: Call, context):
    plan = Plan.model_validate(
        (yield call(context, "load_plan", LoadPlanInput(InstanceId=context.instance_id).dump()))
    )
    return unless_stale(plan)


def write(call: Call, context, command: commands.StateWrite, step: str | None = None):
    """Write `command`; stale names `step`, by default the command's own."""
    result = WriteResult.model_validate((yield call(context, "write_state", command.dump())))
    return unless_stale(result, step or getattr(command, "Step", None))


def request_step(
    call: Call,
    context,
    plan: Plan,
    step: StepPlan,
    action: str,
    deadline,
    attempt_try: int = 0,
    inline_input: Callable[[Any, dict], dict] | None = None,
    listen_until=None,
):
    """Send the request for `step` (or start its inline activity, whose input
    `inline_input` may add to) and return the task its answer completes.
    `listen_until`: when the workflow still takes a late answer (AgentRequest)."""
    request = SendRequest(
        InstanceId=context.instance_id,
        Step=step.Name,
        Action=action,
        Try=attempt_try,
        Deadline=deadline,
        Payload=plan.Payload,
        ListenUntil=listen_until,
        AppId=plan.AppId,
    )
    if step.Mode == "inline":
        data = request.dump()
        return context.call_activity(
            "run_inline_step", data if inline_input is None else inline_input(context, data)
        )
    yield call(context, "send_agent_request", request.dump())
    return context.wait_for_external_event(reply_event_name(step.Name, plan.Attempt, request.label))


def status(
    call: Call,
    context,
    plan: Plan,
    kind: StatusKind,
    step: str | None = None,
    detail: str | None = None,
):
    yield call(
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


def alert(call: Call, context, plan: Plan, kind: str, reason: str):
    yield call(
        context, "raise_alert", AlertNote(Kind=kind, OrderID=plan.OrderID, Reason=reason).dump()
    )
