"""What a circuit breaker counts and how a request meets an open one
(issue 43, items 1 and 6): a breaker is for a failing dependency. A 429 and
a call cut short by the request's own deadline say the dependency is up and
we ask too much or too late: they do not open it. A request that meets an
open breaker waits for its reset inside its deadline and is then tried,
instead of being answered "not called" at once."""

from __future__ import annotations

import contextlib
import random

import pytest

from agents.agent import Agent, AgentPolicy, Breakers
from domain.errors import TransientError
from domain.models import ReplyOutcome
from tests.unit.agents.conftest import POLICY, request
from tests.unit.agents.fakes import Outcome


def _agent(remote, clock, **changes) -> Agent:
    policy = AgentPolicy(**{**POLICY.__dict__, **changes})
    breakers = Breakers(policy.breaker_fail_max, policy.breaker_reset_timeout, now=clock.now)
    return Agent(remote, clock, policy, breakers=breakers, rng=random.Random(7))


def _trip(agent: Agent) -> None:
    breaker = agent.breakers.for_service("payment")
    breaker.open()
    assert agent.breakers.for_service("payment").current_state == "open"


async def test_a_request_that_meets_an_open_breaker_waits_for_its_reset_and_is_tried(remote, clock):
    agent = _agent(remote, clock, breaker_fail_max=2, breaker_reset_timeout=20.0)
    _trip(agent)
    started = clock.now()

    reply = await agent.handle(request(action="undo", deadline_in=60))

    assert reply.Outcome is ReplyOutcome.OK
    assert len(remote.calls) == 1
    assert (remote.calls[0].at - started).total_seconds() >= 20.0
    assert agent.breakers.for_service("payment").current_state == "closed"


async def test_a_reset_after_the_deadline_still_answers_not_called_without_waiting_past_it(
    remote, clock
):
    agent = _agent(remote, clock, breaker_fail_max=2, breaker_reset_timeout=300.0)
    _trip(agent)
    started = clock.now()

    reply = await agent.handle(request(deadline_in=60))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert "circuit open for payment" in reply.Error
    assert remote.calls == []
    assert (clock.now() - started).total_seconds() < 60


def _paced(retry_after: float = 1.0) -> Outcome:
    return Outcome(
        error=TransientError("HTTP 429: slow down", retry_after=retry_after, pacing=True)
    )


async def test_429s_do_not_open_the_breaker_nor_spend_the_tries(remote, clock):
    # A busy service's 429s are its pace: a request goes on until its deadline
    # (max_attempts counts failures), each wait what Retry-After said.
    agent = _agent(remote, clock, breaker_fail_max=2, max_attempts=3)
    remote.default = _paced()

    reply = await agent.handle(request(deadline_in=30))

    assert agent.breakers.for_service("payment").current_state == "closed"
    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert len(remote.calls) > 20  # called on through its deadline, not 3 times
    assert all(1.0 <= s <= 1.25 for s in clock.sleeps)


async def test_a_request_paced_by_429s_is_served_when_the_rate_frees_up(remote, clock):
    # Eight 429s used to end a request (max_attempts) with most of its time
    # left, and the back-off grew to 8 s while the service's rate was free again.
    agent = _agent(remote, clock, max_attempts=3)
    remote.script = [_paced(2.0)] * 8

    reply = await agent.handle(request(deadline_in=60))

    assert reply.Outcome is ReplyOutcome.OK
    assert len(remote.calls) == 9
    assert len(clock.sleeps) == 8
    assert all(2.0 <= s <= 2.5 for s in clock.sleeps)


async def test_failures_still_end_a_request_after_max_attempts_between_429s(remote, clock):
    agent = _agent(remote, clock, max_attempts=2)
    remote.script = [_paced(), Outcome(error=TransientError("HTTP 503")), _paced()]
    remote.default = Outcome(error=TransientError("HTTP 503"))

    reply = await agent.handle(request(deadline_in=600))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert len(remote.calls) == 4  # two failures, and the 429s around them


async def test_a_call_cut_short_by_the_deadline_is_not_a_failure_but_a_full_timeout_is(
    remote, clock
):
    agent = _agent(remote, clock, breaker_fail_max=2, max_attempts=1, call_timeout=5.0)
    remote.default = Outcome(error=TransientError("no answer", no_answer_within=2.0))
    for n in range(3):
        await agent.handle(request(order_id=f"short-{n}"))
    assert agent.breakers.for_service("payment").current_state == "closed"

    remote.default = Outcome(error=TransientError("no answer", no_answer_within=5.0))
    for n in range(2):
        await agent.handle(request(order_id=f"full-{n}"))
    assert agent.breakers.for_service("payment").current_state == "open"


def test_a_call_ended_by_its_process_or_task_ending_is_not_a_failure():
    # A shutdown's cancellation or a process exiting inside a call says
    # nothing about the dependency: counted, a host's restarts would open the
    # breaker for the next host's requests.
    breakers = Breakers(fail_max=2, reset_timeout=30.0)
    breaker = breakers.for_service("payment")

    def ends(exc: BaseException):
        def call():
            raise exc

        return call

    for exc in (SystemExit(1), KeyboardInterrupt(), GeneratorExit(), SystemExit(0)):
        with pytest.raises(type(exc)):
            breaker.call(ends(exc))
    assert breaker.current_state == "closed"

    for _ in range(2):
        with contextlib.suppress(TransientError):
            breaker.call(ends(TransientError("HTTP 503")))
    assert breaker.current_state == "open"
