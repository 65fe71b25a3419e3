"""The Agent and its HTTP client against the real remote service process:
retries, the breaker, deadlines and fencing, checked on the service's side
(side effects applied, calls received)."""

from __future__ import annotations

import random
import socket
from datetime import UTC, datetime, timedelta

import pytest

from adapters.clock import SystemClock
from agents.agent import Agent, AgentPolicy
from agents.ports import RemoteCall
from agents.remote_client import FencingRejected, HttpRemoteService
from domain.errors import PermanentError, TransientError
from domain.ids import idempotency_key
from domain.models import AgentRequest, ReplyOutcome
from tests.builders import agent_request

pytestmark = pytest.mark.integration

# Short real waits: the tests check counts and outcomes, never durations.
FAST = AgentPolicy(
    call_timeout=2.0,
    initial_backoff=0.02,
    max_backoff=0.1,
    max_attempts=20,
    reply_margin=0.2,
    breaker_fail_max=50,
    breaker_reset_timeout=60,
    min_call_time=0.05,
)


def make_request(
    order_id: str,
    step: str = "charge-payment",
    attempt: int = 1,
    action: str = "do",
    deadline_in: float = 10.0,
) -> AgentRequest:
    return agent_request(
        order_id,
        step,
        attempt,
        action,
        datetime.now(UTC) + timedelta(seconds=deadline_in),
        {"Total": "10.00"},
    )


@pytest.fixture
def remote(http, remote_admin) -> HttpRemoteService:
    return HttpRemoteService(http, remote_admin.url)


@pytest.fixture
def make_agent(remote):
    def make(**changes) -> Agent:
        return Agent(
            remote, SystemClock(), AgentPolicy(**{**FAST.__dict__, **changes}), rng=random.Random(3)
        )

    return make


def a_call(order_id: str = "c1", token: int = 1) -> RemoteCall:
    return RemoteCall("payment", "charge", idempotency_key(order_id, "charge-payment"), token, {})


# --- the HTTP client's translation, against real answers -----------------------------


async def test_client_returns_the_result_of_a_successful_call(remote):
    result = await remote.call(a_call(), timeout=5)

    assert result["Status"] == "charged"
    assert result["Reference"]


async def test_client_turns_5xx_into_transient_with_retry_after(remote, remote_admin):
    await remote_admin.fault(kind="transient", service="payment", count=1, retry_after=2)

    with pytest.raises(TransientError) as raised:
        await remote.call(a_call(), timeout=5)

    assert raised.value.retry_after == 2


async def test_client_turns_4xx_into_permanent(remote, remote_admin):
    await remote_admin.fault(kind="permanent", service="payment", status=402, message="declined")

    with pytest.raises(PermanentError, match="declined"):
        await remote.call(a_call(), timeout=5)


async def test_client_turns_a_fencing_409_into_fencing_rejected(remote):
    await remote.call(a_call(token=4), timeout=5)

    with pytest.raises(FencingRejected) as raised:
        await remote.call(a_call(token=3), timeout=5)

    assert "fencing token 3 rejected: fencing token 3 is lower than 4" in str(raised.value)


async def test_client_turns_a_timeout_into_transient(remote, remote_admin):
    await remote_admin.fault(kind="latency", service="payment", seconds=1.0, count=1)

    with pytest.raises(TransientError, match="no answer"):
        await remote.call(a_call(), timeout=0.1)


async def test_client_turns_a_dropped_connection_into_transient(remote, remote_admin):
    await remote_admin.fault(kind="crash", service="payment", mode="drop", count=1)

    with pytest.raises(TransientError):
        await remote.call(a_call(), timeout=5)


async def test_client_turns_connection_refused_into_transient(http):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = HttpRemoteService(http, f"http://127.0.0.1:{port}")

    with pytest.raises(TransientError):
        await client.call(a_call(), timeout=2)


# --- the Agent end to end --------------------------------------------------------------


async def test_agent_retries_transient_failures_and_applies_the_effect_once(
    make_agent, remote_admin
):
    await remote_admin.fault(kind="transient", service="payment", count=3)

    reply = await make_agent().handle(make_request("a1"))

    assert reply.Outcome is ReplyOutcome.OK
    assert await remote_admin.requests("a1") >= 4  # three failures, then the success
    assert await remote_admin.effect_count("a1", "charge-payment", "payment/charge") == 1


@pytest.mark.parametrize("mode", ["drop", "error"])
async def test_crash_after_the_side_effect_then_a_retry_with_the_same_key_is_one_effect(
    make_agent, remote_admin, mode
):
    await remote_admin.fault(kind="crash", service="payment", mode=mode, count=1)

    reply = await make_agent().handle(make_request("a2"))

    assert reply.Outcome is ReplyOutcome.OK
    assert await remote_admin.requests("a2") >= 2
    assert await remote_admin.effect_count("a2", "charge-payment", "payment/charge") == 1
    assert (await remote_admin.side_effects())["duplicates"] == []


async def test_a_slow_call_past_its_timeout_and_its_retry_make_one_effect(make_agent, remote_admin):
    await remote_admin.fault(kind="latency", service="payment", seconds=0.6, count=1)

    reply = await make_agent(call_timeout=0.1).handle(make_request("a3"))
    await remote_admin.wait_until_idle()  # the first, slow call has finished too

    assert reply.Outcome is ReplyOutcome.OK
    report = await remote_admin.side_effects()
    assert report["replays"] >= 1  # the later of the two calls found the stored answer
    assert report["duplicates"] == []
    assert await remote_admin.effect_count("a3", "charge-payment", "payment/charge") == 1


async def test_a_redelivered_request_gets_the_same_result_and_no_second_effect(
    make_agent, remote_admin
):
    agent = make_agent()
    request = make_request("a4", step="reserve-inventory")

    first = await agent.handle(request)
    second = await agent.handle(request)

    assert first.Outcome is second.Outcome is ReplyOutcome.OK
    assert first.Result == second.Result
    assert first.EventId == second.EventId
    assert await remote_admin.effect_count("a4", "reserve-inventory", "inventory/reserve") == 1


async def test_an_outage_longer_than_the_deadline_ends_in_a_transient_reply(
    make_agent, remote_admin
):
    await remote_admin.fault(kind="outage", service="shipping", seconds=600)

    reply = await make_agent().handle(make_request("a5", step="arrange-shipment", deadline_in=1.0))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    # The last call either got the outage's 503 or, on a loaded machine, ran
    # out of time waiting for it: the reply says which.
    assert "shipping/arrange for a5/arrange-shipment" in reply.Error
    assert await remote_admin.requests("a5") >= 2  # it did retry, inside the deadline
    assert (await remote_admin.side_effects("a5"))["total"] == 0


async def test_a_request_past_its_deadline_calls_nothing(make_agent, remote_admin):
    reply = await make_agent().handle(make_request("a6", deadline_in=-1))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert await remote_admin.requests("a6") == 0


async def test_the_breaker_opens_and_later_requests_are_answered_without_calling(
    make_agent, remote_admin
):
    agent = make_agent(breaker_fail_max=3)
    await remote_admin.fault(kind="outage", service="payment", seconds=600)

    first = await agent.handle(make_request("b1"))
    second = await agent.handle(make_request("b2"))

    assert first.Outcome is ReplyOutcome.TRANSIENT
    assert await remote_admin.requests("b1") == 3
    assert second.Outcome is ReplyOutcome.TRANSIENT
    assert "circuit open for payment" in second.Error
    assert await remote_admin.requests("b2") == 0


async def test_a_permanent_4xx_is_a_permanent_reply_after_one_call(make_agent, remote_admin):
    await remote_admin.fault(
        kind="permanent", service="payment", status=402, message="card declined"
    )

    reply = await make_agent().handle(make_request("p1"))

    assert reply.Outcome is ReplyOutcome.PERMANENT
    assert "card declined" in reply.Error
    assert await remote_admin.requests("p1") == 1


async def test_a_stale_attempt_is_fenced_off_and_told_so(make_agent, remote_admin):
    agent = make_agent()
    newer = await agent.handle(make_request("f1", step="reserve-inventory", attempt=3))

    stale = await agent.handle(make_request("f1", step="charge-payment", attempt=2))

    assert newer.Outcome is ReplyOutcome.OK
    assert stale.Outcome is ReplyOutcome.PERMANENT
    assert "fencing token 2" in stale.Error
    assert await remote_admin.effect_count("f1", "charge-payment", "payment/charge") == 0


async def test_compensation_undoes_a_completed_step_once(make_agent, remote_admin):
    agent = make_agent()
    await agent.handle(make_request("u1", step="charge-payment"))

    undo = await agent.handle(make_request("u1", step="charge-payment", action="undo"))
    again = await agent.handle(make_request("u1", step="charge-payment", action="undo"))

    assert undo.Outcome is again.Outcome is ReplyOutcome.OK
    assert undo.Result["Status"] == "refunded"
    assert await remote_admin.effect_count("u1", "charge-payment", "payment/refund") == 1
