"""The Agents: one library that makes the workflow's remote calls, used by two
runners (the Functions trigger in triggers.agents, the standalone worker in
agents.worker). See docs/agents.md.

The plan (the steps, in order, and each step's remote operations) is the step
catalog, domain/steps.json (domain.steps); agents.steps re-exports it."""

from adapters.clock import Clock, SystemClock
from agents.agent import Agent, AgentPolicy, Breakers, reply_event_id
from agents.ports import RemoteCall, RemoteService
from agents.steps import (
    DEFAULT_CATALOG,
    RemoteOperation,
    RemoteStep,
    StepCatalog,
    UnknownStep,
    compensation_for,
    compensation_order,
    step_named,
)

__all__ = [
    "DEFAULT_CATALOG",
    "Agent",
    "AgentPolicy",
    "Breakers",
    "Clock",
    "RemoteCall",
    "RemoteOperation",
    "RemoteService",
    "RemoteStep",
    "StepCatalog",
    "SystemClock",
    "UnknownStep",
    "compensation_for",
    "compensation_order",
    "reply_event_id",
    "step_named",
]
