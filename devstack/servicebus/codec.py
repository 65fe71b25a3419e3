"""The AMQP 1.0 wire codec of the emulator: frames, performatives and the
sections of a message.

We reuse the pure-Python codec that ships inside azure-servicebus
(`azure.servicebus._pyamqp`) rather than python-qpid-proton. Reasons:

- It is, by construction, the codec the SDK itself uses, so every performative
  and section we emit decodes exactly as the SDK expects (proton omits the
  message header when delivery-count is 0, omits trailing fields, and needs a
  C build).
- It is a pure function library (bytes in, tuples out) with no event loop of
  its own, so it fits an asyncio server with many connections.
- azure-servicebus is already a runtime dependency of the app.

It is a private module of the SDK, so everything we take from it is imported
here and nowhere else; an SDK upgrade that moves it breaks one file.

A stored message keeps its bare message (properties, application properties,
body, footer) as the exact bytes the sender produced. Only the header and the
message annotations, which the broker owns, are re-encoded on each delivery;
application properties are extended in place (raw map items plus new items)
when the broker adds dead-letter reasons. Nothing the sender wrote is
re-typed by a decode/encode round trip.

Where the broker echoes a value the client chose (a reply's correlation-id is
the request's message-id; a rule action rewrites some properties), it copies
the value's encoded bytes, never a decoded value: the SDK's decoder returns
AMQP `string` and `binary` alike as Python bytes, and re-encoding those would
turn a client's string id into binary (AMQP 1.0 part 3.2.4: message-id and
correlation-id are ulong, uuid, binary or string, and a client matches its
reply by value and type, as rhea-based SDKs do).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from azure.servicebus._pyamqp import performatives
from azure.servicebus._pyamqp._decode import _DECODE_BY_CONSTRUCTOR, decode_frame, decode_payload
from azure.servicebus._pyamqp._encode import (
    encode_frame,
    encode_payload,
    encode_value,
)
from azure.servicebus._pyamqp.endpoints import Source, Target
from azure.servicebus._pyamqp.error import AMQPError
from azure.servicebus._pyamqp.message import Message, Properties
from azure.servicebus._pyamqp.outcomes import Accepted, Modified, Rejected, Released
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes

__all__ = [
    "AMQP_HEADER",
    "BATCH_FORMAT",
    "SASL_HEADER",
    "TYPE",
    "VALUE",
    "AMQPError",
    "AMQPTypes",
    "Accepted",
    "Message",
    "Modified",
    "ParsedMessage",
    "Properties",
    "Rejected",
    "Released",
    "Source",
    "Target",
    "decode_frame",
    "decode_payload",
    "encode_amqp_frame",
    "encode_message",
    "encode_response",
    "encode_value",
    "parse_message",
    "performatives",
    "request_message_id_raw",
    "typed",
]

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
#: Message format of a Service Bus batch: one delivery whose Data sections are whole messages.
BATCH_FORMAT = 0x80013700

# Section descriptors (AMQP 1.0 part 3.2).
_HEADER, _DELIVERY_ANN, _MESSAGE_ANN, _PROPERTIES, _APP_PROPS = 0x70, 0x71, 0x72, 0x73, 0x74
_SYMBOLIC_DESCRIPTORS = {
    b"amqp:header:list": _HEADER,
    b"amqp:delivery-annotations:map": _DELIVERY_ANN,
    b"amqp:message-annotations:map": _MESSAGE_ANN,
    b"amqp:properties:list": _PROPERTIES,
    b"amqp:application-properties:map": _APP_PROPS,
}


def typed(amqp_type: str, value: Any) -> dict[str, Any]:
    """A value with an explicit AMQP type, for the SDK's encoder."""
    return {TYPE: amqp_type, VALUE: value}


def encode_amqp_frame(channel: int, performative: Any, frame_type: int = 0) -> bytes:
    """One frame on the wire: size, data offset, type, channel, performative (+ payload)."""
    header, body = encode_frame(performative, frame_type=bytes([frame_type]))
    return header + struct.pack(">H", channel) + (body or b"")


#: Bytes after the constructor of a fixed-width value, by the constructor's high nibble
#: (AMQP 1.0 part 1.6: 0x4_ none, 0x5_ one, 0x6_ two, 0x7_ four, 0x8_ eight, 0x9_ sixteen).
_FIXED_WIDTH = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}


def _skip_value(buffer: memoryview) -> memoryview:
    """The buffer after one encoded value, of any AMQP type (char and the decimals
    included, which the SDK's decoder does not know): sized by its constructor."""
    constructor = buffer[0]
    if constructor == 0x00:  # described: descriptor, then the value
        return _skip_value(_skip_value(buffer[1:]))
    category = constructor >> 4
    if category in _FIXED_WIDTH:
        return buffer[1 + _FIXED_WIDTH[category] :]
    if category in (0xA, 0xC, 0xE):  # variable / compound / array with a one-byte size
        return buffer[2 + buffer[1] :]
    if category in (0xB, 0xD, 0xF):  # the same with a four-byte size
        return buffer[5 + struct.unpack(">I", buffer[1:5])[0] :]
    raise ValueError(f"unknown AMQP constructor 0x{constructor:02x}")


def _decode_item(buffer: memoryview) -> tuple[memoryview, Any]:
    """One value decoded, or None for a type the SDK's decoder lacks (char, decimals)."""
    decoder = _DECODE_BY_CONSTRUCTOR[buffer[0]] if buffer[0] < len(_DECODE_BY_CONSTRUCTOR) else None
    if decoder is None:
        return _skip_value(buffer), None
    return decoder(buffer[1:])


def _decode_map_items(items: memoryview, count: int) -> dict[Any, Any]:
    """Raw map items decoded; a value of a type the SDK's decoder lacks reads as None."""
    decoded: dict[Any, Any] = {}
    cursor = items
    for _ in range(count // 2):
        cursor, key = _decode_item(cursor)
        cursor, value = _decode_item(cursor)
        decoded[key] = value
    return decoded


def _map_items(buffer: memoryview) -> tuple[memoryview, int]:
    """The raw encoded key/value items of a map (or null) and their element count."""
    constructor = buffer[0]
    if constructor == 0x40:  # null: an absent map
        return buffer[1:1], 0
    if constructor == 0xC1:
        size, count = buffer[1], buffer[2]
        return buffer[3 : 2 + size], count
    if constructor == 0xD1:
        size, count = struct.unpack(">II", buffer[1:9])
        return buffer[9 : 5 + size], count
    raise ValueError(f"expected a map, found constructor 0x{constructor:02x}")


def _filtered_items(items: memoryview, count: int, drop: frozenset[bytes]) -> tuple[bytes, int]:
    """Map items without the keys in `drop`, as raw bytes and element count."""
    if not drop or not count:
        return bytes(items), count
    kept = bytearray()
    kept_count = 0
    cursor = items
    for _ in range(count // 2):
        after_key, key = _decode_item(cursor)
        after_value = _skip_value(after_key)
        if key not in drop:
            kept += cursor[: len(cursor) - len(after_value)]
            kept_count += 2
        cursor = after_value
    return bytes(kept), kept_count


def _list_items(buffer: memoryview) -> tuple[memoryview, int]:
    """The raw encoded elements of a list and their count."""
    constructor = buffer[0]
    if constructor == 0x45:  # list0
        return buffer[1:1], 0
    if constructor == 0xC0:
        size, count = buffer[1], buffer[2]
        return buffer[3 : 2 + size], count
    if constructor == 0xD0:
        size, count = struct.unpack(">II", buffer[1:9])
        return buffer[9 : 5 + size], count
    raise ValueError(f"expected a list, found constructor 0x{constructor:02x}")


def _raw_elements(items: memoryview, count: int) -> list[bytes]:
    """Each element of a list's items, as its own encoded bytes."""
    out = []
    cursor = items
    for _ in range(count):
        rest = _skip_value(cursor)
        out.append(bytes(cursor[: len(cursor) - len(rest)]))
        cursor = rest
    return out


#: The properties fields (AMQP 1.0 part 3.2.4).
_PROPERTIES_FIELDS = 13
_NULL = b"\x40"
#: Constructors a message-id / correlation-id may have: ulong, uuid, binary, string.
_MESSAGE_ID_CONSTRUCTORS = frozenset({0x80, 0x53, 0x44, 0x98, 0xA0, 0xB0, 0xA1, 0xB1})


def properties_fields_raw(properties_raw: bytes) -> list[bytes]:
    """The 13 fields of an encoded properties section, each as its encoded bytes
    (an omitted trailing field as null)."""
    if not properties_raw:
        return [_NULL] * _PROPERTIES_FIELDS
    _, value = _section_code(memoryview(properties_raw))
    items, count = _list_items(value)
    fields = _raw_elements(items, count)
    return (fields + [_NULL] * _PROPERTIES_FIELDS)[:_PROPERTIES_FIELDS]


def encode_properties_raw(fields: list[bytes]) -> bytes:
    """A properties section from encoded fields (trailing nulls dropped, as AMQP allows)."""
    while fields and fields[-1] == _NULL:
        fields = fields[:-1]
    items = b"".join(fields)
    return (
        b"\x00\x53"
        + bytes([_PROPERTIES])
        + b"\xd0"
        + struct.pack(">II", len(items) + 4, len(fields))
        + items
    )


def request_message_id_raw(data: bytes | memoryview) -> bytes:
    """The encoded message-id of a request message, exactly as the client sent it.

    Raises:
        ValueError: The message-id is not one of the four types AMQP allows for it.
    """
    raw = parse_message(data).properties_raw
    message_id = properties_fields_raw(raw)[0]
    if message_id != _NULL and message_id[0] not in _MESSAGE_ID_CONSTRUCTORS:
        raise ValueError(
            f"message-id has constructor 0x{message_id[0]:02x}; AMQP allows ulong, uuid, binary or string"
        )
    return message_id


def _encoded(value: dict[str, Any]) -> bytes:
    out = bytearray()
    encode_value(out, value)
    return bytes(out)


def _map_section(code: int, items: bytes, count: int) -> bytes:
    return b"\x00\x53" + bytes([code]) + b"\xd1" + struct.pack(">II", len(items) + 4, count) + items


def encode_map_items(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[bytes, int]:
    """Encode typed key/value pairs as raw map items."""
    out = bytearray()
    for key, value in pairs:
        encode_value(out, key)
        encode_value(out, value)
    return bytes(out), 2 * len(pairs)


#: Annotations the broker sets on every delivery; a sender's own values for them are dropped.
BROKER_ANNOTATIONS = frozenset(
    {
        b"x-opt-sequence-number",
        b"x-opt-enqueued-time",
        b"x-opt-locked-until",
        b"x-opt-enqueue-sequence-number",
        b"x-opt-deadletter-source",
        b"x-opt-lock-token",
        b"x-opt-message-state",
    }
)
#: Application properties the broker sets when it dead-letters a message.
DEAD_LETTER_PROPERTIES = frozenset({b"DeadLetterReason", b"DeadLetterErrorDescription"})


@dataclass
class ParsedMessage:
    """A message as the broker keeps it: owned sections decoded, the bare message raw.

    Attributes:
        header: durable, priority, ttl (ms) and first-acquirer from the sender's header.
        delivery_items: The sender's delivery annotations as raw map items, broker keys removed.
        delivery_count_items: Element count of `delivery_items`.
        annotations: The sender's message annotations, decoded (to read scheduled time).
        annotation_items: The same annotations as raw map items, broker keys removed.
        annotation_count: Element count of `annotation_items`.
        properties: The decoded properties section, or None.
        properties_raw: The properties section exactly as sent.
        app_items: The application properties as raw map items.
        app_count: Element count of `app_items`.
        body_raw: Body sections and footer exactly as sent.
    """

    header: tuple[Any, Any, Any, Any] = (None, None, None, None)
    delivery_items: bytes = b""
    delivery_count_items: int = 0
    annotations: dict[bytes, Any] = field(default_factory=dict)
    annotation_items: bytes = b""
    annotation_count: int = 0
    properties: Any = None
    properties_raw: bytes = b""
    app_items: bytes = b""
    app_count: int = 0
    body_raw: bytes = b""

    @property
    def message_id(self) -> str | None:
        """The MessageId as text (the key of duplicate detection)."""
        if self.properties is None or self.properties.message_id is None:
            return None
        value = self.properties.message_id
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    @property
    def session_id(self) -> str | None:
        """The SessionId (the AMQP group-id) as text."""
        if self.properties is None or self.properties.group_id is None:
            return None
        value = self.properties.group_id
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    @property
    def ttl_ms(self) -> int | None:
        """The sender's time to live in milliseconds, if set."""
        return self.header[2]

    @property
    def size(self) -> int:
        """Encoded size used for the queue's size limit."""
        return (
            len(self.delivery_items)
            + len(self.annotation_items)
            + len(self.properties_raw)
            + len(self.app_items)
            + len(self.body_raw)
            + 32
        )

    def with_app_properties(
        self, pairs: list[tuple[dict[str, Any], dict[str, Any]]]
    ) -> ParsedMessage:
        """A copy whose application properties also carry `pairs` (replacing same-named keys)."""
        drop = frozenset(
            p[0][VALUE].encode() if isinstance(p[0][VALUE], str) else p[0][VALUE] for p in pairs
        )
        kept, kept_count = _filtered_items(memoryview(self.app_items), self.app_count, drop)
        extra, extra_count = encode_map_items(pairs)
        return ParsedMessage(
            header=self.header,
            delivery_items=self.delivery_items,
            delivery_count_items=self.delivery_count_items,
            annotations=self.annotations,
            annotation_items=self.annotation_items,
            annotation_count=self.annotation_count,
            properties=self.properties,
            properties_raw=self.properties_raw,
            app_items=kept + extra,
            app_count=kept_count + extra_count,
            body_raw=self.body_raw,
        )


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


#: Properties fields by index, for system properties a rule action may set.
PROPERTY_INDEX = {
    "message_id": 0,
    "to": 2,
    "subject": 3,
    "reply_to": 4,
    "correlation_id": 5,
    "content_type": 6,
    "group_id": 10,
    "reply_to_group_id": 12,
}


def system_properties(message: ParsedMessage) -> dict[str, Any]:
    """A message's properties-section fields by name (text as str), for rule evaluation."""
    props = message.properties
    if props is None:
        return {}
    return {name: _text(props[index]) for name, index in PROPERTY_INDEX.items()}


def app_properties(message: ParsedMessage) -> dict[str, Any]:
    """A message's application properties, decoded (strings as str)."""
    decoded = _decode_map_items(memoryview(message.app_items), message.app_count)
    return {_text(k): _text(v) for k, v in decoded.items()}


def _typed_value(value: Any) -> dict[str, Any]:
    if value is None:
        return typed(AMQPTypes.null, None)
    if isinstance(value, bool):
        return typed(AMQPTypes.boolean, value)
    if isinstance(value, int):
        return typed(AMQPTypes.long, value)
    if isinstance(value, float):
        return typed(AMQPTypes.double, value)
    return typed(AMQPTypes.string, str(value))


def with_changes(
    message: ParsedMessage,
    set_system: dict[str, Any],
    set_user: dict[str, Any],
    removed_user: set[str],
) -> ParsedMessage:
    """A copy with properties and application properties changed, as a rule action does.

    Args:
        message: The message to copy.
        set_system: New values of properties fields (names of PROPERTY_INDEX).
        set_user: New application property values (SQL types: str, int, float, bool).
        removed_user: Application properties to remove.

    Returns:
        The changed copy; untouched application properties keep their encoded bytes.
    """
    drop = frozenset(k.encode() for k in set(set_user) | removed_user)
    kept, kept_count = _filtered_items(memoryview(message.app_items), message.app_count, drop)
    extra, extra_count = encode_map_items(
        [(typed(AMQPTypes.string, k), _typed_value(v)) for k, v in set_user.items()]
    )
    properties, properties_raw = message.properties, message.properties_raw
    if set_system:
        # Only the fields the action sets are encoded anew (as SQL strings: string, or
        # symbol for content-type); every other field keeps the sender's bytes and type.
        raw_fields = properties_fields_raw(properties_raw)
        values = list(properties or Properties())
        for name, value in set_system.items():
            index = PROPERTY_INDEX[name]
            kind = AMQPTypes.symbol if name == "content_type" else AMQPTypes.string
            text = None if value is None else str(value)
            values[index] = text
            raw_fields[index] = _encoded(
                typed(AMQPTypes.null, None) if text is None else typed(kind, text)
            )
        properties = Properties(*values)
        properties_raw = encode_properties_raw(raw_fields)
    return ParsedMessage(
        header=message.header,
        delivery_items=message.delivery_items,
        delivery_count_items=message.delivery_count_items,
        annotations=message.annotations,
        annotation_items=message.annotation_items,
        annotation_count=message.annotation_count,
        properties=properties,
        properties_raw=properties_raw,
        app_items=kept + extra,
        app_count=kept_count + extra_count,
        body_raw=message.body_raw,
    )


def _section_code(buffer: memoryview) -> tuple[int, memoryview]:
    """The descriptor code of the section at `buffer` and the buffer at its value."""
    if buffer[0] != 0x00:
        raise ValueError("a message section must be a described type")
    constructor = buffer[1]
    if constructor == 0x53:
        return buffer[2], buffer[3:]
    rest, descriptor = _DECODE_BY_CONSTRUCTOR[constructor](buffer[2:])
    if isinstance(descriptor, bytes):
        return _SYMBOLIC_DESCRIPTORS.get(descriptor, 0x75), rest
    return int(descriptor), rest


def parse_message(data: bytes | memoryview) -> ParsedMessage:
    """Split an encoded message into the parts the broker keeps.

    Args:
        data: One complete encoded message, as in a transfer's payload.

    Returns:
        The parsed message; its bare sections keep the sender's bytes.
    """
    buffer = memoryview(bytes(data))
    parsed = ParsedMessage()
    body = bytearray()
    while buffer:
        start = buffer
        code, value = _section_code(buffer)
        rest = _skip_value(value)
        if code == _HEADER:
            _, fields = _DECODE_BY_CONSTRUCTOR[value[0]](value[1:])
            fields = list(fields) + [None] * 5
            parsed.header = (fields[0], fields[1], fields[2], fields[3])
        elif code == _DELIVERY_ANN:
            # AMQP calls these hop-by-hop, but Service Bus hands a sender's delivery
            # annotations to the receiver; only the broker's lock token is its own.
            items, count = _map_items(value)
            parsed.delivery_items, parsed.delivery_count_items = _filtered_items(
                items, count, BROKER_ANNOTATIONS
            )
        elif code == _MESSAGE_ANN:
            items, count = _map_items(value)
            parsed.annotations = _decode_map_items(items, count)
            parsed.annotation_items, parsed.annotation_count = _filtered_items(
                items, count, BROKER_ANNOTATIONS
            )
        elif code == _PROPERTIES:
            _, fields = _DECODE_BY_CONSTRUCTOR[value[0]](value[1:])
            fields = list(fields) + [None] * (13 - len(fields))
            parsed.properties = Properties(*fields[:13])
            parsed.properties_raw = bytes(start[: len(start) - len(rest)])
        elif code == _APP_PROPS:
            items, count = _map_items(value)
            parsed.app_items, parsed.app_count = bytes(items), count
        else:
            body += start[: len(start) - len(rest)]
        buffer = rest
    parsed.body_raw = bytes(body)
    return parsed


def encode_message(
    message: ParsedMessage,
    delivery_count: int,
    annotations: list[tuple[dict[str, Any], dict[str, Any]]],
) -> bytes:
    """Encode a stored message for delivery.

    Args:
        message: The stored message.
        delivery_count: Prior delivery attempts (the AMQP header's field, always encoded).
        annotations: Broker annotations for this delivery (sequence number, lock, ...).

    Returns:
        The message bytes for a transfer payload or a management response.
    """
    out = bytearray()
    durable, priority, ttl, first_acquirer = message.header
    # Always encode the header: the SDK reads delivery_count from it, and 0 is meaningful.
    header_value = {
        TYPE: AMQPTypes.described,
        VALUE: (
            typed(AMQPTypes.ulong, _HEADER),
            typed(
                AMQPTypes.list,
                [
                    typed(AMQPTypes.boolean, bool(durable)),
                    typed(AMQPTypes.ubyte, priority if priority is not None else 4),
                    typed(AMQPTypes.uint, ttl) if ttl is not None else typed(AMQPTypes.null, None),
                    typed(AMQPTypes.boolean, bool(first_acquirer))
                    if first_acquirer is not None
                    else typed(AMQPTypes.null, None),
                    typed(AMQPTypes.uint, delivery_count),
                ],
            ),
        ),
    }
    encode_value(out, header_value)
    if message.delivery_count_items:
        out += _map_section(_DELIVERY_ANN, message.delivery_items, message.delivery_count_items)
    extra, extra_count = encode_map_items(annotations)
    out += _map_section(
        _MESSAGE_ANN, message.annotation_items + extra, message.annotation_count + extra_count
    )
    out += message.properties_raw
    if message.app_count:
        out += _map_section(_APP_PROPS, message.app_items, message.app_count)
    out += message.body_raw
    return bytes(out)


def encode_response(
    correlation_id_raw: bytes,
    application_properties: dict[str, Any],
    value: Any = None,
) -> bytes:
    """Encode a request/response reply ($cbs or $management).

    Args:
        correlation_id_raw: The request's message-id as it was encoded
            (`request_message_id_raw`), echoed with its type so the client matches the reply.
        application_properties: Status fields (status code as int).
        value: The AmqpValue body, or None.

    Returns:
        The encoded reply message.
    """
    fields = [_NULL] * _PROPERTIES_FIELDS
    fields[5] = correlation_id_raw
    out = bytearray(encode_properties_raw(fields))
    encode_payload(out, Message(application_properties=application_properties, value=value))
    return bytes(out)


def new_lock_token() -> uuid.UUID:
    """A fresh lock token; its `bytes_le` is the 16-byte delivery tag the SDK reads back."""
    return uuid.uuid4()
