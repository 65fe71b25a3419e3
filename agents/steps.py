"""The workflow's remote steps and their compensations, as data.

The plan (which steps, in which order) is domain.steps.STEP_NAMES; this is the
one place an Agent looks up which remote operation a step (or its undo) is. Compensation runs the steps' `undo` in reverse order of
completion; every undo is safe to call when its `do` never happened (the
remote service answers "nothing to undo"), so a compensation log entry can be
replayed after a crash without checking first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from domain.steps import STEP_NAMES

Action = Literal["do", "undo"]


@dataclass(frozen=True)
class RemoteOperation:
    """One call on the remote service: `POST /{service}/{operation}`."""

    service: str
    operation: str

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.operation}"


@dataclass(frozen=True)
class RemoteStep:
    """A workflow step that changes a remote system, and how to undo it.

    Attributes:
        name: the step's name on the wire (AgentRequest.Step, state record keys).
        do: the operation that makes the change.
        undo: the compensating operation.
    """

    name: str
    do: RemoteOperation
    undo: RemoteOperation

    @property
    def service(self) -> str:
        """The dependency this step calls; the Agent keeps one circuit breaker per service."""
        return self.do.service

    def operation(self, action: Action) -> RemoteOperation:
        return self.do if action == "do" else self.undo


RESERVE_INVENTORY = RemoteStep(
    "reserve-inventory",
    do=RemoteOperation("inventory", "reserve"),
    undo=RemoteOperation("inventory", "release"),
)
CHARGE_PAYMENT = RemoteStep(
    "charge-payment",
    do=RemoteOperation("payment", "charge"),
    undo=RemoteOperation("payment", "refund"),
)
ARRANGE_SHIPMENT = RemoteStep(
    "arrange-shipment",
    do=RemoteOperation("shipping", "arrange"),
    undo=RemoteOperation("shipping", "cancel"),
)

STEPS: tuple[RemoteStep, ...] = (RESERVE_INVENTORY, CHARGE_PAYMENT, ARRANGE_SHIPMENT)
"""The workflow, in execution order."""

if tuple(step.name for step in STEPS) != STEP_NAMES:  # pragma: no cover - a programming error
    raise RuntimeError("agents/steps.py must map exactly the plan's steps, in its order")

_BY_NAME = {step.name: step for step in STEPS}


class UnknownStep(KeyError):
    """A request named a step this agent library does not know."""


def step_named(name: str) -> RemoteStep:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownStep(f"unknown step {name!r}; known steps: {', '.join(STEP_NAMES)}") from None


def compensation_for(name: str) -> RemoteOperation:
    """The operation that undoes step `name`."""
    return step_named(name).undo


def compensation_order(completed: list[str] | tuple[str, ...]) -> list[str]:
    """The steps to undo, given those completed, in the order to undo them
    (reverse of the workflow order, whatever order `completed` is in)."""
    done = set(completed)
    unknown = done - set(STEP_NAMES)
    if unknown:
        raise UnknownStep(f"unknown steps {sorted(unknown)}; known steps: {', '.join(STEP_NAMES)}")
    return [name for name in reversed(STEP_NAMES) if name in done]
