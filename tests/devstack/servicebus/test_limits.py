"""Queue size limits: a send beyond MaxMessageCount (emulator extension) or
MaxSizeInMegabytes fails with the SDK's quota error; messages that fit are kept."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusQuotaExceededError

from .helpers import receive_all

pytestmark = pytest.mark.integration


def test_a_send_beyond_the_message_count_limit_fails(emulator) -> None:
    with ServiceBusClient.from_connection_string(
        emulator.connection_string, retry_total=0
    ) as client:
        with client.get_queue_sender("limited-count") as sender:
            sender.send_messages([ServiceBusMessage("1"), ServiceBusMessage("2")])
            sender.send_messages(ServiceBusMessage("3"))
            with pytest.raises(ServiceBusQuotaExceededError):
                sender.send_messages(ServiceBusMessage("4"))
        with client.get_queue_receiver("limited-count") as receiver:
            received = receive_all(receiver, 3)
            assert len(received) == 3
            receiver.complete_message(received[0])
        with client.get_queue_sender("limited-count") as sender:
            sender.send_messages(ServiceBusMessage("5"))  # room again after a completion
            with pytest.raises(ServiceBusQuotaExceededError):
                sender.send_messages([ServiceBusMessage("6"), ServiceBusMessage("7")])


def test_a_send_beyond_the_size_limit_fails(emulator) -> None:
    payload = "x" * 200_000
    with (
        ServiceBusClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as client,
        client.get_queue_sender("limited-size") as sender,
    ):
        for _ in range(5):  # 5 x 200 KB fit in MaxSizeInMegabytes 1
            sender.send_messages(ServiceBusMessage(payload))
        with pytest.raises(ServiceBusQuotaExceededError):
            sender.send_messages(ServiceBusMessage(payload))
