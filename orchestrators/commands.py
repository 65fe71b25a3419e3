"""The state commands: one guarded write to the order's record by one
attempt, one pydantic model per kind of write (the workflow builds them, the
`write_state` activity runs the state machine's transition for each), joined
as the discriminated union `StateWrite` (the `Kind` tag picks the model)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field, TypeAdapter, model_validator

from domain.models import ReferenceText
from orchestrators.contracts import Traced


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
    Reference: ReferenceText = None
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


class UndoUnconfirmed(StateCommand):
    """Workflow 2.2: every try of the step's undo ended transient, unanswered
    or lost; the entry stays to undo (ADR 019a). `Reason`: the last error."""

    Kind: Literal["undo_unconfirmed"] = "undo_unconfirmed"
    Step: str
    Reason: str | None = None


class FinishCompensation(StateCommand):
    Kind: Literal["finish_compensation"] = "finish_compensation"


class DeferCompensation(StateCommand):
    """Workflow 2.2: an undo is unconfirmed and none was refused: the
    compensation waits for a long retry (or ends CompensationFailed once they
    are spent, ADR 019a)."""

    Kind: Literal["defer_compensation"] = "defer_compensation"


StateWrite = Annotated[
    StartStep
    | CompleteStep
    | MarkProcessed
    | MarkFailed
    | BeginCompensation
    | RecordTransient
    | UndoDone
    | UndoFailed
    | UndoUnconfirmed
    | FinishCompensation
    | DeferCompensation,
    Field(discriminator="Kind"),
]
"""Any state command, told apart by its `Kind`."""

_STATE_WRITE: TypeAdapter[StateWrite] = TypeAdapter(StateWrite)


def parse_state_write(data: Any) -> StateWrite:
    """The `write_state` activity's input (a dict, as Durable hands it over)."""
    return _STATE_WRITE.validate_python(data)
