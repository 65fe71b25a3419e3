"""A settlement does not wait for the receiver's idle read (the host's split transport locks).

Against our emulator through the real SDK: the receiver reads with a 3-second socket
timeout, so with the SDK's single transport lock a settlement asked for while a receive
waits would be written only after that read gave up. With the host's split, it is written
(and the message completed) while the receive is still waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from devstack.host.servicebus import SPLIT_READ_WAIT, split_transport_locks

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
    emulator = servicebus_emulator.start({"settle-probe": QUEUE_PROPS, "idle-probe": QUEUE_PROPS})
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


async def _idle_receive(connection_string: str, split: bool) -> tuple[int, float]:
    """(frame reads, seconds from the send's end to the receive's) of a receive whose message
    is sent 1.5 s into it, by a receiver whose own socket timeout is the host's short one."""
    async with ServiceBusClient.from_connection_string(connection_string) as client:
        receiver = client.get_queue_receiver(
            "idle-probe", receive_mode=ServiceBusReceiveMode.PEEK_LOCK, socket_timeout=0.05
        )
        async with receiver:
            assert await receiver.receive_messages(max_message_count=1, max_wait_time=0.2) == []
            if split:
                assert split_transport_locks(receiver)
            connection = receiver._handler._connection
            inner = connection._read_frame
            reads = 0

            async def counted(*args: Any, **kwargs: Any) -> Any:
                nonlocal reads
                reads += 1
                return await inner(*args, **kwargs)

            connection._read_frame = counted
            sent_at: list[float] = []

            async def send_later() -> None:
                await asyncio.sleep(1.5)
                async with client.get_queue_sender("idle-probe") as sender:
                    await sender.send_messages(ServiceBusMessage(b"late"))
                sent_at.append(time.monotonic())

            sending = asyncio.create_task(send_later())
            got = await receiver.receive_messages(max_message_count=1, max_wait_time=10)
            received_at = time.monotonic()
            await sending
            assert len(got) == 1
            await receiver.complete_message(got[0])
            return reads, received_at - sent_at[0]


async def test_an_idle_split_receiver_reads_once_a_second_and_still_gets_a_message_at_once(
    settle_broker: Any,
) -> None:
    """With the split, an idle read lasts SPLIT_READ_WAIT, not the 0.05 s socket timeout
    (each empty read cost a frame read and a wake-up), and a message that arrives meanwhile
    ends the read: it is not held for the rest of the wait."""
    reads, late = await _idle_receive(settle_broker.connection_string, split=True)
    assert SPLIT_READ_WAIT >= 1.0
    # The send's answer and the delivery race; a delivery held for the read would be late by
    # up to SPLIT_READ_WAIT.
    assert late < SPLIT_READ_WAIT / 2, f"the message waited for the read: {late:.2f} s"
    # About 2 s idle (the sender's own link takes a while to open): a few long reads at most.
    assert reads <= 8, reads
    # The control: without the split the same receive reads every 0.05 s.
    unsplit, _ = await _idle_receive(settle_broker.connection_string, split=False)
    assert unsplit >= 20, unsplit
