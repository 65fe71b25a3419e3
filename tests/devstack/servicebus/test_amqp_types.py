"""Every value a client chose keeps its AMQP type through the emulator.

AMQP 1.0 (part 3.2.4) lets message-id and correlation-id be ulong, uuid,
binary or string, and application-property values be any simple type. The
SDK's own decoder returns string and binary alike as Python bytes, so a
broker that decodes and re-encodes turns a client's string into binary; a
client that matches a reply by value and type (rhea, under the official
JavaScript SDK) then never sees its answer. These tests drive the emulator
with Qpid Proton, a generic AMQP 1.0 client with its own codec, and compare
types as Proton decodes them; the codec tests look at the encoded bytes.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from proton import Message, char, float32, int32, short, symbol, timestamp, ubyte, ulong
from proton.reactor import LinkOption
from proton.utils import BlockingConnection

from devstack.servicebus.codec import (
    TYPE,
    VALUE,
    AMQPTypes,
    encode_message,
    encode_response,
    encode_value,
    parse_message,
    request_message_id_raw,
    typed,
    with_changes,
)
from tests.fixtures.servicebus import EmulatorProcess

pytestmark = pytest.mark.integration

#: One message-id of each type AMQP allows, and the constructor byte it is encoded with.
MESSAGE_IDS: dict[str, tuple[Any, set[int]]] = {
    "string": ("order-42", {0xA1}),
    "binary": (b"\x00order-42\xff", {0xA0}),
    "uuid": (uuid.UUID("6f1c2b1e-5a0b-4f7e-9a51-0c7c1f6a2d3e"), {0x98}),
    "ulong": (ulong(42), {0x53, 0x80}),
}

#: Application properties of distinct simple types (proton decodes each to its own class).
PROPERTIES: dict[str, Any] = {
    "text": "café",
    "long": 2**40,
    "int": int32(-7),
    "short": short(3),
    "ubyte": ubyte(200),
    "ulong": ulong(2**63),
    "double": 2.5,
    "float": float32(0.5),
    "flag": True,
    "id": uuid.UUID("0b4f4a36-6d7a-4f43-8a0e-4c1b6f0e9e11"),
    "when": timestamp(1_767_225_600_000),
    "blob": b"\x00\x01",
    "sym": symbol("a-symbol"),
    "letter": char("x"),
}


class _Target(LinkOption):
    """A receiver's target address: where the broker sends replies for it."""

    def __init__(self, address: str) -> None:
        self.address = address

    def apply(self, link: Any) -> None:
        link.target.address = self.address


def _typed(value: Any) -> tuple[str, Any]:
    if isinstance(value, memoryview):
        value = bytes(value)
    return type(value).__name__, value


def _id(value: Any) -> tuple[str, Any]:
    """An id as proton reads it back: its `Message.id` gives a ulong as a plain int
    (the codec tests below check the ulong constructor byte)."""
    return _typed(int(value) if isinstance(value, int) else value)


@pytest.fixture
def proton_connection(emulator: EmulatorProcess):
    connection = BlockingConnection(
        f"amqp://{emulator.host}:{emulator.port}", timeout=15, allowed_mechs="ANONYMOUS"
    )
    try:
        yield connection
    finally:
        connection.close()


def _request(connection: BlockingConnection, node: str, message: Message) -> Message:
    reply_address = f"reply-{uuid.uuid4()}"
    sender = connection.create_sender(node)
    receiver = connection.create_receiver(node, credit=1, options=_Target(reply_address))
    message.reply_to = reply_address
    sender.send(message)
    reply = receiver.receive(timeout=10)
    sender.close()
    receiver.close()
    return reply


@pytest.mark.parametrize("kind", sorted(MESSAGE_IDS))
def test_a_management_reply_echoes_the_message_id_with_its_type(proton_connection, kind):
    message_id, _ = MESSAGE_IDS[kind]
    reply = _request(
        proton_connection,
        "peek/$management",
        Message(
            id=message_id,
            properties={"operation": "com.microsoft:peek-message"},
            body={"from-sequence-number": 1, "message-count": 1},
        ),
    )
    assert _id(reply.correlation_id) == _id(message_id)
    assert reply.properties["statusCode"] in (200, 204)


@pytest.mark.parametrize("kind", sorted(MESSAGE_IDS))
def test_a_cbs_reply_echoes_the_message_id_with_its_type(proton_connection, emulator, kind):
    message_id, _ = MESSAGE_IDS[kind]
    reply = _request(
        proton_connection,
        "$cbs",
        Message(
            id=message_id,
            properties={
                "operation": "put-token",
                "type": "servicebus.windows.net:sastoken",
                "name": f"sb://{emulator.host}:{emulator.port}/basic",
            },
            body="SharedAccessSignature sr=x&sig=y&se=9999999999&skn=RootManageSharedAccessKey",
        ),
    )
    assert _id(reply.correlation_id) == _id(message_id)
    assert reply.properties["status-code"] == 202


def test_received_and_peeked_messages_keep_every_type(proton_connection):
    sender = proton_connection.create_sender("properties")
    sent = []
    for kind, (message_id, _) in sorted(MESSAGE_IDS.items()):
        correlation_id = MESSAGE_IDS["uuid" if kind != "uuid" else "binary"][0]
        message = Message(
            id=message_id,
            correlation_id=correlation_id,
            properties=dict(PROPERTIES),
            body=f"body-{kind}",
            durable=True,
        )
        sender.send(message)
        sent.append(message)
    sender.close()

    peeked = _request(
        proton_connection,
        "properties/$management",
        Message(
            id="peek-1",
            properties={"operation": "com.microsoft:peek-message"},
            body={"from-sequence-number": 1, "message-count": 10},
        ),
    )
    peeked_messages = []
    for entry in peeked.body["messages"]:
        decoded = Message()
        decoded.decode(bytes(entry["message"]))
        peeked_messages.append(decoded)

    receiver = proton_connection.create_receiver("properties", credit=10)
    received = []
    for _ in sent:
        received.append(receiver.receive(timeout=10))
        receiver.accept()
    receiver.close()

    for got in (received, peeked_messages):
        assert len(got) == len(sent)
        for original, back in zip(sent, got, strict=True):
            assert _id(back.id) == _id(original.id)
            assert _id(back.correlation_id) == _id(original.correlation_id)
            assert {k: _typed(v) for k, v in back.properties.items()} == {
                k: _typed(v) for k, v in original.properties.items()
            }
            assert back.body == original.body


# --- the codec, byte by byte ------------------------------------------------------------


def _encoded(message: Message) -> bytes:
    return bytes(message.encode())


@pytest.mark.parametrize("kind", sorted(MESSAGE_IDS))
def test_the_reply_carries_the_request_id_bytes(kind):
    message_id, constructors = MESSAGE_IDS[kind]
    raw = request_message_id_raw(_encoded(Message(id=message_id, body="x")))
    assert raw[0] in constructors
    reply = Message()
    reply.decode(encode_response(raw, {"status-code": 200}))
    assert _id(reply.correlation_id) == _id(message_id)
    assert reply.properties == {"status-code": 200}


def test_a_rule_action_rewrites_only_the_fields_it_sets():
    original = Message(
        id=MESSAGE_IDS["binary"][0],
        correlation_id=MESSAGE_IDS["ulong"][0],
        subject="order",
        properties={"keep": int32(5), "drop": "x"},
        body="b",
    )
    changed = with_changes(
        parse_message(_encoded(original)),
        {"to": "triage", "content_type": "application/json"},
        {"seen": "yes"},
        {"drop"},
    )
    back = Message()
    back.decode(encode_message(changed, 0, []))
    assert _id(back.id) == _id(original.id)
    assert _id(back.correlation_id) == _id(original.correlation_id)
    assert back.address == "triage"
    assert back.content_type == symbol("application/json")
    assert back.subject == "order"
    assert {k: _typed(v) for k, v in back.properties.items()} == {
        "keep": _typed(int32(5)),
        "seen": _typed("yes"),
    }


def test_a_message_id_of_a_type_amqp_does_not_allow_is_refused():
    # Proton will not encode one (it turns a symbol id into a string), so the SDK's encoder does.
    properties = bytearray()
    encode_value(
        properties,
        {
            TYPE: AMQPTypes.described,
            VALUE: (
                typed(AMQPTypes.ulong, 0x73),
                typed(AMQPTypes.list, [typed(AMQPTypes.symbol, b"x")]),
            ),
        },
    )
    with pytest.raises(ValueError, match="AMQP allows ulong, uuid, binary or string"):
        request_message_id_raw(bytes(properties))


def test_peek_tells_active_deferred_and_scheduled_apart(client):
    from datetime import UTC, datetime, timedelta

    from azure.servicebus import ServiceBusMessage, ServiceBusMessageState

    with client.get_queue_sender("message-state") as sender:
        sender.send_messages([ServiceBusMessage("a", message_id="state-active")])
        sender.send_messages([ServiceBusMessage("d", message_id="state-deferred")])
        sender.schedule_messages(
            ServiceBusMessage("s", message_id="state-scheduled"),
            datetime.now(UTC) + timedelta(hours=1),
        )
    with client.get_queue_receiver("message-state", max_wait_time=5) as receiver:
        for message in receiver.receive_messages(max_message_count=2):
            if message.message_id == "state-deferred":
                receiver.defer_message(message)
            else:
                receiver.abandon_message(message)
        states = {
            m.message_id: m.state
            for m in receiver.peek_messages(max_message_count=50, sequence_number=1)
        }
    assert states["state-active"] == ServiceBusMessageState.ACTIVE
    assert states["state-deferred"] == ServiceBusMessageState.DEFERRED
    assert states["state-scheduled"] == ServiceBusMessageState.SCHEDULED
