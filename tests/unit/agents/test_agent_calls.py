"""The record of its calls an agent puts in its reply (AgentReply.Calls):
one entry per remote call, in order, with its start, duration and outcome,
so operators see an agent's retries (docs/adr/017d-agent-call-record.md)."""

from __future__ import annotations

from domain.errors import PermanentError, TransientError
from domain.models import AgentReply, ReplyOutcome
from tests.unit.agents.conftest import request
from tests.unit.agents.fakes import Outcome


async def test_each_call_is_recorded_with_its_outcome_and_duration(agent, remote):
    remote.script = [
        Outcome(error=TransientError("HTTP 503"), takes=0.25),
        Outcome(error=TransientError("HTTP 503"), takes=1.5),
        Outcome(result={"Reference": "R-9"}, takes=0.1),
    ]

    reply = await agent.handle(request())

    assert reply.Outcome is ReplyOutcome.OK
    assert reply.Calls is not None
    assert [(c.Outcome, c.Ms) for c in reply.Calls] == [
        ("transient", 250),
        ("transient", 1500),
        ("ok", 100),
    ]
    starts = [c.At for c in reply.Calls]
    assert starts == sorted(starts)
    assert len(set(starts)) == 3
    # the record survives the trip through the queue and Durable's event (JSON)
    again = AgentReply.model_validate_json(reply.model_dump_json())
    assert again.Calls == reply.Calls


async def test_a_permanent_answer_is_one_recorded_call(agent, remote):
    remote.script = [Outcome(error=PermanentError("HTTP 422: card declined"))]

    reply = await agent.handle(request())

    assert reply.Outcome is ReplyOutcome.PERMANENT
    assert [c.Outcome for c in reply.Calls or []] == ["permanent"]


async def test_no_call_no_record(agent, remote, clock):
    clock.advance(3600)  # the deadline has passed: answered without calling

    reply = await agent.handle(request())

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert reply.Calls is None
    assert remote.calls == []


def test_a_reply_without_calls_still_validates():
    """An agent that predates the record (a standalone worker not yet
    upgraded) is still understood."""
    data = {
        "InstanceId": "o-1:1",
        "OrderID": "o-1",
        "Step": "charge-payment",
        "Attempt": 1,
        "EventName": "e",
        "EventId": "e/reply",
        "Outcome": "ok",
    }
    assert AgentReply.model_validate(data).Calls is None
