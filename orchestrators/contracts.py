"""Inputs and results of the Scheduler's activities: one pydantic model each,
passed through Durable as plain JSON (`model_dump(mode="json")`) and validated
again on the other side, so a history written by an older version fails loudly
rather than silently."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, cast

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from domain.ids import parse_attempt_instance_id
from domain.models import (
    AgentReply,
    OrderState,
    OrderSubmitted,
    ProcessState,
    ReferenceText,
    ReplyAnswer,
    StatusKind,
    StepStatus,
)


class ActivityContract(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def dump(self) -> dict:
        return self.model_dump(mode="json")


class Traced(ActivityContract):
    """An activity input that may carry the attempt's W3C trace context
    (`traceparent`, `tracestate`), copied by the orchestration from its input
    so the activity's span joins the attempt's trace (adapters.telemetry).
    Optional: an activity called without one starts its own trace."""

    Trace: dict[str, str] | None = None


def step_payload(order: OrderSubmitted) -> dict:
    """What every agent request of an order carries (the order's data the
    remote services need), built in one place for the Scheduler and the fast path."""
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
    # Compensating only: the steps to undo, in the order to undo them (every
    # step whose request was sent and is not undone yet; the record's log).
    Undo: list[str] = Field(default_factory=list)
    # The application opted in to progress statuses (Processing,
    # StepCompleted) in the reply-queue registry; otherwise only terminal ones.
    Progress: bool = False
    # The order's application, named in its agent requests (and so in their
    # replies and tokens, ADR 017e). None in a plan an older build recorded.
    AppId: str | None = None


class WriteResult(ActivityContract):
    Stale: bool = False
    Reason: str | None = None
    State: ProcessState | None = None


class SendRequest(Traced):
    """A request for a step (or its undo) within one attempt. `Try` numbers
    the undo retries inside one attempt: each try gets its own message id and
    reply event, so duplicate detection drops only true re-sends."""

    InstanceId: str
    Step: str
    Action: Literal["do", "undo"] = "do"
    Try: int = 0
    Deadline: AwareDatetime
    Payload: dict = Field(default_factory=dict)
    ListenUntil: AwareDatetime | None = None  # AgentRequest.ListenUntil
    # The order's application (Plan.AppId), for AgentRequest.AppId; None from
    # a plan an older build recorded (the request then names none).
    AppId: str | None = None

    @property
    def label(self) -> str:
        return "do" if self.Action == "do" else f"undo-{self.Try}"

    def dump(self) -> dict:
        """Without the fields at their default: the history holds what was said."""
        return self.model_dump(mode="json", exclude_defaults=True)


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
    instance (`event_payload`): what an orchestration or an operator reads
    of it, and none of its identity. The bridge raises a reply only after its
    token and signature proved that it answers exactly the request of that
    instance, step, action, attempt and application that the event's name
    stands for (ADR 017e), so the instance it is raised on and the event's
    name already say everything the identity fields said
    (docs/adr/021h-slim-reply-event.md).

    - `Outcome`, `Error`: what every workflow decides on (and the record, the
      Supervisor and the alerts quote);
    - `Result`: of the agent's result, what is read: `Reference` (every
      workflow records it on the step; the console shows it) and, on an
      undo's reply, `Status` (the console tells by it an undo that had
      nothing to undo). The remote's echo of the request (OrderID, Step,
      Operation, FencingToken) and a do's Status are read by no one;
    - `Calls`: the agent's call record (ADR 017d), which the console shows
      on the reply."""

    @classmethod
    def of(cls, reply: AgentReply) -> ReplyEvent:
        keys = ("Reference", "Status") if reply.Action == "undo" else ("Reference",)
        kept = {k: v for k, v in (reply.Result or {}).items() if k in keys}
        return cls(Outcome=reply.Outcome, Result=kept or None, Error=reply.Error, Calls=reply.Calls)

    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_none=True)


def event_payload(reply: AgentReply) -> dict:
    """What the reply bridge raises on the instance: the reply's `ReplyEvent`
    (its outcome, error, the result's reference, its call record), without
    its identity (the event's name and the instance say it), its seal (the
    bridge checked it before raising) or its schema version."""
    return ReplyEvent.of(reply).dump()


def read_reply(value: Any) -> AgentReply | ReplyEvent:
    """An awaited reply as a workflow gets it: the event's data (a dict, or
    its JSON text: the Durable SDK's client encodes the data before posting
    it as JSON, so Azure's history keeps it encoded twice and the SDK decodes
    it once) or an inline step's activity result (a `ReplyEvent` too). A
    full AgentReply (a bridge of an older build: it has an `InstanceId`) is
    validated as before and returned as it is; anything else must be a
    `ReplyEvent`."""
    data = json.loads(value) if isinstance(value, str) else value
    if isinstance(data, dict) and "InstanceId" in data:
        if isinstance(value, str):
            return AgentReply.model_validate_json(value)
        return AgentReply.model_validate(data)
    return ReplyEvent.model_validate(data)


def reply_from_event(value: Any) -> AgentReply:
    """`read_reply` typed as the AgentReply the workflow handles. It reads
    only `Outcome`, `Error` and `Result` of it, which a ReplyEvent has too
    (tests/unit/orchestrators/test_reply_event.py checks the workflow for
    it); a ReplyEvent has no identity field to read, so code that reached
    for one would fail loudly, not read a wrong value."""
    return cast(AgentReply, read_reply(value))


# --- the attempt's activities --------------------------------------------------------


_Plan = Plan  # fields below are named Plan too


class _Compact(Traced):
    """Dumped without defaults: a history holds what was said."""

    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_defaults=True)


class Wrote(ActivityContract):
    """finish_attempt's result: the state it left the record in, or why the
    attempt is stale; `Plan`: the compensation it began (the undo log as that
    write left the record)."""

    Stale: bool = False
    Reason: str | None = None
    State: ProcessState | None = None
    Plan: _Plan | None = None

    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_defaults=True)


class SendStep(_Compact):
    """Send the request of `Step` until `Deadline` (the attempt's one
    deadline), with no write: the claim marked the step Running. `Payload`:
    the order's step payload, from the attempt's input (None only when the
    claimer could not read it: the activity reads it then); `AppId`: the
    order's application."""

    InstanceId: str
    Step: str
    Deadline: AwareDatetime
    Payload: dict | None = None
    AppId: str | None = None


class FinishAll(_Compact):
    """The attempt's one write: complete every step this attempt did (`Done`, step ->
    its reference, in the order done) and mark the order Processed, its status
    sent just before the write or left in the outbox (ADR 021j), on the record
    as the activity reads it; then retire the recovery-index entry at
    `IndexedAt`. Or, with `Failed`, complete `Done` and begin the compensation."""

    InstanceId: str
    Done: dict[str, ReferenceText] = Field(default_factory=dict)
    IndexedAt: AwareDatetime | None = None
    # A step failed for good: the same write completes `Done`, makes the
    # steps in `Unsent` NotStarted again (marked by this claim, never sent by
    # any attempt) and begins the compensation (Compensating, the undo log
    # from the record), or with `Compensate` false (nothing was done) fails
    # the order (Error), with `Reason`; no status, no index change.
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
    """The Plan of `attempt` on `record`: what the claimer puts in the
    attempt's input, and what load_plan answers a compensation. Without the
    payload: the attempt's input carries it (AttemptStart.Payload)."""
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


# What the input leaves out of its plan, because the instance says it: the
# order and the attempt are in the instance id, a claimed record is
# Processing, and the step timeout serves a compensation only, whose plan
# comes from finish_attempt or load_plan.
_IMPLIED_BY_THE_INSTANCE = {"OrderID", "Attempt", "State", "StepTimeoutSeconds"}


class AttemptStart(ActivityContract):
    """The orchestration input: what the claimer knows and the attempt needs
    to run without reading the record or the order: the plan and the one
    deadline the claim marked the steps with
    (domain.state_machine.claim_marking), and the order's step payload. A
    compensation's start has only the payload. Kept small, since the history holds it
    encoded twice: `dump` leaves out what the instance id implies and
    `Fresh` when it is every step to do; `of_instance` puts them back."""

    Payload: dict | None = None
    Deadline: AwareDatetime | None = None
    Plan: _Plan | None = None
    # The steps its claim marked that were NotStarted before it (no attempt
    # had sent them): what a failure may make NotStarted again.
    Fresh: list[str] | None = None
    Trace: dict[str, str] | None = None

    def dump(self) -> dict:
        data = self.model_dump(mode="json", exclude_none=True)
        if self.Plan is not None:
            data["Plan"] = self.Plan.model_dump(
                mode="json", exclude_defaults=True, exclude=_IMPLIED_BY_THE_INSTANCE
            )
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
        plan = given.Plan.model_copy(
            update={"OrderID": order_id, "Attempt": attempt, "State": ProcessState.PROCESSING}
        )
        fresh = given.Fresh if given.Fresh is not None else _to_do(plan)
        return given.model_copy(update={"Plan": plan, "Fresh": fresh})


def _to_do(plan: Plan) -> list[str]:
    return [s.Name for s in plan.Steps if not s.Completed]
