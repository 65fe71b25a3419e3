"""The message gate's own rules (adapters.settlement), apart from Submit."""

from __future__ import annotations

from typing import ClassVar

import pytest
from azure.servicebus.amqp import AmqpMessageBodyType

from adapters.settlement import (
    BackoffPolicy,
    BodyRefused,
    MessageGate,
    Settle,
    SettleKind,
    defuse_trace_headers,
    read_body,
)
from domain.errors import AlertNotQueued


class Msg:
    def __init__(
        self, body, kind=AmqpMessageBodyType.DATA, props=None, delivery_count=0, message_id="m"
    ):
        self.body, self.body_type, self.application_properties = body, kind, props
        self.delivery_count, self.message_id, self.sequence_number = delivery_count, message_id, 7


@pytest.mark.parametrize(
    ("body", "kind", "expected"),
    [
        (iter([b'{"a"', b": 1}"]), AmqpMessageBodyType.DATA, b'{"a": 1}'),
        (b'{"a": 1}', AmqpMessageBodyType.VALUE, b'{"a": 1}'),
        ('{"a": 1}', AmqpMessageBodyType.VALUE, b'{"a": 1}'),
        (iter([[b'{"a"', ": 1}"]]), AmqpMessageBodyType.SEQUENCE, b'{"a": 1}'),
    ],
)
def test_json_text_is_read_from_every_body_kind(body, kind, expected):
    assert read_body(Msg(body, kind)) == expected


@pytest.mark.parametrize(
    ("body", "kind", "expected"),
    [
        ({b"a": 1}, AmqpMessageBodyType.VALUE, "AMQP value body holds an AMQP dict"),
        ([1, 2], AmqpMessageBodyType.VALUE, "AMQP value body holds an AMQP list"),
        (None, AmqpMessageBodyType.VALUE, "null"),
        (7, AmqpMessageBodyType.VALUE, "AMQP int"),
        (iter([[1]]), AmqpMessageBodyType.SEQUENCE, "AMQP sequence body holds an AMQP int"),
        (iter([b"x"]), AmqpMessageBodyType.SEQUENCE, "not a list"),
        (iter([5]), AmqpMessageBodyType.DATA, "AMQP data body holds an AMQP int"),
    ],
)
def test_bodies_that_cannot_carry_json_text_are_refused_with_what_was_found(body, kind, expected):
    with pytest.raises(BodyRefused, match=expected):
        read_body(Msg(body, kind))


def test_dead_letter_descriptions_are_ascii_and_bounded():
    outcome = Settle.dead_letter("InvalidMessage", "Zoë \u202e " + "x" * 2000)
    assert outcome.description.isascii()
    assert len(outcome.description) == 1024
    assert outcome.description.startswith("Zo\\xeb \\u202e ")


def test_unreadable_trace_headers_are_dropped_before_settling_and_others_kept():
    props = {
        b"traceparent": "\u202e".encode(),
        b"tracestate": 5,
        b"Diagnostic-Id": b"00-ok",
        b"OrderID": "\u202e".encode(),
    }
    defuse_trace_headers(Msg(b"", props=props))
    assert props == {b"Diagnostic-Id": b"00-ok", b"OrderID": "\u202e".encode()}


class Alerts:
    def __init__(self, fail_queueing: bool = False):
        self.raised = []
        self.ids = []
        self.held = []
        self.fail_queueing = fail_queueing

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
        self.raised.append((kind, order_id, message_id, queue))
        self.ids.append(alert_id)
        if self.fail_queueing and required:
            raise AlertNotQueued("alerts queue unavailable", (kind, message_id), alert_id)

    def hold(self, alert, alert_id=None):
        self.held.append(alert_id)


class Actions:
    def __init__(self):
        self.calls = []

    def complete(self, m):
        self.calls.append("complete")

    def abandon(self, m):
        self.calls.append("abandon")

    def deadletter(self, m, deadletter_reason=None, deadletter_error_description=None):
        self.calls.append(("deadletter", deadletter_reason))


async def test_a_handler_exception_is_dead_lettered_with_its_name_and_the_order_if_readable():
    alerts, actions = Alerts(), Actions()
    gate = MessageGate("orders", alerts, None, BackoffPolicy((1.0,), 5))

    async def handler(body):
        raise AttributeError("'NoneType' object has no attribute 'x'")

    outcome = await gate.run(Msg(iter([b'{"OrderID": "ORD-9"}'])), actions, handler)
    assert outcome.reason == "ProcessingFailed"
    assert "AttributeError" in outcome.description
    assert actions.calls == [("deadletter", "ProcessingFailed")]
    assert alerts.raised == [("ProcessingFailed", "ORD-9", "m", "orders")]


async def test_a_message_without_an_id_is_named_by_its_sequence_number():
    alerts, actions = Alerts(), Actions()
    gate = MessageGate("orders", alerts, None)
    await gate.run(Msg({b"a": 1}, AmqpMessageBodyType.VALUE, message_id=None), actions, None)
    assert alerts.raised == [("InvalidMessage", None, "sequence-number:7", "orders")]


async def test_an_abandon_becomes_a_delayed_retry_never_an_immediate_one():
    alerts, actions = Alerts(), Actions()

    class Scheduler:
        scheduled: ClassVar[list[str]] = []

        async def schedule(self, queue, body, message_id, enqueue_at, application_properties=None):
            self.scheduled.append(message_id)

    gate = MessageGate("agent-responses", alerts, Scheduler(), BackoffPolicy((1.0,), 5))

    async def handler(body):
        return Settle.abandon("host busy")

    outcome = await gate.run(Msg(iter([b"{}"]), message_id="x" * 128), actions, handler)
    assert outcome.kind is SettleKind.COMPLETE
    assert actions.calls == ["complete"]
    [mid] = Scheduler.scheduled
    # Named by the broker's sequence number, however long the sender's id is.
    assert mid == "retry/seq-7/1/seq-7.0"


def _copying_gate(queue: str) -> tuple[MessageGate, list[str]]:
    """A gate on `queue` whose back-off copies' ids land in the list."""
    scheduled: list[str] = []

    class Scheduler:
        async def schedule(self, queue, body, message_id, enqueue_at, application_properties=None):
            scheduled.append(message_id)

    return MessageGate(queue, Alerts(), Scheduler(), BackoffPolicy((1.0, 2.0), 5)), scheduled


async def busy(body):
    return Settle.abandon("host busy")


async def test_every_delivery_names_its_own_copy_and_older_copy_names_are_still_copies():
    """A copy named by the message alone (`retry/seq-N/k`) let a redelivery
    that failed again have its copy dropped by duplicate detection as the
    copy an earlier delivery had made, which might already have run: nothing
    then came after that failure (simulation seed 5000216, ADR 021i). Each
    delivery makes its own copy; a schedule repeated within one delivery
    keeps its name, so the queue still drops that one."""
    gate, scheduled = _copying_gate("agent-responses")
    for count in (0, 0, 3):  # the delivery, the same delivery again, a redelivery
        await gate.run(Msg(iter([b"{}"]), delivery_count=count), Actions(), busy)
    assert scheduled == ["retry/seq-7/1/seq-7.0", "retry/seq-7/1/seq-7.0", "retry/seq-7/1/seq-7.3"]
    # A copy of a copy (also one named the older way) keeps the first message's name.
    for old in ("retry/seq-7/1/seq-7.3", "retry/seq-7/1"):
        copy = Msg(iter([b"{}"]), props={"x-retry-count": 1}, message_id=old)
        copy.sequence_number = 12
        await gate.run(copy, Actions(), busy)
    assert scheduled[-2:] == ["retry/seq-7/2/seq-12.0", "retry/seq-7/2/seq-12.0"]


async def test_a_delivery_is_named_by_its_lock_not_by_a_count_whose_base_is_the_consumers():
    """Simulation seed 2209711: on agent-requests, which the queue-triggered
    agent (the Functions binding counts deliveries from 1) and the standalone
    worker (an SDK receiver counts from 0) both consume, the agent's first
    delivery and the worker's second both had delivery count 1, so the
    second's copy was dropped as a duplicate of the first's, which had run:
    nothing came after the second's failure. A delivery is named by its lock
    token (digested), new for every delivery and the same within one."""
    gate, scheduled = _copying_gate("agent-requests")
    deliveries = [  # (lock token, count): the agent's first, its repeat, the worker's second
        ("9b0c3f5e-0000-4000-8000-000000000001", 1),
        ("9b0c3f5e-0000-4000-8000-000000000001", 1),
        ("2d41a7c2-0000-4000-8000-000000000002", 1),
    ]
    for token, count in deliveries:
        message = Msg(iter([b"{}"]), delivery_count=count)
        message.lock_token = token
        await gate.run(message, Actions(), busy)
    first, again, second = scheduled
    assert first == again  # the SDK's repeat within one delivery: the queue drops it
    assert second != first
    assert all(name.startswith("retry/seq-7/1/seq-7.") for name in scheduled)
    assert all(token not in name for token, _ in deliveries for name in scheduled)


async def _refuse(body):
    return Settle.dead_letter("InvalidMessage", "Lines: not a list")


async def test_a_dead_letter_whose_alert_and_copy_cannot_be_queued_goes_with_its_alert_held():
    # Invariant 4: a malformed submission is dead-lettered *and* alerted.
    # With no copy to carry it on (no scheduler here; in the simulation, its
    # queue full too: seed 21346), abandoning left the verdict to
    # redeliveries that can be lost at receive, ending in the broker's dead
    # letter with no alert. The message is dead-lettered now, on any
    # delivery, and its alert held by the process (reporting.alerts), under
    # the id a redelivery would raise it with.
    for delivery in (0, 4):
        down, actions = Alerts(fail_queueing=True), Actions()
        gate = MessageGate("orders-webshop", down, None, BackoffPolicy((1.0,), 5))
        bad = b'{"OrderID": "ORD-9", "Lines": "x"'
        outcome = await gate.run(Msg(iter([bad]), delivery_count=delivery), actions, _refuse)
        assert outcome.kind is SettleKind.DEAD_LETTER
        assert actions.calls == [("deadletter", "InvalidMessage")]
        assert down.held == down.ids
        [alert_id] = down.held
        assert alert_id.startswith("alert/orders-webshop/seq-7/")
        assert alert_id.endswith("/InvalidMessage")


async def test_on_the_last_delivery_a_dead_letter_whose_alert_cannot_be_queued_goes_on_as_a_copy():
    """Simulation seed 9000518 (50 orders): a conflicting order's back-off copy
    crashed on three deliveries and met the alerts queue down on its fourth,
    the last by the gate's count, which dead-lettered it with no alert. The
    last delivery now makes a copy too (the agents' RequestProcessor does
    since seed 100014); the copy alerts when it is handled."""
    down, actions = Alerts(fail_queueing=True), Actions()

    class Scheduler:
        scheduled: ClassVar[list[str]] = []

        async def schedule(self, queue, body, message_id, enqueue_at, application_properties=None):
            self.scheduled.append(message_id)

    gate = MessageGate("orders-webshop", down, Scheduler(), BackoffPolicy((5.0, 15.0), 5))
    outcome = await gate.run(Msg(iter([b"not json"]), delivery_count=4), actions, _refuse)
    assert outcome.kind is SettleKind.COMPLETE
    assert actions.calls == ["complete"]
    assert Scheduler.scheduled == ["retry/seq-7/1/seq-7.4"]


async def test_while_its_alert_cannot_be_queued_a_dead_letter_comes_back_later_not_at_once():
    """Seed 5082: an immediate abandon per failed alert used up every delivery
    in a short alerts-queue outage, and the last one dead-lettered with only a
    log event. Now the message waits the back-off schedule, as a transient
    failure does, and its copy alerts when it is handled."""
    down, actions = Alerts(fail_queueing=True), Actions()

    class Scheduler:
        scheduled: ClassVar[list[tuple[str, dict]]] = []

        async def schedule(self, queue, body, message_id, enqueue_at, application_properties=None):
            self.scheduled.append((message_id, application_properties))

    gate = MessageGate("agent-responses", down, Scheduler(), BackoffPolicy((5.0, 15.0), 5))
    outcome = await gate.run(Msg(iter([b"{}"]), delivery_count=0), actions, _refuse)
    assert outcome.kind is SettleKind.COMPLETE  # a delayed copy carries it on
    assert actions.calls == ["complete"]
    [(copy_id, props)] = Scheduler.scheduled
    assert copy_id == "retry/seq-7/1/seq-7.0"
    assert props["x-original-message-id"] == "m"
    [original_alert] = down.ids
    # The copy, when it is handled, alerts under the original's id (so a
    # redelivery of the original and the copy page once between them) ...
    up, actions = Alerts(), Actions()
    gate_up = MessageGate("agent-responses", up, Scheduler(), BackoffPolicy((5.0, 15.0), 5))
    copy = Msg(iter([b"{}"]), props=props, message_id=copy_id)
    copy.sequence_number = 99
    await gate_up.run(copy, actions, _refuse)
    assert up.ids == [original_alert]
    # ... but a message merely named like a copy, with another body, does not.
    other = Msg(iter([b'{"x": 1}']), message_id=copy_id)
    await gate_up.run(other, Actions(), _refuse)
    assert up.ids[-1] != original_alert
    # When the schedule is spent the dead letter stands, under its own reason.
    spent = Msg(iter([b"{}"]), delivery_count=0)
    spent.application_properties = {**props, "x-retry-count": 2}
    actions = Actions()
    outcome = await gate.run(spent, actions, _refuse)
    assert actions.calls == [("deadletter", "InvalidMessage")]
