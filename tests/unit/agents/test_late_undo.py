"""A redelivered undo past its try's deadline (ADR 005, defect N3): when the
workflow says it still takes the answer (AgentRequest.ListenUntil, set by
workflow 2.1's undo tries), the agent makes the idempotent call instead of
answering "too little time left"; never for a "do", never for a first
delivery (a copy of a request that already answered), never without
ListenUntil (2.0 stopped listening at the deadline), never past ListenUntil."""

from __future__ import annotations

from datetime import timedelta

from azure.servicebus.amqp import AmqpMessageBodyType

from domain.codec import decode, encode
from domain.models import AgentReply, AgentRequest, ReplyOutcome
from tests.builders import sealed
from tests.unit.agents.conftest import request
from tests.unit.agents.test_messaging import FakeSettlement, _Received, make


def undo(listen_in: float | None = 60.0, action: str = "undo") -> AgentRequest:
    """A try with 20 s of its own, from a workflow listening `listen_in` s."""
    req = request("charge-payment", action=action, deadline_in=20)
    if listen_in is None:
        return req
    # Sealed again: the Scheduler signs the request with its ListenUntil.
    return sealed(
        req.model_copy(update={"ListenUntil": req.Deadline + timedelta(seconds=listen_in - 20)})
    )


async def test_a_redelivered_undo_past_its_deadline_is_called_while_the_workflow_listens(
    agent, remote, clock
):
    clock.advance(30)  # past the try's 20 s, inside the undo's 60 s

    reply = await agent.handle(undo(), redelivered=True)

    assert reply.Outcome is ReplyOutcome.OK
    [made] = remote.calls
    assert made.call.operation == "refund"
    # Cut to ListenUntil minus the reply margin (60 - 30 - 2 = 28 s left):
    assert made.timeout == 5.0  # the call timeout, below those 28 s


async def test_the_late_call_keeps_to_the_listening_deadline(agent, remote, clock):
    clock.advance(57.8)  # 2.2 s to ListenUntil: less than margin + min call time

    reply = await agent.handle(undo(), redelivered=True)

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert "no call made" in reply.Error
    assert remote.calls == []


async def test_a_first_delivery_past_its_deadline_makes_no_call(agent, remote, clock):
    """A copy of a request that already answered: its answer would reuse a
    reply id already spent, so an undo made now could not be reported."""
    clock.advance(30)

    reply = await agent.handle(undo(), redelivered=False)

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert remote.calls == []


async def test_without_listen_until_a_redelivered_undo_makes_no_call(agent, remote, clock):
    """2.0's requests: the workflow stopped waiting at the deadline."""
    clock.advance(30)

    reply = await agent.handle(undo(listen_in=None), redelivered=True)

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert remote.calls == []


async def test_a_redelivered_do_past_its_deadline_makes_no_call(agent, remote, clock):
    clock.advance(30)

    reply = await agent.handle(undo(action="do"), redelivered=True)

    assert reply.Outcome is ReplyOutcome.TRANSIENT
    assert remote.calls == []


async def test_the_processor_reads_a_redelivery_from_the_delivery_count():
    processor, remote, replies = make()
    processor._agent._clock.advance(30)  # type: ignore[attr-defined]
    body = encode(undo())

    await processor.process_message(_Received(body, AmqpMessageBodyType.DATA, 1), FakeSettlement())
    assert remote.calls == []
    await processor.process_message(_Received(body, AmqpMessageBodyType.DATA, 2), FakeSettlement())
    assert len(remote.calls) == 1
    outcomes = [decode(AgentReply, sent).Outcome for _, sent in replies.sent]
    assert outcomes == [ReplyOutcome.TRANSIENT, ReplyOutcome.OK]
