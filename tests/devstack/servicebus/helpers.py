"""Small helpers shared by the emulator tests (public SDK calls only)."""

from __future__ import annotations

from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiver


def receive_all(
    receiver: ServiceBusReceiver, expected: int, max_wait_time: float = 5
) -> list[ServiceBusReceivedMessage]:
    """Receive until `expected` messages arrived or a receive call came back empty."""
    received: list[ServiceBusReceivedMessage] = []
    while len(received) < expected:
        batch = receiver.receive_messages(
            max_message_count=expected - len(received), max_wait_time=max_wait_time
        )
        if not batch:
            break
        received.extend(batch)
    return received


def body_text(message: ServiceBusReceivedMessage) -> str:
    return b"".join(message.body).decode()


def held_messages(receiver: ServiceBusReceiver) -> list[ServiceBusReceivedMessage]:
    """Every message the queue holds (active, locked, deferred, scheduled), by peeking: no waiting."""
    return receiver.peek_messages(max_message_count=100, sequence_number=1)
