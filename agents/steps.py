"""The workflow's remote steps and their compensations, as the Agents see them:
the step catalog (domain/steps.json, validated by domain.steps), re-exported
for the agent library. An Agent is given its catalog (Agent(steps=...)); these
module-level helpers read the shipped one.

Compensation runs the steps' `undo` in reverse order of completion; every undo
is safe to call when its `do` never happened (the remote service answers
"nothing to undo"), so a compensation log entry can be replayed after a crash
without checking first."""

from __future__ import annotations

from domain.steps import (
    DEFAULT_CATALOG,
    Action,
    RemoteOperation,
    RemoteStep,
    StepCatalog,
    UnknownStep,
)

__all__ = [
    "DEFAULT_CATALOG",
    "Action",
    "RemoteOperation",
    "RemoteStep",
    "StepCatalog",
    "UnknownStep",
    "compensation_for",
    "compensation_order",
    "step_named",
]


def step_named(name: str, steps: StepCatalog = DEFAULT_CATALOG) -> RemoteStep:
    return steps.step_named(name)


def compensation_for(name: str, steps: StepCatalog = DEFAULT_CATALOG) -> RemoteOperation:
    """The operation that undoes step `name`."""
    return steps.step_named(name).undo


def compensation_order(
    completed: list[str] | tuple[str, ...], steps: StepCatalog = DEFAULT_CATALOG
) -> list[str]:
    """The steps to undo, given those completed, in the order to undo them
    (reverse of the workflow order, whatever order `completed` is in)."""
    return steps.compensation_order(completed)
