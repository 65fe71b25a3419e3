"""Duplicate detection by MessageId within the configured window."""

from __future__ import annotations

import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from .helpers import body_text, held_messages, receive_all

pytestmark = pytest.mark.integration


def _send(client: ServiceBusClient, queue: str, *messages: ServiceBusMessage) -> None:
    with client.get_queue_sender(queue) as sender:
        for message in messages:
            sender.send_messages(message)


def test_a_resent_message_id_is_dropped_within_the_window(client: ServiceBusClient) -> None:
    _send(
        client,
        "dedup",
        ServiceBusMessage("first", message_id="req-1"),
        ServiceBusMessage("retry", message_id="req-1"),
        ServiceBusMessage("other", message_id="req-2"),
    )
    # A batch is checked message by message too.
    with client.get_queue_sender("dedup") as sender:
        sender.send_messages(
            [
                ServiceBusMessage("batched retry", message_id="req-2"),
                ServiceBusMessage("third", message_id="req-3"),
            ]
        )
    with client.get_queue_receiver("dedup") as receiver:
        assert [m.message_id for m in held_messages(receiver)] == ["req-1", "req-2", "req-3"]
        received = receive_all(receiver, 3)
        assert [(m.message_id, body_text(m)) for m in received] == [
            ("req-1", "first"),
            ("req-2", "other"),
            ("req-3", "third"),
        ]
        for message in received:
            receiver.complete_message(message)
    # Completing the original does not reopen the window.
    _send(client, "dedup", ServiceBusMessage("late retry", message_id="req-1"))
    with client.get_queue_receiver("dedup") as receiver:
        assert held_messages(receiver) == []


@pytest.mark.slow
def test_the_same_message_id_is_accepted_again_after_the_window(client: ServiceBusClient) -> None:
    _send(client, "dedup-short", ServiceBusMessage("one", message_id="w-1"))
    time.sleep(21)  # DuplicateDetectionHistoryTimeWindow PT20S, Azure's minimum
    _send(client, "dedup-short", ServiceBusMessage("two", message_id="w-1"))
    with client.get_queue_receiver("dedup-short") as receiver:
        received = receive_all(receiver, 2)
        assert [body_text(m) for m in received] == ["one", "two"]
        for message in received:
            receiver.complete_message(message)


def test_queues_without_duplicate_detection_keep_both(client: ServiceBusClient) -> None:
    _send(
        client,
        "no-dedup",
        ServiceBusMessage("a", message_id="same"),
        ServiceBusMessage("b", message_id="same"),
    )
    with client.get_queue_receiver("no-dedup") as receiver:
        received = receive_all(receiver, 2)
        assert [body_text(m) for m in received] == ["a", "b"]
        for message in received:
            receiver.complete_message(message)
