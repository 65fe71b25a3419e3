"""A settlement does not wait for the receiver's idle read (the host's split transport locks).

Against our emulator through the real SDK: the receiver reads with a 3-second socket
timeout, so with the SDK's single transport lock a settlement asked for while a receive
waits would be written only after that read gave up. With the host's split, it is written
(and the message completed) while the receive is still waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from devstack.host.servicebus import split_transport_locks

pytestmark = [pytest.mark.integration]

QUEUE_PROPS = {
    "DeadLetteringOnMessageExpiration": False,
    "DefaultMessageTimeToLive": "PT1H",
    "DuplicateDetectionHistoryTimeWindow": "PT10M",
    "ForwardDeadLetteredMessagesTo": "",
    "ForwardTo": "",
    "LockDuration": "PT30S",
    "MaxDeliveryCount": 5,
    "RequiresDuplicateDetection": False,
    "RequiresSession": False,
}


@pytest.fixture(scope="module")
def settle_broker(servicebus_emulator: Any) -> Iterator[Any]:
    emulator = servicebus_emulator.start({"settle-probe": QUEUE_PROPS})
    yield emulator
    emulator.stop()


async def _settle_during_an_idle_read(connection_string: str, split: bool) -> tuple[bool, bool]:
    """(was the transport split, did the completion finish while the receive still waited)."""
    async with ServiceBusClient.from_connection_string(connection_string) as client:
        async with client.get_queue_sender("settle-probe") as sender:
            await sender.send_messages(ServiceBusMessage(b"one"))
        receiver = client.get_queue_receiver(
            "settle-probe", receive_mode=ServiceBusReceiveMode.PEEK_LOCK, socket_timeout=3
        )
        async with receiver:
            first = await receiver.receive_messages(max_message_count=1, max_wait_time=10)
            assert len(first) == 1
            was_split = split_transport_locks(receiver) if split else False
            idle = asyncio.create_task(
                receiver.receive_messages(max_message_count=1, max_wait_time=1)
            )
            await asyncio.sleep(0.3)  # the idle receive is now inside its (3-second) socket read
            await receiver.complete_message(first[0])
            during = not idle.done()
            assert await idle == []  # the completed message is not delivered again
            return was_split, during


async def test_a_completion_is_written_while_the_receiver_waits_to_read(settle_broker: Any) -> None:
    was_split, during = await _settle_during_an_idle_read(
        settle_broker.connection_string, split=True
    )
    assert was_split
    assert during, "the completion waited for the idle read to end"


async def test_without_the_split_the_sdk_makes_the_completion_wait(settle_broker: Any) -> None:
    """The control: shows the test above can fail (the SDK's own behaviour)."""
    _, during = await _settle_during_an_idle_read(settle_broker.connection_string, split=False)
    assert not during
