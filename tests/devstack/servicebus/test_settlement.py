"""Settlement in PEEK_LOCK: abandon, dead-letter (with reason and
description), defer and receive-by-sequence-number, each confirmed by the
broker's echo (the SDK waits for it)."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from .helpers import body_text, held_messages, receive_all

pytestmark = pytest.mark.integration


def test_abandon_makes_the_message_available_with_delivery_count_plus_one(
    client: ServiceBusClient,
) -> None:
    with client.get_queue_sender("abandon") as sender:
        sender.send_messages(ServiceBusMessage("again", message_id="ab-1"))
    with client.get_queue_receiver("abandon") as receiver:
        [first] = receive_all(receiver, 1)
        receiver.abandon_message(first)
        [second] = receive_all(receiver, 1)
        assert second.message_id == "ab-1"
        assert second.sequence_number == first.sequence_number
        assert (first.delivery_count, second.delivery_count) == (0, 1)
        assert second.lock_token != first.lock_token
        receiver.complete_message(second)


def test_dead_letter_moves_the_message_with_reason_and_description(
    client: ServiceBusClient,
) -> None:

    with client.get_queue_sender("dead-letter") as sender:
        sender.send_messages(
            ServiceBusMessage("poison", message_id="dl-1", application_properties={"k": "v"})
        )
    with client.get_queue_receiver("dead-letter") as receiver:
        [message] = receive_all(receiver, 1)
        receiver.dead_letter_message(
            message, reason="Conflict", error_description="OrderID reused with other data"
        )
        assert held_messages(receiver) == []
    with client.get_queue_receiver("dead-letter", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        [dead] = receive_all(dlq, 1)
        assert (dead.message_id, body_text(dead)) == ("dl-1", "poison")
        assert dead.dead_letter_reason == "Conflict"
        assert dead.dead_letter_error_description == "OrderID reused with other data"
        assert dead.dead_letter_source == "dead-letter"
        assert dead.application_properties[b"k"] == b"v"
        assert dead.sequence_number == message.sequence_number
        # The dead-letter queue is an ordinary, settleable queue.
        dlq.abandon_message(dead)
        [again] = receive_all(dlq, 1)
        assert again.delivery_count == 1
        dlq.complete_message(again)
        assert held_messages(dlq) == []


def test_deferred_messages_are_received_only_by_sequence_number(client: ServiceBusClient) -> None:
    with client.get_queue_sender("defer") as sender:
        sender.send_messages(
            [
                ServiceBusMessage("later", message_id="df-1"),
                ServiceBusMessage("now", message_id="df-2"),
            ]
        )
    with client.get_queue_receiver("defer") as receiver:
        first, second = receive_all(receiver, 2)
        receiver.defer_message(first)
        receiver.complete_message(second)
        assert receiver.receive_messages(max_wait_time=0.5) == []
        [deferred] = receiver.receive_deferred_messages([first.sequence_number])
        assert (deferred.message_id, body_text(deferred)) == ("df-1", "later")
        assert deferred.lock_token is not None
        # Abandoning a deferred message keeps it deferred.
        receiver.abandon_message(deferred)
        assert receiver.receive_messages(max_wait_time=0.5) == []
        [deferred] = receiver.receive_deferred_messages([first.sequence_number])
        receiver.complete_message(deferred)
        assert receiver.peek_messages(max_message_count=10, sequence_number=1) == []


def test_receiving_an_unknown_deferred_sequence_number_fails(emulator) -> None:
    from azure.servicebus.exceptions import ServiceBusError

    # retry_total=0: the SDK retries this error, which only slows the test down.
    with (
        ServiceBusClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as client,
        client.get_queue_receiver("defer") as receiver,
        pytest.raises(ServiceBusError, match="987654"),
    ):
        receiver.receive_deferred_messages([987654])
