"""Annotations a sender sets come back on receive: message annotations and
delivery annotations (Service Bus passes both on), while the broker's own
annotations (sequence number, lock) cannot be forged by a sender."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusClient
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage

from devstack.servicebus.codec import encode_message, parse_message
from tests.fixtures.servicebus import EmulatorProcess

from .helpers import receive_all

pytestmark = pytest.mark.integration


def _annotated(tag: str) -> AmqpAnnotatedMessage:
    return AmqpAnnotatedMessage(
        data_body=[tag.encode()],
        annotations={"x-opt-custom": tag, "x-opt-sequence-number": 999_999},
        delivery_annotations={"x-opt-trace": f"trace-{tag}", "x-opt-lock-token": "forged"},
        application_properties={"kind": tag},
    )


def _check(message, tag: str) -> None:  # type: ignore[no-untyped-def]
    raw = message.raw_amqp_message
    assert raw.annotations[b"x-opt-custom"] == tag.encode()
    assert raw.delivery_annotations[b"x-opt-trace"] == f"trace-{tag}".encode()
    assert b"x-opt-lock-token" not in raw.delivery_annotations
    assert message.sequence_number != 999_999
    assert message.application_properties[b"kind"] == tag.encode()


def test_message_and_delivery_annotations_are_returned(client: ServiceBusClient) -> None:
    with client.get_queue_sender("annotations") as sender:
        sender.send_messages(_annotated("one"))
        sender.send_messages([_annotated("two"), _annotated("three")])  # a batch delivery
    with client.get_queue_receiver("annotations") as receiver:
        received = receive_all(receiver, 3)
        assert [b"".join(m.body).decode() for m in received] == ["one", "two", "three"]
        for message, tag in zip(received, ["one", "two", "three"], strict=True):
            _check(message, tag)
            # The lock token is the broker's (the delivery tag), not the forged annotation.
            assert message.lock_token != "forged"
            receiver.complete_message(message)


def test_peeked_messages_carry_the_annotations(client: ServiceBusClient) -> None:
    with client.get_queue_sender("annotations") as sender:
        sender.send_messages(_annotated("peeked"))
    with client.get_queue_receiver("annotations") as receiver:
        [peeked] = receiver.peek_messages(max_message_count=1)
        _check(peeked, "peeked")
        [message] = receive_all(receiver, 1)
        receiver.complete_message(message)


async def test_annotations_through_the_async_client(emulator: EmulatorProcess) -> None:
    async with AsyncServiceBusClient.from_connection_string(emulator.connection_string) as client:
        async with client.get_queue_sender("annotations") as sender:
            await sender.send_messages(_annotated("async"))
        async with client.get_queue_receiver("annotations", max_wait_time=5) as receiver:
            [message] = await receiver.receive_messages(max_wait_time=5)
            _check(message, "async")
            await receiver.complete_message(message)


def test_the_stored_form_keeps_delivery_annotations() -> None:
    # What --data-dir writes (encode_message) must parse back to the same annotations.
    sent = (
        b"\x00\x53\x71\xc1\x0d\x02\xa3\x07x-opt-t\xa1\x01v"  # delivery annotations {x-opt-t: "v"}
        b"\x00\x53\x75\xa0\x01x"
    )
    parsed = parse_message(sent)
    again = parse_message(encode_message(parsed, 0, []))
    assert again.delivery_items == parsed.delivery_items != b""
    assert again.delivery_count_items == 2
