"""The step catalog: the order workflow's remote steps, in execution order, as
data (domain/steps.json), validated here when it is loaded. Each step names
its service, the operations that do and undo it, the order fields its request
carries and, optionally, what its provider says when it refuses an order.
Submit, the Scheduler, the Agents, the local remote service, the simulation,
the bench and the tests all read it; adding a step is one entry plus its
service's endpoint setting (docs/adr/019d-one-step-catalog.md). A process
reads the shipped file or the one STEP_CATALOG_FILE names."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from domain.models import StepName

Action = Literal["do", "undo"]

# A service or an operation: one path segment of POST /{service}/{operation},
# and (upper-cased) the suffix of the service's URL setting.
Word = Annotated[str, StringConstraints(pattern=r"^[a-z]{1,32}$")]

# The order's data a step's request can carry; a step names the ones it needs.
PAYLOAD_FIELDS: tuple[str, ...] = ("CustomerId", "Lines", "Total", "Currency", "PaymentReference")

DEFAULT_CATALOG_FILE = Path(__file__).with_name("steps.json")


class CatalogError(ValueError):
    """A step catalog that cannot be used, saying which entry and why."""


class RemoteOperation(BaseModel):
    """One call on a remote service: `POST /{service}/{operation}`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    service: Word
    operation: Word

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.operation}"


class RemoteStep(BaseModel):
    """A workflow step that changes a remote system, and how to undo it.

    Attributes:
        name: the step's name on the wire (AgentRequest.Step, state record keys).
        service: the remote service that runs it (its URL setting
            REMOTE_SERVICE_URL__<SERVICE>; one circuit breaker each).
        do, undo: the operations that make and undo the change; undo is safe
            to call when `do` never happened.
        payload: the order fields (PAYLOAD_FIELDS) its requests carry.
        refusal: what its provider says when it refuses an order ("card declined").
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: StepName
    service: Word
    do_operation: Word = Field(alias="do")
    undo_operation: Word = Field(alias="undo")
    payload: tuple[str, ...] = PAYLOAD_FIELDS
    refusal: Annotated[str, StringConstraints(min_length=1, max_length=100)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> RemoteStep:
        if self.do_operation == self.undo_operation:
            raise ValueError(f"do and undo are both {self.do_operation!r}")
        unknown = [f for f in self.payload if f not in PAYLOAD_FIELDS]
        if unknown:
            raise ValueError(
                f"payload names {unknown}, not order fields; known: {', '.join(PAYLOAD_FIELDS)}"
            )
        if len(set(self.payload)) != len(self.payload):
            raise ValueError("payload names a field twice")
        return self

    @cached_property
    def do(self) -> RemoteOperation:
        return RemoteOperation(service=self.service, operation=self.do_operation)

    @cached_property
    def undo(self) -> RemoteOperation:
        return RemoteOperation(service=self.service, operation=self.undo_operation)

    def operation(self, action: Action) -> RemoteOperation:
        return self.do if action == "do" else self.undo


class UnknownStep(KeyError):
    """A request named a step the catalog does not know."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class StepCatalog(BaseModel):
    """The workflow's steps, in execution order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    about: str | None = None  # what the file says about itself; not used
    steps: tuple[RemoteStep, ...]

    @model_validator(mode="after")
    def _unique(self) -> StepCatalog:
        if not self.steps:
            raise ValueError("a catalog needs at least one step")
        names = [s.name for s in self.steps]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"steps named twice: {twice}")
        ops: dict[str, str] = {}
        for step in self.steps:
            for op in (step.do.path, step.undo.path):
                if op in ops:
                    raise ValueError(f"{op} belongs to both {ops[op]!r} and {step.name!r}")
                ops[op] = step.name
        return self

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    @cached_property
    def services(self) -> tuple[str, ...]:
        """Every service the steps call, in the order the steps first call it."""
        return tuple(dict.fromkeys(s.service for s in self.steps))

    @cached_property
    def _by_name(self) -> dict[str, RemoteStep]:
        return {step.name: step for step in self.steps}

    def step_named(self, name: str) -> RemoteStep:
        step = self._by_name.get(name)
        if step is not None:
            return step
        raise UnknownStep(f"unknown step {name!r}; known steps: {', '.join(self.names)}")

    def part(self, name: str, payload: dict[str, Any]) -> dict[str, Any]:
        """What of the order's `payload` step `name`'s requests carry: the
        fields its entry names (a step this catalog does not know, all)."""
        step = self._by_name.get(name)
        if step is None:
            return payload
        return {k: v for k, v in payload.items() if k in step.payload}


def parse_catalog(data: Any, source: str = "step catalog") -> StepCatalog:
    """Validate `data` (a file's JSON) as a catalog; CatalogError names the entry."""
    try:
        return StepCatalog.model_validate(data)
    except ValidationError as exc:
        raise CatalogError(f"{source}: {_reasons(data, exc)}") from None


def load_catalog(path: Path | str = DEFAULT_CATALOG_FILE) -> StepCatalog:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"step catalog {path}: cannot read it: {exc}") from None
    except ValueError as exc:
        raise CatalogError(f"step catalog {path}: not JSON: {exc}") from None
    return parse_catalog(data, f"step catalog {path}")


def _reasons(data: Any, exc: ValidationError) -> str:
    """Each error with the entry it is in: `steps[1] (charge-payment).do: ...`."""
    out = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = ".".join(str(p) for p in loc) or "(catalog)"
        if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int):
            entry = data["steps"][loc[1]]
            name = entry.get("name") if isinstance(entry, dict) else None
            rest = ".".join(str(p) for p in loc[2:])
            where = (
                f"steps[{loc[1]}]" + (f" ({name})" if name else "") + (f".{rest}" if rest else "")
            )
        out.append(f"{where}: {err['msg']}")
    return "; ".join(out)


DEFAULT_CATALOG: StepCatalog = load_catalog()
"""The shipped catalog (domain/steps.json)."""
