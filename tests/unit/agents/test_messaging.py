"""RequestProcessor's settlement decisions, with fakes behind our own ports."""

from __future__ import annotations

from dataclasses import dataclass, field

import azure.functions as func
import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.amqp import AmqpMessageBodyType

from adapters.settlement import SettleKind
from agents.agent import Agent
from agents.messaging import RequestProcessor, message_body
from domain.codec import decode, encode
from domain.errors import TransientError
from domain.models import AgentReply, ReplyOutcome
from tests.unit.agents.conftest import POLICY, request
from tests.unit.agents.fakes import FakeClock, FakeRemote, Outcome


@dataclass
class FakeSettlement:
    actions: list[tuple[str, ...]] = field(default_factory=list)

    async def complete(self) -> None:
        self.actions.append(("complete",))

    async def abandon(self) -> None:
        self.actions.append(("abandon",))

    async def dead_letter(self, reason: str, description: str) -> None:
        self.actions.append(("dead_letter", reason, description))


@dataclass
class FakeReplies:
    sent: list[tuple[str, bytes]] = field(default_factory=list)
    fail_with: Exception | None = None

    async def send(self, reply: AgentReply, message_id: str) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.sent.append((message_id, encode(reply)))


@dataclass
class FakeAlerts:
    raised: list[tuple] = field(default_factory=list)

    async def raise_alert(self, kind, reason, now, order_id=None, *, message_id=None, queue=None):
        self.raised.append((kind, reason, order_id, message_id, queue))


def make(clock: FakeClock | None = None, alerts: FakeAlerts | None = None):
    clock = clock or FakeClock()
    remote = FakeRemote(clock)
    replies = FakeReplies()
    return RequestProcessor(Agent(remote, clock, POLICY), replies, alerts), remote, replies


async def test_a_handled_request_is_replied_to_with_a_stable_id_then_completed():
    processor, _remote, replies = make()
    settlement = FakeSettlement()

    disposition = await processor.process(encode(request()), settlement)

    assert disposition is SettleKind.COMPLETE
    assert settlement.actions == [("complete",)]
    [(message_id, body)] = replies.sent
    assert message_id == "o-1:2/reply-charge-payment-2/reply"
    reply = decode(AgentReply, body)
    assert reply.Outcome is ReplyOutcome.OK
    assert reply.EventId == message_id


async def test_error_replies_are_sent_and_the_request_completed_too():
    processor, remote, replies = make()
    remote.default = Outcome(error=TransientError("down"))
    settlement = FakeSettlement()

    disposition = await processor.process(encode(request(deadline_in=5)), settlement)

    assert disposition is SettleKind.COMPLETE
    assert decode(AgentReply, replies.sent[0][1]).Outcome is ReplyOutcome.TRANSIENT


async def test_a_malformed_request_is_dead_lettered_with_the_reason_and_nothing_called():
    processor, remote, replies = make()
    settlement = FakeSettlement()
    body = encode(request()).replace(b'"Attempt":2', b'"Attempt":"two"')

    disposition = await processor.process(body, settlement)

    assert disposition is SettleKind.DEAD_LETTER
    [(action, reason, description)] = settlement.actions
    assert (action, reason) == ("dead_letter", "InvalidMessage")
    assert "Attempt" in description
    assert remote.calls == []
    assert replies.sent == []


async def test_not_json_at_all_is_dead_lettered():
    processor, _, _ = make()
    settlement = FakeSettlement()

    await processor.process(b"\xff not json", settlement)

    assert settlement.actions[0][:2] == ("dead_letter", "InvalidMessage")


async def test_a_reply_that_cannot_be_sent_abandons_the_request_for_redelivery():
    processor, _remote, replies = make()
    replies.fail_with = TransientError("link detached")
    settlement = FakeSettlement()

    disposition = await processor.process(encode(request()), settlement)

    assert disposition is SettleKind.ABANDON
    assert settlement.actions == [("abandon",)]


async def test_an_unexpected_failure_is_dead_lettered_naming_the_exception_and_alerted():
    alerts = FakeAlerts()
    processor, _, replies = make(alerts=alerts)
    replies.fail_with = RuntimeError("bug")
    settlement = FakeSettlement()

    disposition = await processor.process(encode(request()), settlement, message_id="m-1")

    assert disposition is SettleKind.DEAD_LETTER
    [(action, reason, description)] = settlement.actions
    assert (action, reason) == ("dead_letter", "ProcessingFailed")
    assert "RuntimeError: bug" in description
    assert alerts.raised == [("ProcessingFailed", description, "o-1", "m-1", "agent-requests")]


async def test_a_reply_that_cannot_be_sent_on_the_last_delivery_is_dead_lettered_not_dropped():
    alerts = FakeAlerts()
    processor, _, replies = make(alerts=alerts)
    replies.fail_with = TransientError("link detached")
    settlement = FakeSettlement()

    disposition = await processor.process(
        encode(request()), settlement, message_id="m-2", last_delivery=True
    )

    assert disposition is SettleKind.DEAD_LETTER
    assert settlement.actions[0][:2] == ("dead_letter", "RetriesExhausted")
    assert [a[0] for a in alerts.raised] == ["RetriesExhausted"]


class _Received:
    """The attributes of azure.servicebus.ServiceBusReceivedMessage the processor reads."""

    def __init__(self, body, body_type, delivery_count=0, message_id="m-9"):
        self.body, self.body_type = body, body_type
        self.delivery_count, self.message_id = delivery_count, message_id
        self.application_properties = None


@pytest.mark.parametrize(
    ("body", "kind", "expected"),
    [
        ({b"OrderID": b"o-1"}, AmqpMessageBodyType.VALUE, "AMQP value body holds an AMQP dict"),
        (None, AmqpMessageBodyType.VALUE, "null"),
        (iter([[1, 2]]), AmqpMessageBodyType.SEQUENCE, "AMQP sequence body holds an AMQP int"),
        (b"[]", AmqpMessageBodyType.VALUE, "AgentRequest"),
    ],
)
async def test_bodies_of_every_kind_that_carry_no_request_are_dead_lettered_with_a_reason(
    body, kind, expected
):
    alerts = FakeAlerts()
    processor, _, _ = make(alerts=alerts)
    settlement = FakeSettlement()

    disposition = await processor.process_message(_Received(body, kind), settlement)

    assert disposition is SettleKind.DEAD_LETTER
    [(_action, reason, description)] = settlement.actions
    assert reason == "InvalidMessage"
    assert expected in description
    assert alerts.raised[0][0] == "InvalidMessage"
    assert alerts.raised[0][3] == "m-9"


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (iter([b"{", b"}"]), AmqpMessageBodyType.DATA),
        (b"{}", AmqpMessageBodyType.VALUE),
        (iter([[b"{", b"}"]]), AmqpMessageBodyType.SEQUENCE),
    ],
)
async def test_json_text_in_any_body_kind_reaches_the_contract_check(body, kind):
    processor, _, _ = make()
    settlement = FakeSettlement()
    await processor.process_message(_Received(body, kind), settlement)
    # The JSON was read: it is refused by the contract, not by the body reader.
    assert settlement.actions[0][2].startswith("AgentRequest: ")


async def test_the_last_delivery_is_known_from_the_delivery_count():
    processor, _, replies = make(alerts=FakeAlerts())
    replies.fail_with = TransientError("down")
    first, last = FakeSettlement(), FakeSettlement()
    await processor.process_message(
        _Received(encode(request()), AmqpMessageBodyType.VALUE, 0), first
    )
    await processor.process_message(
        _Received(encode(request()), AmqpMessageBodyType.VALUE, 4), last
    )
    assert first.actions == [("abandon",)]
    assert last.actions[0][:2] == ("dead_letter", "RetriesExhausted")


def test_the_body_is_read_from_either_runners_message_type():
    assert message_body(func.ServiceBusMessage(body=b'{"a": 1}')) == b'{"a": 1}'
    assert message_body(ServiceBusMessage(b"abc")) == b"abc"  # body: an iterable of chunks
