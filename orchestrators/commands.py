"""The state commands: the workflow's guarded writes to the order's record
outside its finishing write, one model per kind, joined as the union
`StateWrite` on `Kind`; `write_state` runs the transition of each."""

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
    """The compensation waits for a long retry, or ends (ADR 019a)."""

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
