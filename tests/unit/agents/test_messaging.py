"""RequestProcessor's settlement decisions, with fakes behind our own ports."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import azure.functions as func
import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.amqp import AmqpMessageBodyType

from adapters.settlement import SettleKind, read_body
from agents.agent import Agent
from agents.messaging import RequestProcessor
from domain.codec import decode, encode
from domain.errors import TransientError
from domain.models import AgentReply, OperatorAlert, ReplyOutcome
from reporting.alerts import Alerts
from tests.builders import KEYS
from tests.fakes import RecordingPublisher
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

    async def raise_alert(
        self,
        kind,
        reason,
        now,
        order_id=None,
        *,
        message_id=None,
        queue=None,
        alert_id=None,
        required=False,
    ):
        if self.fail_with is not None and required:
            raise self.fail_with
        self.raised.append((kind, reason, order_id, message_id, queue))
        self.ids.append(alert_id)

    ids: list[str | None] = field(default_factory=list)
    fail_with: Exception | None = None


def make(clock: FakeClock | None = None, alerts: FakeAlerts | None = None):
    clock = clock or FakeClock()
    remote = FakeRemote(clock)
    replies = FakeReplies()
    processor = RequestProcessor(Agent(remote, clock, POLICY), replies, alerts, keys=KEYS.agents)
    return processor, remote, replies


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
    assert read_body(func.ServiceBusMessage(body=b'{"a": 1}')) == b'{"a": 1}'
    assert read_body(ServiceBusMessage(b"abc")) == b"abc"  # body: an iterable of chunks


# --- requests prove they come from the Scheduler (ADR 017e) --------------------------


def _forged(**changes) -> bytes:
    """A well-formed request with the right ids whose proof is missing or wrong."""
    return encode(request().model_copy(update=changes))


@pytest.mark.parametrize(
    ("changes", "what"),
    [
        ({"Signature": None, "ReplyToken": None}, "no proof"),
        ({"Signature": None}, "no proof"),
        ({"FencingToken": 999}, "does not verify"),  # poisoning a fence in advance
        ({"Action": "undo"}, "does not verify"),  # a forged undo for a live order
        ({"OrderID": "never-existed", "InstanceId": "never-existed:2"}, "does not verify"),
        ({"Signature": "v1.00000000.AAAA"}, "unknown key"),
    ],
)
async def test_a_request_without_a_valid_signature_calls_nothing_and_is_dead_lettered_once(
    changes, what
):
    alerts = FakeAlerts()
    processor, remote, replies = make(alerts=alerts)
    settlement = FakeSettlement()

    disposition = await processor.process(_forged(**changes), settlement, message_id="evil-1")

    assert disposition is SettleKind.DEAD_LETTER
    [(action, reason, description)] = settlement.actions
    assert (action, reason) == ("dead_letter", "ForgedRequest")
    assert what in description
    assert "nothing called" in description
    assert remote.calls == []
    assert replies.sent == []
    [(kind, _reason, _order, message_id, queue)] = alerts.raised
    assert (kind, message_id, queue) == ("ForgedRequest", "evil-1", "agent-requests")
    # A redelivery of the same forgery raises the same alert id (the queue drops it).
    assert alerts.ids == ["alert/agent-requests/evil-1/ForgedRequest"]


async def test_a_signed_request_for_an_unknown_step_is_dead_lettered_not_answered():
    from tests.builders import sealed

    alerts = FakeAlerts()
    processor, remote, replies = make(alerts=alerts)
    settlement = FakeSettlement()
    unknown = sealed(request().model_copy(update={"Step": "launch-rockets"}))

    disposition = await processor.process(encode(unknown), settlement, message_id="m-u")

    assert disposition is SettleKind.DEAD_LETTER
    assert settlement.actions[0][:2] == ("dead_letter", "UnknownStep")
    assert remote.calls == []
    assert replies.sent == []
    assert [a[0] for a in alerts.raised] == ["UnknownStep"]


async def test_an_unknown_step_without_a_signature_is_a_forgery_first():
    processor, remote, _ = make()
    settlement = FakeSettlement()

    await processor.process(_forged(Step="launch-rockets"), settlement)

    assert settlement.actions[0][:2] == ("dead_letter", "ForgedRequest")
    assert remote.calls == []


async def test_replies_echo_the_token_and_application_and_are_signed():
    from domain.signing import check_reply, check_reply_token

    processor, _, replies = make()
    req = request()

    await processor.process(encode(req), FakeSettlement())

    reply = decode(AgentReply, replies.sent[0][1])
    assert (reply.ReplyToken, reply.AppId) == (req.ReplyToken, req.AppId)
    assert check_reply(KEYS.agents, reply) is None
    assert check_reply_token(KEYS.tokens, reply) is None


async def test_a_forgery_whose_alert_cannot_be_queued_and_no_copy_named_is_held():
    # Without a received message there is nothing to name a copy by: the
    # forgery is dead-lettered now and its alert held by the process, which
    # sends it once the alerts queue takes it (not left to redeliveries that
    # can be lost at receive: simulation seed 21346).
    clock = FakeClock()
    publisher = RecordingPublisher()
    publisher.down = TransientError("alerts queue full")
    alerts = Alerts(publisher, clock=clock, wake=lambda delay, flush: None)
    processor, remote, _ = make(clock, alerts=alerts)
    settlement = FakeSettlement()

    await processor.process(_forged(Signature=None), settlement, message_id="e")

    assert settlement.actions[0][:2] == ("dead_letter", "ForgedRequest")
    assert publisher.sent == []
    publisher.down = None
    clock.advance(60)
    await alerts.flush()
    [alert] = [decode(OperatorAlert, b) for b in publisher.to("alerts")]
    assert (alert.Kind, alert.MessageId, alert.Count) == ("ForgedRequest", "e", 1)
    assert remote.calls == []


@dataclass
class FakeScheduler:
    copies: list[tuple] = field(default_factory=list)
    fail: bool = False

    async def schedule(self, queue, body, message_id, enqueue_at, application_properties=None):
        if self.fail:
            raise RuntimeError("agent-requests unreachable")
        self.copies.append((queue, body, message_id, enqueue_at, application_properties))


class Received:
    """A received request as the trigger hands it over."""

    def __init__(self, body: bytes, message_id: str, sequence: int, count: int, props=None):
        self.body, self.message_id, self.sequence_number = body, message_id, sequence
        self.delivery_count, self.application_properties = count, props or {}


def _alerts_down(scheduler_fails: bool = False):
    """A processor whose alerts queue refuses (the real Alerts over a
    publisher that is down) and whose scheduler works, or not."""
    clock = FakeClock()
    publisher = RecordingPublisher()
    publisher.down = TransientError("alerts queue unreachable")
    alerts = Alerts(publisher, clock=clock, wake=lambda delay, flush: None)
    scheduler = FakeScheduler(fail=scheduler_fails)
    processor = RequestProcessor(
        Agent(FakeRemote(clock), clock, POLICY),
        FakeReplies(),
        alerts,
        keys=KEYS.agents,
        scheduler=scheduler,
        clock=clock,
    )
    return clock, publisher, scheduler, processor, alerts


async def test_a_forgery_whose_alert_cannot_be_queued_goes_on_as_a_delayed_copy():
    # While the alerts queue is down, the queue's own redeliveries would be
    # spent in seconds and end as MaxDeliveryCountExceeded with no alert: the
    # request is copied on the back-off schedule instead, and the copy, named
    # by the original's sequence number, raises the original's alert.
    clock, publisher, scheduler, processor, _ = _alerts_down()
    body = _forged(Signature=None)
    first = FakeSettlement()

    assert await processor.process_message(Received(body, "evil", 41, 1), first) is (
        SettleKind.COMPLETE
    )

    assert first.actions == [("complete",)]
    [(queue, copied, copy_id, at, props)] = scheduler.copies
    assert (queue, copied, copy_id) == ("agent-requests", body, "retry/seq-41/1/seq-41.1")
    assert at == clock.now() + timedelta(seconds=5)
    assert props["x-retry-count"] == 1
    assert props["x-original-message-id"] == "evil"

    publisher.down = None
    copy = FakeSettlement()
    await processor.process_message(Received(body, copy_id, 97, 1, props), copy)
    assert copy.actions[0][:2] == ("dead_letter", "ForgedRequest")
    [(_, _, alert_id, _)] = publisher.sent
    assert alert_id.startswith("alert/agent-requests/seq-41/")  # the original's name


async def test_a_forgery_on_its_last_delivery_whose_alert_cannot_be_queued_goes_on_as_a_copy():
    """Simulation seed 100014: three deliveries were lost at receive, so the
    handler saw only the last, met the alerts queue down, and dead-lettered
    the forgery with no alert. The last delivery makes a copy too, which
    raises the alert later."""
    _, _, scheduler, processor, _ = _alerts_down()
    body = _forged(Signature=None)
    last = FakeSettlement()
    assert await processor.process_message(Received(body, "evil", 41, 4), last) is (
        SettleKind.COMPLETE
    )
    [(queue, _, copy_id, _, _)] = scheduler.copies
    assert (queue, copy_id) == ("agent-requests", "retry/seq-41/1/seq-41.4")
    assert last.actions == [("complete",)]


async def test_a_forgery_whose_alert_and_copy_both_fail_is_dead_lettered_with_its_alert_held():
    """Simulation seed 21346: the alerts queue and agent-requests both full.
    Abandoning left the verdict to redeliveries, and the last one, lost at
    receive, ended in the broker's MaxDeliveryCountExceeded with no alert.
    Now the forgery is dead-lettered at once, its alert held and sent, once,
    when the alerts queue takes it again; a redelivery (the dead letter's
    settlement lost) is not counted again."""
    clock, publisher, _, processor, alerts = _alerts_down(scheduler_fails=True)
    body = _forged(Signature=None)
    early, again = FakeSettlement(), FakeSettlement()

    await processor.process_message(Received(body, "evil", 41, 1), early)
    await processor.process_message(Received(body, "evil", 41, 2), again)

    assert early.actions[0][:2] == ("dead_letter", "ForgedRequest")
    assert again.actions[0][:2] == ("dead_letter", "ForgedRequest")
    await alerts.flush()  # still refused: kept
    publisher.down = None
    clock.advance(60)
    await alerts.flush()
    [alert] = [decode(OperatorAlert, b) for b in publisher.to("alerts")]
    assert (alert.Kind, alert.MessageId, alert.Count) == ("ForgedRequest", "evil", 1)
