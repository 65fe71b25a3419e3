"""Inputs and results of the Scheduler's activities: one pydantic model each,
passed through Durable as plain JSON (`model_dump(mode="json")`) and validated
again on the other side, so a history written by an older version fails loudly
rather than silently."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from domain.models import AgentReply, OrderSubmitted, ProcessState, StatusKind


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


class StateCommand(Traced):
    """One guarded write to the record by the attempt `InstanceId`: one model
    per kind (the `Kind` tag picks it, see `StateWrite`), each declaring only
    what its transition needs.

    On the wire every kind keeps the shape of the one all-optional model it
    replaces (InstanceId, Kind, Step, Deadline, Reference, Reason, in that
    order, a field the kind does not use as null), so histories written
    before (1.0 and 2.x instances in flight) validate and replay unchanged:
    `dump` writes that shape, and validation drops the nulls of the fields a
    kind does not use. A non-null value there is refused (extra="forbid")."""

    InstanceId: str

    @model_validator(mode="before")
    @classmethod
    def _drop_unused_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {
            k: v
            for k, v in data.items()
            if not (v is None and k in _WIRE_OPTIONAL and k not in cls.model_fields)
        }

    def dump(self) -> dict:
        data = self.model_dump(mode="json")
        return {k: data.get(k) for k in _WIRE_SHAPE}


# The wire shape of every state command (see StateCommand).
_WIRE_SHAPE = ("Trace", "InstanceId", "Kind", "Step", "Deadline", "Reference", "Reason")
_WIRE_OPTIONAL = frozenset(_WIRE_SHAPE[3:])


class StartStep(StateCommand):
    Kind: Literal["start_step"] = "start_step"
    Step: str
    Deadline: AwareDatetime


class CompleteStep(StateCommand):
    """`Deadline`: the record's next CompleteBy; 1.0 instances send none
    (the activity then gives one step timeout from now)."""

    Kind: Literal["complete_step"] = "complete_step"
    Step: str
    Reference: str | None = None
    Deadline: AwareDatetime | None = None


class MarkProcessed(StateCommand):
    Kind: Literal["processed"] = "processed"


class MarkFailed(StateCommand):
    Kind: Literal["failed"] = "failed"
    Step: str | None = None
    Reason: str


class BeginCompensation(StateCommand):
    """`Step`: the failed step, undone first; 1.0 instances send none."""

    Kind: Literal["begin_compensation"] = "begin_compensation"
    Step: str | None = None
    Reason: str


class RecordTransient(StateCommand):
    """`Reason`: the agent's, which a transient reply may leave out."""

    Kind: Literal["transient"] = "transient"
    Step: str
    Reason: str | None = None


class UndoDone(StateCommand):
    Kind: Literal["undo_done"] = "undo_done"
    Step: str


class UndoFailed(StateCommand):
    Kind: Literal["undo_failed"] = "undo_failed"
    Step: str
    Reason: str


class FinishCompensation(StateCommand):
    Kind: Literal["finish_compensation"] = "finish_compensation"


StateWrite = Annotated[
    StartStep
    | CompleteStep
    | MarkProcessed
    | MarkFailed
    | BeginCompensation
    | RecordTransient
    | UndoDone
    | UndoFailed
    | FinishCompensation,
    Field(discriminator="Kind"),
]
"""Any state command, told apart by its `Kind`."""

_STATE_WRITE: TypeAdapter[StateWrite] = TypeAdapter(StateWrite)


def parse_state_write(data: Any) -> StateWrite:
    """The `write_state` activity's input (a dict, as Durable hands it over)."""
    return _STATE_WRITE.validate_python(data)


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
        "timed_out",
        "stale",
        "unconfirmed",
    ]
    Step: str | None = None
    Detail: str | None = None


def reply_from_event(value) -> AgentReply:
    """External event payloads arrive as a dict or as its JSON string."""
    if isinstance(value, str):
        return AgentReply.model_validate_json(value)
    return AgentReply.model_validate(value)


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
    Reference: str | None = None
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
