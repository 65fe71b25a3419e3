"""The order workflow: the Scheduler's Durable orchestration, one instance
per attempt (instance id `{OrderID}:{Attempt}`). It reads top to bottom: the
version dispatch, the attempt, then the helpers in the order it reaches them,
and imports only the activity contracts, the state commands and the domain.

Deterministic by construction: it only yields Durable context calls, reads
time from `context.current_utc_datetime`, and gets everything else (the
order's plan, each write's etag) from its input or from activities, whose
results the history replays.

One protocol for every attempt (ADR 021a): the claim marked every step to do
Running until the attempt's one deadline (ADR 002) and put the plan in the
input, so the attempt sends each step, races its reply against that deadline,
and writes the record once at its end. Timer first, or a transient failure:
stop and leave the record to the Supervisor. A permanent failure: the same one
write begins the compensation of every step possibly sent, or fails the order
if no step was done. Every write is fenced by LockedBy = this instance: a
stale write ends the attempt quietly. An attempt without a plan compensates
from the record's undo log. Status sends never hold up the work; a terminal
one that fails stays in the record's outbox for the Starter (ADR 001).

Versions: `context.version` picks the code; a change the replay would notice
is a branch on it in this file, a frozen copy only for a deployed version with
instances in flight (ADR 018d)."""

from __future__ import annotations

import contextlib
import functools
import json
import weakref
from collections.abc import Callable, Generator, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from azure.durable_functions import RetryOptions

from domain.ids import reply_event_name
from domain.models import AgentReply, ProcessState, ReplyOutcome, StatusKind
from domain.steps import DEFAULT_CATALOG, StepCatalog
from orchestrators import commands
from orchestrators.contracts import (
    AlertNote,
    AttemptStart,
    FinishAll,
    LoadPlanInput,
    Plan,
    SendRequest,
    SendStep,
    StatusNote,
    StepPlan,
    WorkflowResult,
    WriteResult,
    Wrote,
    reply_from_event,
)

WORKFLOW_NAME = "order_workflow"
VERSION = "1.0"

# Activities are idempotent: a brief store or bus hiccup is retried here, well
# inside a step deadline, rather than failing the whole attempt.
ACTIVITY_RETRY = RetryOptions(first_retry_interval_in_milliseconds=500, max_number_of_attempts=3)

Body = Callable[..., Generator[Any, Any, Any]]


class UnknownWorkflowVersion(Exception):
    pass


class StaleAttempt(Exception):
    """Another attempt owns the order now: this attempt ends quietly. Raised
    by `unless_stale` only, caught by `ends_stale`."""

    def __init__(self, reason: str | None, step: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.step = step


def finish(outcome: str, step: str | None = None, detail: str | None = None) -> dict:
    """The orchestration's output without its empty fields (the history keeps it)."""
    return WorkflowResult(Outcome=outcome, Step=step, Detail=detail).model_dump(
        mode="json", exclude_none=True
    )


def ends_stale(body: Body) -> Body:
    """Decorates a workflow body (a generator of the context): a StaleAttempt
    from anywhere in it ends the orchestration with the "stale" result,
    naming the step it was at and the reason."""

    @functools.wraps(body)
    def run(context, **options):
        try:
            return (yield from body(context, **options))
        except StaleAttempt as stale:
            return finish("stale", stale.step, stale.reason)

    return run


# --- which code runs an instance --------------------------------------------------------


def orchestrator(
    frozen: Mapping[str, Body] | None = None, steps: StepCatalog = DEFAULT_CATALOG
) -> Body:
    """The orchestrator function: each instance runs the code of the version
    it started on, `run` for VERSION (or none), `frozen[v]` for a deployed
    version v still in flight; an unknown version is refused by name rather
    than run on code it was not written for. `steps`: the app's catalog, whose
    entries say which order fields each step's requests carry."""
    known: dict[str, Body] = {**(frozen or {}), VERSION: functools.partial(run, steps=steps)}

    def order_workflow(context):
        version = context.version or VERSION
        body = known.get(version)
        if body is None:
            raise UnknownWorkflowVersion(
                f"instance {context.instance_id} has version {version!r}; this build knows "
                f"{', '.join(sorted(known))}"
            )
        return (yield from body(context))

    return order_workflow


# --- the attempt ---------------------------------------------------------------------------


@ends_stale
def run(context, steps: StepCatalog = DEFAULT_CATALOG):
    """One attempt, from the plan its claim put in its input; without one,
    the compensation the record's log asks for."""
    given = _attempt_input(context)
    if given.Plan is not None and given.Deadline is not None:
        return (yield from _run_planned(context, given, steps))
    plan = yield from _load_plan(context)
    if plan.State is ProcessState.COMPENSATING:
        # An operator's or a restarted compensation: the record's log says what.
        plan = _with_payload(plan, given.Payload, steps)
        return (yield from _compensate(context, plan, plan.Undo))
    # Started with no claim behind it: nothing is marked for it to send. The
    # Supervisor returns the record to the Starter at its deadline.
    return finish("unplanned", detail=f"no plan in the input; record {plan.State.value}")


def _run_planned(context, given: AttemptStart, steps: StepCatalog):
    """The attempt its claim planned: each step's request and reply under the
    attempt's one deadline, then one write."""
    plan = given.Plan
    deadline = given.Deadline
    if plan is None or deadline is None:
        raise ValueError(f"attempt {context.instance_id} has no plan or deadline in its input")
    # Each request carries its step's part of the payload: the activities of
    # one order may run on different instances, so none can count on another's copy.
    plan = _with_payload(plan, given.Payload, steps)
    done: dict[str, str | None] = {}
    last = None
    # One durable timer for the whole attempt, the same task waited on again
    # by every step (as the undo's earlier tries are).
    timer = None
    # The first step's request is the Starter's to send (ADR 021l): its reply's
    # wait is open from the first episode, before anything else is awaited.
    sent = _sent_by_starter(plan, given.Sent)
    first = (
        context.wait_for_external_event(reply_event_name(sent, plan.Attempt, "do"))
        if sent
        else None
    )
    yield from _progress(
        context, plan, StatusKind.PROCESSING, detail=f"attempt {plan.Attempt}", waiting=first
    )
    for step in plan.Steps:
        if step.Completed:
            continue
        last = step.Name
        answer = None
        if step.Name == sent:
            answer = first
        elif step.Mode != "inline":
            answer = context.wait_for_external_event(
                reply_event_name(step.Name, plan.Attempt, "do")
            )
            yield from _send_step(context, plan, step, deadline, answer)
        if timer is None:
            timer = context.create_timer(deadline)
        reply = yield from _await_marked(context, plan, step, deadline, timer, answer)
        if reply is None:
            # The record keeps CompleteBy, now past: the Supervisor's to recover.
            return finish("timed_out", step.Name, "deadline passed")
        if reply.Outcome is not ReplyOutcome.OK and not timer.is_completed:
            timer.cancel()
        if reply.Outcome is ReplyOutcome.TRANSIENT:
            return (yield from _transient(context, step.Name, reply.Error))
        if reply.Outcome is ReplyOutcome.PERMANENT:
            return (yield from _permanent(context, given, plan, step.Name, reply.Error, done))
        done[step.Name] = (reply.Result or {}).get("Reference")
        yield from _progress(context, plan, StatusKind.STEP_COMPLETED, step=step.Name)
    if timer is not None and not timer.is_completed:
        timer.cancel()
    return (yield from _finish_planned(context, done, deadline, last))


def _sent_by_starter(plan: Plan, sent: str | None) -> str | None:
    """The step whose request the Starter sent, when it is what the Starter
    sends: the attempt's first step to do, a remote one; otherwise None (the
    attempt sends it, and duplicate detection drops a second copy)."""
    todo = next((s for s in plan.Steps if not s.Completed), None)
    if sent is None or todo is None or todo.Name != sent or todo.Mode == "inline":
        return None
    return sent


def _send_step(context, plan: Plan, step: StepPlan, deadline: datetime, answer):
    """Send `step`'s request. A send whose answer was lost may have left:
    its reply still counts until the deadline, when the Supervisor would take
    the attempt anyway. Waiting costs nothing; failing here would leave a
    reply (a refusal, say) to a later attempt to ask for again."""
    send = _call(
        context,
        "send_step",
        SendStep(
            InstanceId=context.instance_id,
            Step=step.Name,
            Deadline=deadline,
            Payload=plan.payload_for(step.Name),
            AppId=plan.named_app,
        ).dump(),
    )
    yield from _sending(context, send, answer)


def _sending(context, send, answer):
    """Wait for `send` (an activity that sends a request) with `answer`, the wait for the
    request's reply event, open meanwhile: the first reply raised while the send runs is
    the one `answer` takes. The Durable Python SDK keeps only the last of the same-named
    events that arrive while nothing waits for them (a duplicate delivery's later answer
    would replace an earlier refusal: scale seed 54000465); an open wait takes the first.
    Done when either is: a reply (the send's own answer may come later, unread), or the
    send, succeeded or failed after its retries (task_any hands a failure over as its
    winner, not as an exception)."""
    yield context.task_any([send, answer])


def _finish_planned(context, done: dict[str, str | None], deadline: datetime, last):
    """The attempt's one write: every step done Completed, the order
    Processed and its status sent."""
    try:
        finished = yield from _finish_all(
            context,
            FinishAll(
                InstanceId=context.instance_id,
                Done=done,
                # The attempt's one index entry is at its deadline.
                IndexedAt=deadline,
            ),
        )
    except Exception:  # the SDK raises the activity's failure here after its retries
        # Either the write did not land (the Supervisor retries the attempt at
        # its deadline) or the status is still in the outbox (the Starter's).
        return finish("unconfirmed", last, "finishing write or its status failed")
    # Outside the try: a stale finish ends as "stale", not "unconfirmed".
    unless_stale(finished, last)
    return finish("processed")


def _await_marked(context, plan: Plan, step: StepPlan, deadline: datetime, timer, answer):
    """Wait for `step`'s reply (`answer`, the wait `_sending` opened; or run the inline
    step) until the attempt's timer fires; the reply, or None when the deadline came first."""
    if step.Mode == "inline":
        request = SendRequest(
            InstanceId=context.instance_id,
            Step=step.Name,
            Deadline=deadline,
            Payload=plan.payload_for(step.Name),
            AppId=plan.named_app,
        )
        task = context.call_activity("run_inline_step", _traced(context, request.dump()))
    else:
        task = answer
    winner = yield context.task_any([task, timer])
    return None if winner is timer else _reply(context, plan, step.Name, "do", task.result)


def _finish_all(context, data: FinishAll):
    return Wrote.model_validate((yield _call(context, "finish_attempt", data.dump())))


def _permanent(context, given: AttemptStart, plan: Plan, step: str, error: str | None, done: dict):
    """A non-transient failure: when a step was done (by this attempt or an
    earlier one), one write completes what this did and begins the
    compensation of every step possibly sent; otherwise the order fails."""
    iid = context.instance_id
    reason = f"step {step} failed: {error}"
    names = [s.Name for s in plan.Steps]
    # The steps after the failed one were never sent by this attempt; those
    # NotStarted before its claim were never sent by any.
    unsent = [n for n in names[names.index(step) + 1 :] if n in (given.Fresh or [])]
    compensate = bool(done) or any(s.Completed for s in plan.Steps)
    ended = yield from _finish_all(
        context,
        FinishAll(
            InstanceId=iid,
            Done=done,
            Failed=step,
            Reason=reason,
            Unsent=unsent,
            Compensate=compensate,
        ),
    )
    unless_stale(ended, step)
    if compensate:
        # The plan as that write left the record: Compensating, its undo log.
        logged = ended.Plan
        if logged is None:
            raise ValueError(f"finish_attempt of {iid} began a compensation without its plan")
        logged = logged.model_copy(update={"Payload": plan.Payload, "Parts": plan.Parts})
        return (yield from _compensate(context, logged, logged.Undo))
    yield from _alert(context, plan, "OrderError", reason)
    yield from _terminal_status(context, plan, StatusKind.FAILED, step, reason)
    return finish("failed", step, reason)


# --- scheduling an activity, with the attempt's trace context ---------------------------


def _call(context, name: str, data: dict):
    return context.call_activity_with_retry(name, ACTIVITY_RETRY, _traced(context, data))


def _traced(context, data: dict) -> dict:
    """`data` with the attempt's trace context (AttemptStart.Trace), so the
    activity's span joins the attempt's trace. The orchestrator opens no span
    itself: it copies a value from its own input, which replays identically.
    A context that is a traceparent alone goes as that string (Traced.Trace)."""
    trace = _input_trace(context)
    if not trace:
        return data
    return {**data, "Trace": trace["traceparent"] if list(trace) == ["traceparent"] else trace}


# The trace context read once per episode (get_input() decodes the whole input
# on each call), keyed weakly by the episode's context object so that it lives
# exactly as long as the episode; a replay reads the same input.
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


# --- reading the input and the record --------------------------------------------------------------


def _attempt_input(context) -> AttemptStart:
    raw = context.get_input()
    if isinstance(raw, str) and raw:
        raw = json.loads(raw)
    if isinstance(raw, dict):
        return AttemptStart.of_instance(raw, context.instance_id)
    return AttemptStart()


def _with_payload(plan: Plan, payload: dict | None, steps: StepCatalog) -> Plan:
    """`plan` with the input's step payload (a plan an activity returns has
    none; without one, the claimer could not read it: the plan's own) and
    each step's part of it, the fields its entry in `steps` names (a step the
    catalog does not know takes them all)."""
    payload = payload or plan.Payload
    names = dict.fromkeys([*(s.Name for s in plan.Steps), *plan.Undo])
    parts = {name: steps.part(name, payload) for name in names} if payload else {}
    return plan.model_copy(update={"Payload": payload, "Parts": parts})


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
    """A failed inline step as the transient reply an agent would have sent,
    its reason on the record for the Supervisor's retry, Error and alert. The
    failure's text is Durable's "{Reason} \\n {Details}": the reason (with the
    exception's type) is kept, the stack trace dropped; the reply's Error type
    masks card numbers and cuts the text."""
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


def _write(context, command: commands.StateWrite, step: str | None = None):
    """Write `command`; stale names `step`, by default the command's own."""
    result = WriteResult.model_validate((yield _call(context, "write_state", command.dump())))
    return unless_stale(result, step or getattr(command, "Step", None))


def _status(
    context, plan: Plan, kind: StatusKind, step: str | None = None, detail: str | None = None
):
    yield _status_task(context, plan, kind, step, detail)


def _status_task(
    context, plan: Plan, kind: StatusKind, step: str | None = None, detail: str | None = None
):
    return _call(
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


def _progress(
    context,
    plan: Plan,
    kind: StatusKind,
    step: str | None = None,
    detail: str | None = None,
    waiting=None,
):
    """A progress status, if the application asked for them: best effort, no
    outbox; a refusing reply queue must not stop an attempt whose requests are out.
    `waiting`: a reply's wait kept open while the status is sent (`_sending`
    says why); done when either is."""
    if not plan.Progress:
        return
    if waiting is not None:
        yield context.task_any([_status_task(context, plan, kind, step, detail), waiting])
        return
    with contextlib.suppress(Exception):  # the SDK raises the activity's failure after its retries
        yield from _status(context, plan, kind, step, detail)


def _terminal_status(
    context, plan: Plan, status: StatusKind, step: str | None = None, detail: str | None = None
):
    """Send the terminal status from the record's outbox; if every try fails,
    the Starter delivers it and the orchestration still finishes."""
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
    """Undo `undo` in that order and record each outcome; then Compensated,
    CompensationFailed when one was refused, or else (some undo unconfirmed)
    a long retry of the compensation (ADR 019a)."""
    # Best effort: a refusing reply queue must not keep any undo from being sent.
    with contextlib.suppress(Exception):  # the SDK raises the activity's failure after its retries
        yield from _status(context, plan, StatusKind.COMPENSATING)
    steps = {s.Name: s for s in plan.Steps}
    iid = context.instance_id
    unconfirmed = refused = False
    for name in undo:
        outcome, error = yield from _undo_step(
            context, plan, steps.get(name) or StepPlan(Name=name)
        )
        if outcome is ReplyOutcome.OK:
            command: commands.StateWrite = commands.UndoDone(InstanceId=iid, Step=name)
        elif outcome is ReplyOutcome.PERMANENT:
            refused = True
            command = commands.UndoFailed(InstanceId=iid, Step=name, Reason=error)
        else:
            unconfirmed = True
            command = commands.UndoUnconfirmed(InstanceId=iid, Step=name, Reason=error)
        yield from _write(context, command)
    if unconfirmed and not refused:
        return (yield from _defer_compensation(context, plan))
    return (yield from _finish_compensation(context, plan))


def _undo_step(context, plan: Plan, step: StepPlan):
    """Undo `step` within plan.UndoTries tries under the undo's one deadline
    `undo_by`, the earlier tries' answers still counting (ADR 005). Each
    pending task is waited on again as the same task object, never a second
    wait for the same event name (azure-functions-durable-python#507).

    Returns (outcome, error): OK, PERMANENT, or TRANSIENT when no answer says
    what happened (unconfirmed: the long retry tries again, ADR 019a)."""
    result: tuple[ReplyOutcome, str | None] = (
        ReplyOutcome.TRANSIENT,
        "no reply before the deadline",
    )
    earlier: list = []  # tasks of earlier tries that have not answered yet
    undo_by = context.current_utc_datetime + timedelta(
        seconds=plan.StepTimeoutSeconds * plan.UndoTries
    )
    for attempt_try in range(plan.UndoTries):
        deadline = min(
            context.current_utc_datetime + timedelta(seconds=plan.StepTimeoutSeconds), undo_by
        )
        current = yield from _request_undo(context, plan, step, deadline, attempt_try, undo_by)
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
                return ReplyOutcome.OK, None
            result = (reply.Outcome, reply.Error or reply.Outcome.value)
            if reply.Outcome is ReplyOutcome.PERMANENT:
                if not timer.is_completed:
                    timer.cancel()
                return result
            if winner is current and (attempt_try + 1 < plan.UndoTries or not waiting):
                if not timer.is_completed:
                    timer.cancel()
                break  # this try gave up for now: the next try, earlier ones still count
            # An earlier try's late failure, or the last try's: earlier tries
            # may still answer until this try's deadline.
        earlier = waiting
    return result


def _request_undo(context, plan: Plan, step: StepPlan, deadline, attempt_try: int, listen_until):
    """Send try `attempt_try` of `step`'s undo (or start its inline activity)
    and return the task its answer completes. Each try has its own message
    id and reply event (SendRequest.label)."""
    request = SendRequest(
        InstanceId=context.instance_id,
        Step=step.Name,
        Action="undo",
        Try=attempt_try,
        Deadline=deadline,
        Payload=plan.payload_for(step.Name),
        ListenUntil=listen_until,
        AppId=plan.named_app,
    )
    if step.Mode == "inline":
        return context.call_activity("run_inline_step", _traced(context, request.dump()))
    answer = context.wait_for_external_event(
        reply_event_name(step.Name, plan.Attempt, request.label)
    )
    send = _call(context, "send_agent_request", request.dump())
    yield from _sending(context, send, answer)
    if send.is_completed:
        yield send  # a send that failed after its retries raises here, as it always has
    return answer


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


def _defer_compensation(context, plan: Plan):
    """Defer the compensation to its long retry (ADR 019a), or, its long
    retries spent, end it CompensationFailed with its alert and status."""
    written = yield from _write(context, commands.DeferCompensation(InstanceId=context.instance_id))
    if written.State is ProcessState.COMPENSATING:
        return finish("compensation_deferred", detail="undo unconfirmed; long retry")
    reason = f"compensation of order {plan.OrderID} failed: undo unconfirmed after its long retries"
    yield from _alert(context, plan, "CompensationFailed", reason)
    yield from _terminal_status(context, plan, StatusKind.COMPENSATION_FAILED, detail=reason)
    return finish("compensation_failed", detail=reason)


# The orchestrator function_app.py registers: the live version only.
order_workflow = orchestrator()
