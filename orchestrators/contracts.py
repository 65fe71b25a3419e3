"""Inputs and results of the Scheduler's activities: one pydantic model each,
passed through Durable as plain JSON (`model_dump(mode="json")`) and validated
again on the other side, so a history written by an older version fails loudly
rather than silently."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, cast

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from domain.ids import app_of_key, parse_attempt_instance_id
from domain.models import (
    AgentReply,
    OrderState,
    OrderSubmitted,
    ProcessState,
    ReferenceText,
    ReplyAnswer,
    ReplyOutcome,
    StatusKind,
    StepStatus,
)


class ActivityContract(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def dump(self) -> dict:
        return self.model_dump(mode="json")


class Traced(ActivityContract):
    """An activity input that may carry the attempt's W3C trace context, so
    the activity's span joins the attempt's trace (ADR 015); else its own.
    A context of a traceparent alone is that string (17 bytes fewer in each
    activity's history event)."""

    Trace: dict[str, str] | str | None = None


def step_payload(order: OrderSubmitted) -> dict:
    """The order's data every agent request of it carries."""
    return {
        "CustomerId": order.Customer.CustomerId,
        "Lines": [line.model_dump(mode="json") for line in order.Lines],
        "Total": str(order.Total),
        "Currency": order.Currency,
        "PaymentReference": order.PaymentReference,
    }


class StepPlan(ActivityContract):
    Name: str
    Mode: Literal["remote", "inline"] = "remote"
    Completed: bool = False


class LoadPlanInput(Traced):
    InstanceId: str


class Plan(ActivityContract):
    """What the orchestration needs to run an attempt, read once through an
    activity (so the orchestrator itself never does I/O)."""

    Stale: bool = False
    Reason: str | None = None
    OrderID: str = ""
    Attempt: int = 0
    ReplyTo: str = ""
    State: ProcessState | None = None
    Steps: list[StepPlan] = Field(default_factory=list)
    StepTimeoutSeconds: int = 60
    UndoTries: int = 3
    Payload: dict = Field(default_factory=dict)
    # Compensating only: the record's log of steps still to undo, in order.
    Undo: list[str] = Field(default_factory=list)
    # The application opted in to progress statuses in the reply-queue registry.
    Progress: bool = False
    # The order's application, named in its agent requests (and so in their
    # replies and tokens, ADR 017e). None in a plan an older build recorded.
    AppId: str | None = None
    # Each step's part of Payload: the order fields its catalog entry names
    # (domain/steps.json), set by the workflow from the app's catalog; never
    # in an input, a result or a history.
    Parts: dict[str, dict] = Field(default_factory=dict, exclude=True)

    def payload_for(self, step: str) -> dict:
        """What `step`'s requests carry: its part, else the whole payload."""
        return self.Parts.get(step, self.Payload)

    @property
    def named_app(self) -> str | None:
        """The AppId a request input names: none when the order key names it
        (the request builder reads it there, domain.ids.app_of_key)."""
        return None if self.AppId == app_of_key(self.OrderID) else self.AppId


class WriteResult(ActivityContract):
    Stale: bool = False
    Reason: str | None = None
    State: ProcessState | None = None


class _Compact(Traced):
    """Dumped without defaults: a history holds what was said."""

    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_defaults=True)


class SendRequest(_Compact):
    """A request for a step (or its undo) within one attempt. Each undo `Try`
    has its own message id and reply event: duplicate detection drops only
    true re-sends."""

    InstanceId: str
    Step: str
    Action: Literal["do", "undo"] = "do"
    Try: int = 0
    Deadline: AwareDatetime
    Payload: dict = Field(default_factory=dict)
    ListenUntil: AwareDatetime | None = None  # AgentRequest.ListenUntil
    # The order's application (Plan.AppId), for AgentRequest.AppId; None when
    # the order key names it (Plan.named_app: the builder reads it there) or
    # from a plan an older build recorded.
    AppId: str | None = None

    @property
    def label(self) -> str:
        return "do" if self.Action == "do" else f"undo-{self.Try}"


class StatusNote(Traced):
    InstanceId: str
    ReplyTo: str
    Status: StatusKind
    Step: str | None = None
    Detail: str | None = None


class AlertNote(Traced):
    Kind: str
    OrderID: str
    Reason: str


class WorkflowResult(ActivityContract):
    Outcome: Literal[
        "processed",
        "failed",
        "compensated",
        "compensation_failed",
        "compensation_deferred",  # an unconfirmed undo waits for a long retry
        "timed_out",
        "stale",
        "unconfirmed",
        "unplanned",  # started without a claim's plan: sends nothing
    ]
    Step: str | None = None
    Detail: str | None = None


# --- the reply, as the workflows read it ------------------------------------------------


class ReplyEvent(ActivityContract, ReplyAnswer):
    """An agent's answer as the reply bridge raises it on the attempt's
    instance: what an orchestration or an operator reads of it, none of its
    identity, which the instance and the event's name already prove (ADR
    021h, 017e). `Result` keeps only `Reference` and, on an undo's reply,
    `Status`; `Calls` is the agent's call record (ADR 017d), left out when
    it is one call that answered ok: the reply is that call, and the history
    shows when it was asked and answered."""

    @classmethod
    def of(cls, reply: AgentReply) -> ReplyEvent:
        keys = ("Reference", "Status") if reply.Action == "undo" else ("Reference",)
        kept = {k: v for k, v in (reply.Result or {}).items() if k in keys}
        calls = reply.Calls
        lone_ok = calls is not None and len(calls) == 1 and calls[0].Outcome == "ok"
        if reply.Outcome is ReplyOutcome.OK and lone_ok:
            calls = None
        return cls(Outcome=reply.Outcome, Result=kept or None, Error=reply.Error, Calls=calls)

    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_none=True)


def event_payload(reply: AgentReply) -> dict:
    """What the reply bridge raises on the instance: the reply's `ReplyEvent`,
    without its identity, its seal (checked before) or its schema version."""
    return ReplyEvent.of(reply).dump()


def read_reply(value: Any) -> AgentReply | ReplyEvent:
    """An awaited reply as a workflow gets it: the event's data (a dict, or
    its JSON text: the Durable SDK's client encodes the data before posting
    it as JSON, so the history keeps it encoded twice and the SDK decodes it
    once) or an inline step's result. A full AgentReply (with an `InstanceId`,
    from a bridge of an older build) is returned as it is; else a ReplyEvent."""
    data = json.loads(value) if isinstance(value, str) else value
    if isinstance(data, dict) and "InstanceId" in data:
        if isinstance(value, str):
            return AgentReply.model_validate_json(value)
        return AgentReply.model_validate(data)
    return ReplyEvent.model_validate(data)


def reply_from_event(value: Any) -> AgentReply:
    """`read_reply` typed as the AgentReply the workflow handles: it reads only
    `Outcome`, `Error` and `Result`, which a ReplyEvent has too (test_reply_event);
    reaching for an identity field fails loudly, never reads a wrong value."""
    return cast(AgentReply, read_reply(value))


# --- the attempt's activities --------------------------------------------------------


_Plan = Plan  # fields below are named Plan too


class Wrote(ActivityContract):
    """finish_attempt's result: the state it left the record in, or why the
    attempt is stale; `Plan`: the compensation it began, as that write left it."""

    Stale: bool = False
    Reason: str | None = None
    State: ProcessState | None = None
    Plan: _Plan | None = None

    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_defaults=True)


class SendStep(_Compact):
    """Send the request of `Step` until the attempt's one `Deadline`, with no
    write: the claim marked the step Running (ADR 021a). `Payload` None: the
    claimer could not read it, and the activity reads it."""

    InstanceId: str
    Step: str
    Deadline: AwareDatetime
    Payload: dict | None = None
    AppId: str | None = None


class FinishAll(_Compact):
    """The attempt's one write: complete every step this attempt did (`Done`,
    step -> its reference, in the order done) and mark the order Processed
    with its status in the outbox (ADR 001, 021a); then retire the
    recovery-index entry at `IndexedAt`."""

    InstanceId: str
    Done: dict[str, ReferenceText] = Field(default_factory=dict)
    IndexedAt: AwareDatetime | None = None
    # A step failed for good: the same write completes `Done`, makes `Unsent`
    # NotStarted again (never sent by any attempt) and begins the compensation,
    # or with `Compensate` false fails the order; no status, no index change.
    Failed: str | None = None
    Reason: str | None = None
    Unsent: list[str] = Field(default_factory=list)
    Compensate: bool = True


def plan_for(
    record: OrderState,
    attempt: int,
    steps: list[str] | tuple[str, ...],
    modes: Mapping[str, str],
    step_timeout_seconds: int,
    progress: bool,
) -> Plan:
    """The Plan of `attempt` on `record`, for the claimer's input and
    load_plan's answer; without the payload (AttemptStart.Payload has it)."""
    undo = [e.Step for e in reversed(record.Compensation) if e.Outcome != "Done"]
    return Plan(
        OrderID=record.id,
        Attempt=attempt,
        ReplyTo=record.ReplyTo,
        State=record.ProcessState,
        Steps=[
            StepPlan(
                Name=name,
                Mode="inline" if modes.get(name) == "inline" else "remote",
                Completed=name in record.Steps
                and record.Steps[name].Status is StepStatus.COMPLETED,
            )
            for name in steps
        ],
        StepTimeoutSeconds=step_timeout_seconds,
        Undo=undo if record.ProcessState is ProcessState.COMPENSATING else [],
        Progress=progress,
        AppId=record.AppId,
    )


# What the input leaves out of its plan because the instance says it (the id
# names order and attempt; a claimed record is Processing), and the step
# timeout, which only a compensation's plan (not from the input) uses.
_IMPLIED_BY_THE_INSTANCE = {"OrderID", "Attempt", "State", "StepTimeoutSeconds"}


class AttemptStart(ActivityContract):
    """The orchestration input: the plan, the deadline the claim marked the
    steps with and the step payload, so the attempt reads neither record nor
    order (ADR 021a); a compensation's has only the payload. The history holds
    it encoded twice, so `dump` leaves out what the instance id implies and
    `Fresh` when it is every step to do; `of_instance` puts them back."""

    Payload: dict | None = None
    Deadline: AwareDatetime | None = None
    Plan: _Plan | None = None
    # The steps its claim marked that were NotStarted before it (no attempt
    # had sent them): what a failure may make NotStarted again.
    Fresh: list[str] | None = None
    Trace: dict[str, str] | None = None
    # The step whose request the Starter sends itself once the attempt has
    # started (ADR 021l): the attempt sends no request for it, it waits for
    # the reply. A Starter that dies before its send leaves the attempt to
    # its deadline, as a send whose answer was lost does.
    Sent: str | None = None

    def dump(self) -> dict:
        data = self.model_dump(mode="json", exclude_none=True)
        if self.Plan is not None:
            plan = self.Plan.model_dump(
                mode="json", exclude_defaults=True, exclude=_IMPLIED_BY_THE_INSTANCE
            )
            # The AppId the order key names, and the reply queue named after it.
            if self.Plan.AppId is not None and self.Plan.AppId == app_of_key(self.Plan.OrderID):
                del plan["AppId"]
                if self.Plan.ReplyTo == _usual_reply_queue(self.Plan.AppId):
                    plan.pop("ReplyTo", None)
            data["Plan"] = plan
            if self.Fresh == _to_do(self.Plan):
                del data["Fresh"]
        return data

    @classmethod
    def of_instance(cls, data: Any, instance_id: str) -> AttemptStart:
        """The input `dump` wrote for the attempt `instance_id`, whole again."""
        given = cls.model_validate(data)
        if given.Plan is None:
            return given
        order_id, attempt = parse_attempt_instance_id(instance_id)
        implied: dict[str, Any] = {}
        if given.Plan.AppId is None and (app := app_of_key(order_id)) is not None:
            implied["AppId"] = app
            if not given.Plan.ReplyTo:
                implied["ReplyTo"] = _usual_reply_queue(app)
        plan = given.Plan.model_copy(
            update={
                "OrderID": order_id,
                "Attempt": attempt,
                "State": ProcessState.PROCESSING,
                **implied,
            }
        )
        fresh = given.Fresh if given.Fresh is not None else _to_do(plan)
        return given.model_copy(update={"Plan": plan, "Fresh": fresh})


def _usual_reply_queue(app_id: str) -> str:
    """The reply queue an application's is usually named (infra/main.bicep's
    registry): an input leaves it out when it is that one."""
    return f"replies-{app_id}"


def _to_do(plan: Plan) -> list[str]:
    return [s.Name for s in plan.Steps if not s.Completed]
