"""The Agent's retry budget, breaker and replies, against a scripted remote
and a clock that only moves when the agent sleeps or a call takes time."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from agents.agent import Agent, reply_event_id
from agents.remote_client import FencingRejected
from domain.errors import PermanentError, TransientError
from domain.models import ReplyOutcome
from tests.builders import agent_request
from tests.unit.agents.conftest import POLICY, request
from tests.unit.agents.fakes import T0, Outcome


def transient(message: str = "HTTP 503", retry_after: float | None = None) -> Outcome:
    return Outcome(error=TransientError(message, retry_after=retry_after))


# --- the happy path and what every call carries -------------------------------------


async def test_ok_reply_carries_the_result_and_names_the_waiting_event(agent, remote):
    req = request("charge-payment")

    reply = await agent.handle(req)

    assert reply.Outcome is ReplyOutcome.OK
    assert reply.Result == {"Reference": "R-1"}
    assert reply.Error is None
    assert (reply.InstanceId, reply.OrderID, reply.Step, reply.Attempt) == (
        "o-1:2",
        "o-1",
        "charge-payment",
        2,
    )
    assert reply.EventName == req.ReplyEvent
    assert reply.EventId == reply_event_id(req) == f"o-1:2/{req.ReplyEvent}/reply"
    [made] = remote.calls
    assert (made.call.service, made.call.operation) == ("payment", "charge")
    assert made.call.idempotency_key == "o-1/charge-payment"
    assert made.call.fencing_token == 2
    assert made.call.body["Payload"] == {"Total": "12.50", "Currency": "EUR"}


async def test_undo_calls_the_compensating_operation_with_the_same_key(agent, remote):
    req = request("reserve-inventory", action="undo")

    reply = await agent.handle(req)

    assert reply.Outcome is ReplyOutcome.OK
    assert reply.Action == "undo"
    assert reply.EventId == f"o-1:2/{req.ReplyEvent}/reply"  # unique per undo try
    [made] = remote.calls
    assert (made.call.service, made.call.operation) == ("inventory", "release")
    assert made.call.idempotency_key == "o-1/reserve-inventory"


async def test_every_retry_carries_the_same_idempotency_key_and_fencing_token(agent, remote):
    remote.script = [transient(), transient(), Outcome(result={"Reference": "R-9"})]

    reply = await agent.handle(request())

    assert reply.Outcome is ReplyOutcome.OK
    assert reply.Result == {"Reference": "R-9"}
    assert len(remote.calls) == 3
    assert {m.call.idempotency_key for m in remote.calls} == {"o-1/charge-payment"}
    assert {m.call.fencing_token for m in remote.calls} == {2}


# --- retries inside the deadline --------------------------------------------------------


async def test_waits_grow_exponentially_with_jitter_up_to_the_cap(make_agent, remote, clock):
    agent = make_agent(max_attempts=7)
    remote.default = transient()

    await agent.handle(request(deadline_in=3600))

    ceilings = [1, 2, 4, 8, 8, 8]
    assert len(clock.sleeps) == len(ceilings)
    for slept, ceiling in zip(clock.sleeps, ceilings, strict=True):
        assert ceiling / 2 <= slept <= ceiling
    assert len(set(clock.sleeps)) > 1  # jittered, not a fixed schedule


async def test_keeps_retrying_inside_the_deadline_then_replies_transient(agent, remote, clock):
    remote.default = transient("HTTP 503: busy")
    req = request(deadline_in=30)
    stop_at = req.Deadline - timedelta(seconds=2)  # reply_margin

    reply = await agent.handle(req)

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert "HTTP 503: busy" in reply.Error
    assert f"after {len(remote.calls)} calls" in reply.Error
    assert len(remote.calls) >= 3
    assert all(made.at < stop_at for made in remote.calls)
    # It stopped because one more wait would have ended past the deadline,
    # not because it ran out of attempts (50).
    assert clock.now() < stop_at
    assert len(remote.calls) < 50


async def test_no_call_starts_after_the_deadline_even_when_calls_are_slow(agent, remote, clock):
    remote.default = Outcome(error=TransientError("timed out"), takes=5.0)
    req = request(deadline_in=12)
    stop_at = req.Deadline - timedelta(seconds=2)

    reply = await agent.handle(req)

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert all(made.at < stop_at for made in remote.calls)
    for made in remote.calls:  # each call's timeout ends by the agent's stop point
        assert made.at + timedelta(seconds=made.timeout) <= stop_at


async def test_the_call_timeout_is_cut_to_the_time_left(agent, remote):
    await agent.handle(request(deadline_in=3.5))

    [made] = remote.calls
    assert made.timeout == pytest.approx(1.5)  # 3.5 s to the deadline - 2 s margin


async def test_a_call_that_outlives_the_deadline_is_not_followed_by_another(agent, remote, clock):
    remote.script = [Outcome(error=TransientError("connection reset"), takes=120)]

    reply = await agent.handle(request(deadline_in=60))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert len(remote.calls) == 1


async def test_a_sleep_that_wakes_late_past_the_deadline_starts_no_call(agent, remote, clock):
    clock.overshoot = 100.0
    remote.default = transient()

    reply = await agent.handle(request(deadline_in=60))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert "deadline reached after 1 calls" in reply.Error
    assert len(remote.calls) == 1


async def test_a_request_whose_deadline_passed_is_answered_without_calling(agent, remote, clock):
    clock.advance(61)

    reply = await agent.handle(request(deadline_in=60))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert "no call made" in reply.Error
    assert remote.calls == []


async def test_inside_the_reply_margin_no_call_is_started(agent, remote, clock):
    clock.advance(59)  # 1 s left, the margin is 2 s

    reply = await agent.handle(request(deadline_in=60))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert remote.calls == []


async def test_no_call_starts_with_less_than_the_minimum_call_time_left(make_agent, remote, clock):
    agent = make_agent(min_call_time=1.0)
    clock.advance(57.5)  # 2.5 s left: 0.5 s to the margin, less than a call needs

    reply = await agent.handle(request(deadline_in=60))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert remote.calls == []


async def test_the_deadline_reply_names_the_last_error(agent, remote, clock):
    clock.overshoot = 100.0
    remote.default = transient("HTTP 503: outage")

    reply = await agent.handle(request(deadline_in=60))

    assert "last error: HTTP 503: outage" in reply.Error


async def test_max_attempts_caps_calls_even_with_time_left(make_agent, remote):
    agent = make_agent(max_attempts=3)
    remote.default = transient()

    reply = await agent.handle(request(deadline_in=3600))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert len(remote.calls) == 3


async def test_retry_after_is_honoured(agent, remote, clock):
    remote.script = [transient(retry_after=7.0)]

    reply = await agent.handle(request(deadline_in=60))

    assert reply.Outcome is ReplyOutcome.OK
    assert clock.sleeps == [7.0]


async def test_a_retry_after_past_the_deadline_ends_the_retries_at_once(agent, remote, clock):
    remote.script = [transient(retry_after=300)]

    reply = await agent.handle(request(deadline_in=60))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert len(remote.calls) == 1
    assert clock.sleeps == []


# --- permanent failures ----------------------------------------------------------------


async def test_a_permanent_error_is_not_retried_and_replies_permanent(agent, remote):
    remote.script = [Outcome(error=PermanentError("payment/charge: HTTP 402: card declined"))]

    reply = await agent.handle(request())

    assert reply.Outcome is ReplyOutcome.PERMANENT
    assert "card declined" in reply.Error
    assert len(remote.calls) == 1


async def test_a_fencing_rejection_replies_permanent_without_retrying(agent, remote):
    remote.script = [Outcome(error=FencingRejected("fencing token 2 rejected"))]

    reply = await agent.handle(request())

    assert reply.Outcome is ReplyOutcome.PERMANENT
    assert "fencing token 2 rejected" in reply.Error
    assert len(remote.calls) == 1


async def test_an_unknown_step_replies_permanent_without_calling(agent, remote):
    reply = await agent.handle(request("polish-shoes"))

    assert reply.Outcome is ReplyOutcome.PERMANENT
    assert "unknown step 'polish-shoes'" in reply.Error
    assert remote.calls == []


async def test_a_result_the_reply_cannot_carry_is_a_permanent_reply(agent, remote):
    remote.script = [Outcome(result={f"k{n}": n for n in range(60)})]

    reply = await agent.handle(request())

    assert reply.Outcome is ReplyOutcome.PERMANENT
    assert "/payment/charge answered a result the reply cannot carry" in reply.Error


# --- circuit breaker ----------------------------------------------------------------------


async def test_the_breaker_opens_after_n_failures_and_then_answers_without_calling(
    make_agent, remote
):
    agent = make_agent(breaker_fail_max=3, max_attempts=3)
    remote.default = transient()

    first = await agent.handle(request(order_id="o-1"))
    calls_after_first = len(remote.calls)
    second = await agent.handle(request(order_id="o-2"))

    assert first.Outcome is ReplyOutcome.TRANSIENT
    assert calls_after_first == 3
    assert agent.breakers.for_service("payment").current_state == "open"
    assert second.Outcome is ReplyOutcome.TRANSIENT
    assert "circuit open for payment" in second.Error
    assert len(remote.calls) == calls_after_first  # no call was made


async def test_the_breaker_trips_inside_one_request_and_stops_its_retries(make_agent, remote):
    agent = make_agent(breaker_fail_max=2, max_attempts=10)
    remote.default = transient()

    reply = await agent.handle(request(deadline_in=3600))

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert "circuit open for payment" in reply.Error
    assert len(remote.calls) == 2


async def test_breakers_are_per_dependency(make_agent, remote):
    agent = make_agent(breaker_fail_max=1, max_attempts=1)
    remote.script = [transient()]
    await agent.handle(request("charge-payment"))

    reply = await agent.handle(request("reserve-inventory"))

    assert agent.breakers.for_service("payment").current_state == "open"
    assert reply.Outcome is ReplyOutcome.OK
    assert remote.calls[-1].call.service == "inventory"


async def test_permanent_errors_do_not_open_the_breaker(make_agent, remote):
    agent = make_agent(breaker_fail_max=2)
    remote.default = Outcome(error=PermanentError("HTTP 422"))

    for n in range(4):
        await agent.handle(request(order_id=f"o-{n}"))

    assert agent.breakers.for_service("payment").current_state == "closed"
    assert len(remote.calls) == 4


async def test_after_the_reset_timeout_one_trial_call_closes_the_breaker(make_agent, remote):
    agent = make_agent(breaker_fail_max=1, max_attempts=1, breaker_reset_timeout=0)
    remote.script = [transient()]
    await agent.handle(request(order_id="o-1"))
    assert agent.breakers.for_service("payment").current_state == "open"

    reply = await agent.handle(request(order_id="o-2"))

    assert reply.Outcome is ReplyOutcome.OK
    assert agent.breakers.for_service("payment").current_state == "closed"


# --- reply identity ---------------------------------------------------------------------


def test_the_reply_id_is_stable_and_fits_the_contract_for_long_order_ids():
    long_order = "x" * 64
    req = request("arrange-shipment", order_id=long_order, attempt=12345, action="undo")

    event_id = reply_event_id(req)

    assert event_id == reply_event_id(req)
    assert len(event_id) <= 100
    assert event_id != reply_event_id(
        request("arrange-shipment", order_id=long_order, attempt=12345)
    )


async def test_a_call_carries_only_the_order_fields_its_step_takes(remote, clock):
    from tests.added_step import with_warehouse_step

    agent = Agent(remote, clock, POLICY, rng=random.Random(1), steps=with_warehouse_step())
    payload = {"CustomerId": "C-1", "Lines": [{"Sku": "S-1"}], "Total": "1.00", "Currency": "EUR"}
    req = agent_request(
        "o-1", "reserve-warehouse-slot", 1, "do", T0 + timedelta(seconds=60), payload
    )

    reply = await agent.handle(req)

    assert reply.Outcome is ReplyOutcome.OK
    [made] = remote.calls
    assert (made.call.service, made.call.operation) == ("warehouse", "reserve")
    assert made.call.body == {
        "OrderID": "o-1",
        "Step": "reserve-warehouse-slot",
        "Action": "do",
        "Payload": {"Lines": [{"Sku": "S-1"}]},
    }
