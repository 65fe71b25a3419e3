"""Time-driven behaviour: time to live (with and without dead-lettering),
scheduled messages (schedule, cancel) and peek."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from .helpers import body_text, held_messages, receive_all

pytestmark = pytest.mark.integration


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def test_expired_messages_are_dead_lettered_where_configured(client: ServiceBusClient) -> None:
    with client.get_queue_sender("ttl-dead-letter") as sender:
        sender.send_messages(ServiceBusMessage("stale", message_id="ttl-1"))
    time.sleep(1.5)  # DefaultMessageTimeToLive PT1S
    with client.get_queue_receiver("ttl-dead-letter") as receiver:
        assert held_messages(receiver) == []
    with client.get_queue_receiver(
        "ttl-dead-letter", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        [dead] = receive_all(dlq, 1)
        assert dead.message_id == "ttl-1"
        assert dead.dead_letter_reason == "TTLExpiredException"
        dlq.complete_message(dead)


def test_expired_messages_are_dropped_otherwise(client: ServiceBusClient) -> None:
    with client.get_queue_sender("ttl-drop") as sender:
        sender.send_messages(ServiceBusMessage("stale", message_id="ttl-2"))
    time.sleep(1.5)
    with client.get_queue_receiver("ttl-drop") as receiver:
        assert held_messages(receiver) == []
    with client.get_queue_receiver("ttl-drop", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        assert held_messages(dlq) == []


def test_a_message_ttl_shorter_than_the_queue_default_wins(client: ServiceBusClient) -> None:
    with client.get_queue_sender("ttl-per-message") as sender:
        sender.send_messages(
            [
                ServiceBusMessage(
                    "short", message_id="short", time_to_live=dt.timedelta(seconds=1)
                ),
                ServiceBusMessage("long", message_id="long"),
            ]
        )
    time.sleep(1.5)
    with client.get_queue_receiver("ttl-per-message") as receiver:
        assert [m.message_id for m in held_messages(receiver)] == ["long"]
        [message] = receive_all(receiver, 1)
        receiver.complete_message(message)
    with client.get_queue_receiver(
        "ttl-per-message", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        [dead] = receive_all(dlq, 1)
        assert dead.message_id == "short"
        dlq.complete_message(dead)


@pytest.mark.slow
def test_scheduled_messages_appear_at_their_time_and_can_be_cancelled(
    client: ServiceBusClient,
) -> None:

    with client.get_queue_sender("schedule") as sender:
        [kept] = sender.schedule_messages(
            ServiceBusMessage("kept", message_id="sch-1"), _now() + dt.timedelta(seconds=2)
        )
        [cancelled] = sender.schedule_messages(
            ServiceBusMessage("gone", message_id="sch-2"), _now() + dt.timedelta(seconds=2)
        )
        assert kept != cancelled
        sender.cancel_scheduled_messages(cancelled)
        # Sending with scheduled_enqueue_time_utc schedules as well.
        sender.send_messages(
            ServiceBusMessage(
                "sent",
                message_id="sch-3",
                scheduled_enqueue_time_utc=_now() + dt.timedelta(seconds=2),
            )
        )
    with client.get_queue_receiver("schedule") as receiver:
        peeked = receiver.peek_messages(max_message_count=10, sequence_number=1)
        assert sorted(m.message_id for m in peeked) == ["sch-1", "sch-3"]
        assert receiver.receive_messages(max_wait_time=0.5) == []
        time.sleep(2)
        received = receive_all(receiver, 2)
        assert sorted(m.message_id for m in received) == ["sch-1", "sch-3"]
        assert next(m for m in received if m.message_id == "sch-1").sequence_number == kept
        for message in received:
            assert message.scheduled_enqueue_time_utc is not None
            receiver.complete_message(message)
        assert held_messages(receiver) == []


def test_peek_neither_locks_nor_counts_a_delivery(client: ServiceBusClient) -> None:
    with client.get_queue_sender("peek") as sender:
        sender.send_messages([ServiceBusMessage(f"p{i}", message_id=f"p{i}") for i in range(3)])
    with client.get_queue_receiver("peek") as receiver:
        peeked = receiver.peek_messages(max_message_count=2, sequence_number=1)
        assert [body_text(m) for m in peeked] == ["p0", "p1"]
        more = receiver.peek_messages(
            max_message_count=10, sequence_number=peeked[-1].sequence_number + 1
        )
        assert [body_text(m) for m in more] == ["p2"]
        received = receive_all(receiver, 3)
        assert [m.delivery_count for m in received] == [0, 0, 0]
        # Peek also shows locked messages.
        assert len(receiver.peek_messages(max_message_count=10, sequence_number=1)) == 3
        for message in received:
            receiver.complete_message(message)
