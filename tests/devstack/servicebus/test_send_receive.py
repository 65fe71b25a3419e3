"""Connect (SASL ANONYMOUS + CBS), send single messages and batches, receive in
both receive modes, and read back the properties the SDK exposes."""

from __future__ import annotations

import datetime as dt

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

from .helpers import body_text, held_messages, receive_all

pytestmark = pytest.mark.integration


def test_peek_lock_receive_then_complete_removes_the_message(client: ServiceBusClient) -> None:
    with client.get_queue_sender("basic") as sender:
        sender.send_messages(ServiceBusMessage("hello", message_id="m-1"))
    with client.get_queue_receiver("basic") as receiver:
        [message] = receive_all(receiver, 1)
        assert body_text(message) == "hello"
        assert message.message_id == "m-1"
        assert message.delivery_count == 0
        assert message.sequence_number >= 1
        assert message.lock_token is not None
        assert message.locked_until_utc > dt.datetime.now(dt.UTC)
        receiver.complete_message(message)
        assert held_messages(receiver) == []
    with client.get_queue_receiver("basic") as receiver:
        assert receiver.peek_messages(max_message_count=10, sequence_number=1) == []


def test_batch_sends_deliver_every_message_in_order(client: ServiceBusClient) -> None:
    with client.get_queue_sender("batch") as sender:
        sender.send_messages([ServiceBusMessage(f"list-{i}") for i in range(5)])
        batch = sender.create_message_batch()
        for i in range(5):
            batch.add_message(ServiceBusMessage(f"batch-{i}"))
        sender.send_messages(batch)
    with client.get_queue_receiver("batch") as receiver:
        received = receive_all(receiver, 10)
        assert [body_text(m) for m in received] == [f"list-{i}" for i in range(5)] + [
            f"batch-{i}" for i in range(5)
        ]
        numbers = [m.sequence_number for m in received]
        assert numbers == sorted(numbers)
        assert len(set(numbers)) == 10
        for message in received:
            receiver.complete_message(message)


def test_receive_and_delete_needs_no_settlement(client: ServiceBusClient) -> None:
    with client.get_queue_sender("receive-and-delete") as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    with client.get_queue_receiver(
        "receive-and-delete", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        received = receive_all(receiver, 2)
        assert sorted(body_text(m) for m in received) == ["a", "b"]
    with client.get_queue_receiver("receive-and-delete") as receiver:
        assert held_messages(receiver) == []


def test_message_properties_round_trip(client: ServiceBusClient) -> None:
    sent = ServiceBusMessage(
        b"\x00\x01binary",
        message_id="props-1",
        correlation_id="corr",
        content_type="application/json",
        subject="subj",
        reply_to="replies-webshop",
        application_properties={"OrderID": "o-1", "attempt": 3, "flag": True},
        time_to_live=dt.timedelta(minutes=5),
    )
    with client.get_queue_sender("properties") as sender:
        sender.send_messages(sent)
    with client.get_queue_receiver("properties") as receiver:
        [message] = receive_all(receiver, 1)
        assert b"".join(message.body) == b"\x00\x01binary"
        assert (message.message_id, message.correlation_id) == ("props-1", "corr")
        assert (message.content_type, message.subject, message.reply_to) == (
            "application/json",
            "subj",
            "replies-webshop",
        )
        assert message.application_properties[b"OrderID"] == b"o-1"
        assert message.application_properties[b"attempt"] == 3
        assert message.application_properties[b"flag"] is True
        assert message.time_to_live == dt.timedelta(minutes=5)
        receiver.complete_message(message)


def test_messages_larger_than_a_frame_are_split_and_reassembled(client: ServiceBusClient) -> None:
    payload = "x" * 200_000  # larger than the SDK's 64 KB frames, below the 256 KB message limit
    with client.get_queue_sender("large") as sender:
        sender.send_messages(ServiceBusMessage(payload))
    with client.get_queue_receiver("large") as receiver:
        [message] = receive_all(receiver, 1)
        assert body_text(message) == payload
        receiver.complete_message(message)
