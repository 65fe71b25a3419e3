"""The Agents: one library that makes the workflow's remote calls, used by two
runners (the Functions trigger in agents.functions, the standalone worker in
agents.worker). See docs/agents.md.

The plan (the steps, in order) is domain.steps.STEP_NAMES; agents.steps maps
each step to its remote operations."""

from adapters.clock import Clock, SystemClock
from agents.agent import Agent, AgentPolicy, Breakers, reply_event_id
from agents.ports import RemoteCall, RemoteService
from agents.steps import (
    STEP_NAMES,
    STEPS,
    RemoteOperation,
    RemoteStep,
    UnknownStep,
    compensation_for,
    compensation_order,
    step_named,
)

__all__ = [
    "STEPS",
    "STEP_NAMES",
    "Agent",
    "AgentPolicy",
    "Breakers",
    "Clock",
    "RemoteCall",
    "RemoteOperation",
    "RemoteService",
    "RemoteStep",
    "SystemClock",
    "UnknownStep",
    "compensation_for",
    "compensation_order",
    "reply_event_id",
    "step_named",
]
