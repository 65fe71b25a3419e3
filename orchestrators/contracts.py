"""Inputs and results of the Scheduler's activities: one pydantic model each,
passed through Durable as plain JSON (`model_dump(mode="json")`) and validated
again on the other side, so a history written by an older version fails loudly
rather than silently."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal, cast

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from domain.models import (
    MAX_AGENT_CALLS,
    AgentCall,
    AgentReply,
    OrderState,
    OrderSubmitted,
    PayloadDict,
    ProcessState,
    ProviderText500,
    ReferenceText,
    ReplyOutcome,
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
    Optional: older histories and 1.0 instances have none."""

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
    # 2.0: the application opted in to progress statuses (Processing,
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
        "compensation_deferred",  # 2.2: an unconfirmed undo waits for a long retry
        "timed_out",
        "stale",
        "unconfirmed",
    ]
    Step: str | None = None
    Detail: str | None = None


# --- the reply, as the workflows read it ------------------------------------------------


class ReplyEvent(ActivityContract):
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

    Outcome: ReplyOutcome
    Result: PayloadDict | None = None
    Error: ProviderText500 | None = None
    Calls: Annotated[list[AgentCall], Field(max_length=MAX_AGENT_CALLS)] | None = None

    @model_validator(mode="after")
    def _error_when_not_ok(self) -> ReplyEvent:
        if self.Outcome is not ReplyOutcome.OK and not self.Error:
            raise ValueError("a transient or permanent reply must say why in Error")
        return self

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
    it once) or an inline step's activity result. The full AgentReply
    (recorded histories, a bridge of an older build, the inline step's
    result: it has an `InstanceId`) is validated as before and returned as it
    is; anything else must be a `ReplyEvent`."""
    data = json.loads(value) if isinstance(value, str) else value
    if isinstance(data, dict) and "InstanceId" in data:
        if isinstance(value, str):
            return AgentReply.model_validate_json(value)
        return AgentReply.model_validate(data)
    return ReplyEvent.model_validate(data)


def reply_from_event(value: Any) -> AgentReply:
    """`read_reply` for workflows 1.0 to 2.3, whose files (frozen, ADR 018d)
    type what this returns as AgentReply. Every one of them reads only
    `Outcome`, `Error` and `Result` of it, which a ReplyEvent has too
    (tests/unit/orchestrators/test_reply_event.py checks every version's
    file for it); a ReplyEvent has no identity field to read, so a version
    that reached for one would fail loudly, not read a wrong value."""
    return cast(AgentReply, read_reply(value))


# --- version 2.0 ---------------------------------------------------------------------


class AttemptInput(ActivityContract):
    """The orchestration input the claimer (Starter or Submit's fast path)
    gives a 2.0 attempt: the record as its claim wrote it and that write's
    etag, so the first guarded write needs no read; the step timeout, so the
    orchestration computes the first deadline before its first activity; and
    where the claim put the attempt's recovery-index entry, so the last write
    can retire it; and, from Submit's fast path, the order's step payload. Everything is optional: an instance started without input
    reads what it needs (one more activity)."""

    Record: dict | None = None
    Etag: str | None = None
    StepTimeoutSeconds: int | None = None
    IndexedAt: AwareDatetime | None = None
    # Submit's fast path has the order in hand: its step payload spares the
    # attempt the orders-DB read (the timer Starter leaves it out).
    Payload: dict | None = None
    # The W3C context of the attempt's "start attempt" span: every activity
    # of the attempt continues it (one trace per attempt).
    Trace: dict[str, str] | None = None


class Advance(Traced):
    """One guarded write by the attempt `InstanceId` and the message that must
    follow it, in one idempotent activity (write first, then send with a
    stable message id; a retry re-reads on the stale etag, recognises its own
    write and sends again, which duplicate detection drops):

    - begin (`Begin`): read the order, plan the attempt, and start `Start`;
    - advance: complete `Complete` (with `Reference`) and start `Start`, one write;
    - finish (`Finish`): complete `Complete` and mark the order Processed, one
      write that also fills the status outbox; then send Processed and clear it.

    `Record`/`Etag` are the record as the previous write left it: the write
    replaces on that etag; on a precondition failure it re-reads, re-checks
    LockedBy and decides (stale, already landed, or apply on the fresh one)."""

    InstanceId: str
    Begin: bool = False
    Record: dict | None = None
    Etag: str | None = None
    Complete: str | None = None
    Reference: ReferenceText = None
    Start: str | None = None
    Deadline: AwareDatetime | None = None
    Finish: bool = False
    IndexedAt: AwareDatetime | None = None
    # Carried from the begin's plan (not re-read): the request payload, and
    # whether this application opted in to progress statuses. Given to begin
    # (from the fast path's input), the payload spares the orders-DB read.
    Payload: dict = Field(default_factory=dict)
    Progress: bool = False


_Plan = Plan  # the field below is named Plan too


class Advanced(ActivityContract):
    Stale: bool = False
    Reason: str | None = None
    State: ProcessState | None = None
    Record: dict | None = None
    Etag: str | None = None
    # Finish only: False when the status could not be sent yet (it stays in
    # the record's outbox for the Starter).
    StatusSent: bool = True
    # Begin only: the plan of the attempt, and the step it started (None when
    # there is nothing to start: compensating, or every step already done).
    Plan: _Plan | None = None
    Started: str | None = None


# --- version 2.3: ids and etags, not the record ------------------------------------------
#
# 2.3's begin/advance inputs are a discriminated union on `Kind` (BeginWrite |
# StepWrite | FinishWrite), each declaring only what its write needs: the
# instance, the etag of the record as the previous write left it, and the few
# plan fields the write or its message uses. No record rides in an input or a
# result: the activity works on the version the etag names (its own last write,
# kept in memory, or one read) and returns the new etag. 2.2's one-model
# `Advance` (no `Kind`) is still parsed for the instances in flight
# (`parse_advance`). Dumped without defaults: a history holds what was said.


class _Compact(Traced):
    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_defaults=True)


class BeginWrite(_Compact):
    """Begin: plan the attempt and start its first unfinished step (one
    write on the claim's etag), then that step's request. `Payload`: the
    fast path's step payload (spares the orders-DB read; the plan answered
    then leaves it out, the orchestration has it)."""

    Kind: Literal["begin"]
    InstanceId: str
    Etag: str | None = None
    Deadline: AwareDatetime | None = None
    Payload: dict | None = None


class StepWrite(_Compact):
    """Complete `Complete` (with `Reference`) and start `Start` until
    `Deadline`, one write on `Etag`; then `Start`'s request. Its payload is
    the order's (immutable): the activity takes it from its begin in this
    process, or reads the order."""

    Kind: Literal["step"]
    InstanceId: str
    Etag: str | None = None
    Complete: str
    Reference: ReferenceText = None
    Start: str
    Deadline: AwareDatetime


class FinishWrite(_Compact):
    """Complete `Complete` and mark the order Processed (the status outbox
    filled in the same write), then send Processed and clear the outbox;
    `IndexedAt`: the attempt's recovery-index entry, retired."""

    Kind: Literal["finish"]
    InstanceId: str
    Etag: str | None = None
    Complete: str | None = None
    Reference: ReferenceText = None
    IndexedAt: AwareDatetime | None = None


AdvanceWrite = Annotated[BeginWrite | StepWrite | FinishWrite, Field(discriminator="Kind")]
"""2.3's begin/advance input, told apart by `Kind`."""

_ADVANCE_WRITE: TypeAdapter[AdvanceWrite] = TypeAdapter(AdvanceWrite)


def parse_advance(data: Any) -> Advance | BeginWrite | StepWrite | FinishWrite:
    """begin_attempt's and advance_attempt's input: 2.3's union (it has a
    `Kind`), or 2.2's and older one-model `Advance` (no `Kind`)."""
    if isinstance(data, dict) and "Kind" in data:
        return _ADVANCE_WRITE.validate_python(data)
    return Advance.model_validate(data)


class Wrote(ActivityContract):
    """2.3's begin/advance result: no record, the new etag. `Plan` and
    `Started`: begin only; `StatusSent`: finish only."""

    Stale: bool = False
    Reason: str | None = None
    State: ProcessState | None = None
    Etag: str | None = None
    StatusSent: bool = True
    Plan: _Plan | None = None
    Started: str | None = None

    def dump(self) -> dict:
        return self.model_dump(mode="json", exclude_defaults=True)


class SendStep(_Compact):
    """2.4: send the request of `Step` until `Deadline` (the attempt's one
    deadline), with no write: the claim marked the step Running. `Payload`:
    the order's step payload when the orchestration has it (the fast path's),
    else the activity keeps or reads it; `AppId`: the order's application."""

    InstanceId: str
    Step: str
    Deadline: AwareDatetime
    Payload: dict | None = None
    AppId: str | None = None


class FinishAll(_Compact):
    """2.4's one write: complete every step this attempt did (`Done`, step ->
    its reference, in the order done) and mark the order Processed with the
    status outbox filled, on the claim's etag; then send Processed, clear the
    outbox and retire the recovery-index entry at `IndexedAt`. Or, with
    `Failed`, complete `Done` and begin the compensation."""

    InstanceId: str
    Etag: str | None = None
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
    payload: dict | None,
    steps: list[str] | tuple[str, ...],
    modes: Mapping[str, str],
    step_timeout_seconds: int,
    progress: bool,
) -> Plan:
    """The Plan of `attempt` on `record`: what the begin activity answers and
    what a 2.4 claimer puts in the attempt's input (one function for both)."""
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
        Payload=payload or {},
        Undo=undo if record.ProcessState is ProcessState.COMPENSATING else [],
        Progress=progress,
        AppId=record.AppId,
    )


class AttemptStart(ActivityContract):
    """2.3's orchestration input: what the claimer knows and the attempt
    needs before its first activity, without the record (its etag names it).
    2.4 adds `Deadline` and `Plan` when the claim marked the attempt's steps
    (domain.state_machine.claim_marking): the attempt then runs from its
    input, with no begin."""

    Etag: str | None = None
    StepTimeoutSeconds: int | None = None
    IndexedAt: AwareDatetime | None = None
    Payload: dict | None = None
    Deadline: AwareDatetime | None = None
    Plan: _Plan | None = None
    # 2.4: the steps its claim marked that were NotStarted before it (no
    # attempt had sent them): what a failure may make NotStarted again.
    Fresh: list[str] | None = None
    Trace: dict[str, str] | None = None

    def dump(self) -> dict:
        """2.3's shape, plus 2.4's fields only when set: an older version's
        input model (2.0's AttemptInput) refuses fields it does not know."""
        data = self.model_dump(mode="json")
        for name in ("Deadline", "Plan", "Fresh"):
            if data.get(name) is None:
                data.pop(name, None)
        if self.Plan is not None:  # its defaults restored when it is read
            data["Plan"] = self.Plan.model_dump(mode="json", exclude_defaults=True)
        return data
