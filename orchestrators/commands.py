"""The state commands: the workflow's guarded writes to the order's record
outside its finishing write (a transient failure noted, each undo's outcome,
the compensation's end), one pydantic model per kind of write, joined as the
discriminated union `StateWrite` (the `Kind` tag picks the model). The
workflow builds them; the `write_state` activity runs the state machine's
transition for each."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from orchestrators.contracts import Traced


class StateCommand(Traced):
    """One guarded write to the record by the attempt `InstanceId`."""

    InstanceId: str


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
    """Every try of the step's undo ended transient, unanswered or lost; the
    entry stays to undo (ADR 019a). `Reason`: the last error."""

    Kind: Literal["undo_unconfirmed"] = "undo_unconfirmed"
    Step: str
    Reason: str | None = None


class FinishCompensation(StateCommand):
    Kind: Literal["finish_compensation"] = "finish_compensation"


class DeferCompensation(StateCommand):
    """An undo is unconfirmed and none was refused: the compensation waits
    for a long retry (or ends CompensationFailed once they are spent, ADR 019a)."""

    Kind: Literal["defer_compensation"] = "defer_compensation"


StateWrite = Annotated[
    RecordTransient
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
