from __future__ import annotations

import random
from datetime import timedelta

import pytest

from agents.agent import Agent, AgentPolicy
from domain.ids import (
    agent_request_message_id,
    attempt_instance_id,
)
from domain.models import AgentRequest
from tests.builders import agent_request
from tests.unit.agents.fakes import T0, FakeClock, FakeRemote


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def remote(clock: FakeClock) -> FakeRemote:
    return FakeRemote(clock)


POLICY = AgentPolicy(
    call_timeout=5.0,
    initial_backoff=1.0,
    max_backoff=8.0,
    max_attempts=50,
    reply_margin=2.0,
    breaker_fail_max=100,
    breaker_reset_timeout=60.0,
    min_call_time=0.5,
)


@pytest.fixture
def make_agent(remote: FakeRemote, clock: FakeClock):
    def make(**changes) -> Agent:
        fields = {**POLICY.__dict__, **changes}
        return Agent(remote, clock, AgentPolicy(**fields), rng=random.Random(42))

    return make


@pytest.fixture
def agent(make_agent) -> Agent:
    return make_agent()


def request(
    step: str = "charge-payment",
    *,
    order_id: str = "o-1",
    attempt: int = 2,
    action: str = "do",
    deadline_in: float = 60.0,
) -> AgentRequest:
    instance = attempt_instance_id(order_id, attempt)
    assert agent_request_message_id(instance, step, action)  # the names must be valid
    return agent_request(
        order_id,
        step,
        attempt,
        action,
        T0 + timedelta(seconds=deadline_in),
        {"Total": "12.50", "Currency": "EUR"},
    )
