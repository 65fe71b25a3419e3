"""Peek-locks: lock duration from the config, renew-lock, expiry and
redelivery with delivery count + 1, late settlement, max delivery count to
the dead-letter queue, and locks of clients that disappear."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap
import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import MessageLockLostError

from .helpers import held_messages, receive_all

pytestmark = pytest.mark.integration


def test_lock_duration_comes_from_the_config(client: ServiceBusClient) -> None:
    with client.get_queue_sender("lock-duration") as sender:
        sender.send_messages(ServiceBusMessage("x", message_id="ld-1"))
    with client.get_queue_receiver("lock-duration") as receiver:
        [message] = receive_all(receiver, 1)
        remaining = (message.locked_until_utc - dt.datetime.now(dt.UTC)).total_seconds()
        assert remaining < 30  # LockDuration PT3S, far from the 60 s default
        assert message.locked_until_utc > message.enqueued_time_utc
        receiver.complete_message(message)


def test_expired_lock_redelivers_and_late_settlement_fails(client: ServiceBusClient) -> None:
    with client.get_queue_sender("lock-expiry") as sender:
        sender.send_messages(ServiceBusMessage("x", message_id="le-1"))
    with client.get_queue_receiver("lock-expiry") as first_receiver:
        [first] = receive_all(first_receiver, 1)
        time.sleep(1.5)
        with client.get_queue_receiver("lock-expiry") as second_receiver:
            [second] = receive_all(second_receiver, 1)
            assert second.message_id == "le-1"
            assert second.delivery_count == first.delivery_count + 1
            with pytest.raises(MessageLockLostError):
                first_receiver.complete_message(first)
            second_receiver.complete_message(second)


@pytest.mark.slow
def test_renew_lock_keeps_the_message_from_other_receivers(client: ServiceBusClient) -> None:
    with client.get_queue_sender("renew") as sender:
        sender.send_messages(ServiceBusMessage("x", message_id="rn-1"))
    with client.get_queue_receiver("renew") as holder, client.get_queue_receiver("renew") as rival:
        [message] = receive_all(holder, 1)
        before = message.locked_until_utc
        for _ in range(5):  # 5 x 0.8 s outlives the 3 s lock
            time.sleep(0.8)
            holder.renew_message_lock(message)
        assert message.locked_until_utc > before
        assert rival.receive_messages(max_wait_time=1) == []
        holder.complete_message(message)


def test_max_delivery_count_moves_the_message_to_the_dead_letter_queue(
    client: ServiceBusClient,
) -> None:
    with client.get_queue_sender("max-delivery") as sender:
        sender.send_messages(ServiceBusMessage("x", message_id="md-1"))
    counts = []
    with client.get_queue_receiver("max-delivery") as receiver:
        for _ in range(3):  # MaxDeliveryCount 3
            [message] = receive_all(receiver, 1)
            counts.append(message.delivery_count)
            receiver.abandon_message(message)
        assert held_messages(receiver) == []
    assert counts == [0, 1, 2]
    with client.get_queue_receiver("max-delivery", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        [dead] = receive_all(dlq, 1)
        assert dead.message_id == "md-1"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert dead.delivery_count == 3
        dlq.complete_message(dead)


@pytest.mark.slow
def test_lock_expiries_count_towards_max_delivery_count(client: ServiceBusClient) -> None:
    with client.get_queue_sender("max-delivery-expiry") as sender:
        sender.send_messages(ServiceBusMessage("x", message_id="mde-1"))
    for _ in range(2):  # MaxDeliveryCount 2, lock 1 s: receive and let the lock run out
        with client.get_queue_receiver("max-delivery-expiry", prefetch_count=0) as receiver:
            assert len(receive_all(receiver, 1)) == 1
            time.sleep(1.5)
    with client.get_queue_receiver(
        "max-delivery-expiry", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        [dead] = receive_all(dlq, 1)
        assert dead.message_id == "mde-1"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        dlq.complete_message(dead)


_ABRUPT_CLIENT = textwrap.dedent(
    """
    import os, sys
    from azure.servicebus import ServiceBusClient
    client = ServiceBusClient.from_connection_string(sys.argv[1])
    receiver = client.get_queue_receiver("abrupt")
    messages = receiver.receive_messages(max_message_count=1, max_wait_time=10)
    print(messages[0].message_id, flush=True)
    os._exit(0)  # no close, no settlement: the socket just goes away
    """
)


@pytest.mark.slow
def test_a_client_that_vanishes_releases_its_lock_at_lock_expiry(
    client: ServiceBusClient, emulator
) -> None:

    with client.get_queue_sender("abrupt") as sender:
        sender.send_messages(ServiceBusMessage("x", message_id="gone-1"))
    result = subprocess.run(
        [sys.executable, "-c", _ABRUPT_CLIENT, emulator.connection_string],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "gone-1"
    with client.get_queue_receiver("abrupt") as receiver:
        [message] = receive_all(receiver, 1, max_wait_time=10)
        assert message.message_id == "gone-1"
        assert message.delivery_count == 1
        receiver.complete_message(message)
