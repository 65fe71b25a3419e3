"""A generic AMQP 1.0 client (Qpid Proton, its own C codec, no Service Bus
library) as a client application against the emulator: it posts orders, reads
its statuses, peeks the dead letters through the `$management` node, reads a
session through the `com.microsoft:session-filter` link filter and sends a
scheduled message with the `x-opt-scheduled-enqueue-time` annotation; what
Service Bus documents for AMQP clients without its SDKs."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from proton import Message, symbol, timestamp
from proton.reactor import Filter, LinkOption
from proton.utils import BlockingConnection

from domain.dead_letters import DeadLetterReason
from domain.ids import status_message_id
from tests.clients.helpers import answer_orders, contract, order
from tests.fixtures.servicebus import EmulatorProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SESSION_FILTER = symbol("com.microsoft:session-filter")


class _Target(LinkOption):
    def __init__(self, address: str) -> None:
        self.address = address

    def apply(self, link: Any) -> None:
        link.target.address = self.address


@pytest.fixture
def amqp(client_bus: EmulatorProcess) -> Iterator[BlockingConnection]:
    # No SASL user: the emulator offers ANONYMOUS, and needs no CBS token.
    connection = BlockingConnection(
        f"amqp://{client_bus.host}:{client_bus.port}", timeout=20, allowed_mechs="ANONYMOUS"
    )
    try:
        yield connection
    finally:
        connection.close()


def _json_message(body: dict[str, Any], **fields: Any) -> Message:
    # inferred=True: the bytes travel as a Data section, as the app expects, not as an
    # AmqpValue holding a binary.
    return Message(
        body=json.dumps(body).encode(), inferred=True, content_type="application/json", **fields
    )


def _management(connection: BlockingConnection, entity: str, operation: str, body: dict) -> Message:
    node = f"{entity}/$management"
    reply_to = f"amqp-client-{uuid.uuid4()}"
    sender = connection.create_sender(node)
    receiver = connection.create_receiver(node, credit=1, options=_Target(reply_to))
    request_id = uuid.uuid4()
    sender.send(
        Message(id=request_id, reply_to=reply_to, properties={"operation": operation}, body=body)
    )
    reply = receiver.receive(timeout=10)
    sender.close()
    receiver.close()
    assert reply.correlation_id == request_id
    return reply


def _receive(connection: BlockingConnection, address: str, count: int, **options: Any) -> list:
    receiver = connection.create_receiver(address, credit=count, **options)
    got = []
    for _ in range(count):
        got.append(receiver.receive(timeout=15))
        receiver.accept()
    receiver.close()
    return got


def test_orders_statuses_and_dead_letters(amqp, client_bus: EmulatorProcess):
    good = [order(f"AMQP-{n}", "replies-amqp") for n in (1, 2)]
    bad = order("AMQP-3", "replies-amqp", Lines=[{"Sku": "S", "Quantity": 1, "UnitPrice": "1,50"}])
    sender = amqp.create_sender("orders-amqp")
    for body in [*good, bad]:
        sender.send(
            _json_message(body, id=body["OrderID"], properties={"traceparent": "not-a-trace"})
        )
    sender.close()

    seen = answer_orders(client_bus.connection_string, "orders-amqp", 3)
    assert [json.loads(e["body"]) for e in seen] == [*good, bad]
    assert [e["message_id"] for e in seen] == ["AMQP-1", "AMQP-2", "AMQP-3"]
    assert [e["outcome"] for e in seen] == ["answered", "answered", "dead-lettered"]

    schema = contract("StatusUpdate")
    got = set()
    for message in _receive(amqp, "replies-amqp", 4):
        body = json.loads(bytes(message.body))
        schema.validate(body)
        assert message.id == status_message_id(body["OrderID"], body["Status"])
        assert message.properties == {"OrderID": body["OrderID"], "Status": body["Status"]}
        got.add((body["OrderID"], body["Status"]))
    assert got == {(o["OrderID"], s) for o in good for s in ("Received", "Processed")}

    reply = _management(
        amqp,
        "orders-amqp/$DeadLetterQueue",
        "com.microsoft:peek-message",
        {"from-sequence-number": 1, "message-count": 10},
    )
    assert reply.properties["statusCode"] == 200
    (entry,) = reply.body["messages"]
    dead = Message()
    dead.decode(bytes(entry["message"]))
    assert dead.id == "AMQP-3"
    assert dead.properties["DeadLetterReason"] == DeadLetterReason.INVALID_MESSAGE.value
    assert "UnitPrice" in dead.properties["DeadLetterErrorDescription"]
    assert json.loads(bytes(dead.body)) == bad


def test_sessions_through_the_link_filter(amqp):
    sender = amqp.create_sender("sessions-amqp")
    for session_id, count in (("s-a", 3), ("s-b", 2)):
        for index in range(count):
            sender.send(
                _json_message({"index": index}, id=f"{session_id}/{index}", group_id=session_id)
            )
    sender.close()

    from_a = _receive(amqp, "sessions-amqp", 3, options=Filter({SESSION_FILTER: "s-a"}))
    assert [(m.group_id, json.loads(bytes(m.body))["index"]) for m in from_a] == [
        ("s-a", 0),
        ("s-a", 1),
        ("s-a", 2),
    ]
    # A null filter value asks for the next session with messages.
    from_next = _receive(amqp, "sessions-amqp", 2, options=Filter({SESSION_FILTER: None}))
    assert [m.group_id for m in from_next] == ["s-b", "s-b"]


def test_a_scheduled_message_arrives_at_its_time(amqp):
    at_ms = int(time.time() * 1000) + 3000
    sender = amqp.create_sender("scheduled-amqp")
    sender.send(
        _json_message(
            {"n": 1},
            id="scheduled-1",
            annotations={symbol("x-opt-scheduled-enqueue-time"): timestamp(at_ms)},
        )
    )
    sender.close()
    receiver = amqp.create_receiver("scheduled-amqp", credit=1)
    message = receiver.receive(timeout=20)
    arrived_ms = int(time.time() * 1000)
    receiver.accept()
    receiver.close()
    assert message.id == "scheduled-1"
    assert arrived_ms >= at_ms
    assert message.annotations[symbol("x-opt-enqueued-time")] >= at_ms - 1000
