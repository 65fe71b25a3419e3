"""Queue size limits: a send beyond MaxMessageCount (emulator extension) or
MaxSizeInMegabytes fails with the SDK's quota error; messages that fit are kept.

Message limits, as Azure's Standard tier documents them (learn.microsoft.com/azure/
service-bus-messaging/service-bus-quotas): a message of at most 256 KB, "the message size
includes the size of properties (system and user) and the size of payload"; "cumulative
size of all properties can't exceed 64 KB ... the entire header of the brokered message"."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusQuotaExceededError
from proton import Delivery, Message
from proton.utils import BlockingConnection, SendException

from tests.fixtures.servicebus import EmulatorProcess

from .helpers import body_text, receive_all

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


KB = 1024


def test_application_properties_over_the_64_kb_header_quota_are_refused(emulator) -> None:
    """Quota: "Cumulative size of all properties can't exceed 64 KB" (Standard tier); Azure
    answers amqp:link:message-size-exceeded, which the SDK raises as MessageSizeExceededError."""
    fits = {f"p{i}": "v" * (20 * KB) for i in range(3)}  # 60 KB of properties
    too_many = {f"p{i}": "v" * (22 * KB) for i in range(3)}  # 66 KB
    with (
        ServiceBusClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as client,
        client.get_queue_sender("limit-header") as sender,
    ):
        with pytest.raises(MessageSizeExceededError, match=r"size quota for this stream \(65536\)"):
            sender.send_messages(ServiceBusMessage("x", application_properties=too_many))
        sender.send_messages(ServiceBusMessage("ok", application_properties=fits))
    with client.get_queue_receiver("limit-header") as receiver:
        [kept] = receive_all(receiver, 1)
        assert body_text(kept) == "ok"
        assert len(kept.application_properties) == 3
        receiver.complete_message(kept)


def _proton_send(emulator: EmulatorProcess, message: Message) -> int:
    """Send with Qpid Proton, which (unlike the SDK) does not check the size itself; the
    emulator's outcome."""
    connection = BlockingConnection(
        f"amqp://{emulator.host}:{emulator.port}", timeout=20, allowed_mechs="ANONYMOUS"
    )
    try:
        sender = connection.create_sender("limit-size")
        assert sender.link.remote_max_message_size == 256 * KB  # what Azure's attach says
        try:
            sender.send(message)
        except SendException as refused:
            return int(refused.state)
        return int(Delivery.ACCEPTED)
    finally:
        connection.close()


def test_the_256_kb_message_quota_counts_the_properties(emulator) -> None:
    """Quota: 256 KB per message on the Standard tier, properties included in the size."""
    body = b"x" * (256 * KB - 2 * KB)
    with_properties = Message(body=body, inferred=True, properties={"p": "y" * (4 * KB)})
    assert _proton_send(emulator, with_properties) == Delivery.REJECTED
    assert _proton_send(emulator, Message(body=body, inferred=True)) == Delivery.ACCEPTED
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_receiver("limit-size") as receiver,
    ):
        [kept] = receive_all(receiver, 1)
        assert not kept.application_properties
        receiver.complete_message(kept)
