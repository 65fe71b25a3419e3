"""The async client, many concurrent connections, competing receivers and
prefetch."""

from __future__ import annotations

import asyncio
import threading

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

from .helpers import body_text, held_messages, receive_all

pytestmark = pytest.mark.integration


async def test_the_async_client_sends_receives_and_settles(emulator) -> None:
    async with AsyncServiceBusClient.from_connection_string(emulator.connection_string) as client:
        async with client.get_queue_sender("async") as sender:
            await sender.send_messages(
                [ServiceBusMessage(f"a{i}", message_id=f"a{i}") for i in range(3)]
            )
        async with client.get_queue_receiver("async") as receiver:
            received: list[ServiceBusReceivedMessage] = []
            while len(received) < 3:
                batch = await receiver.receive_messages(max_message_count=3, max_wait_time=5)
                assert batch, "messages did not arrive"
                received.extend(batch)
            first, second, third = received
            await receiver.complete_message(first)
            await receiver.abandon_message(second)
            await receiver.dead_letter_message(
                third, reason="async", error_description="from the async client"
            )
            [again] = await receiver.receive_messages(max_wait_time=5)
            assert (again.message_id, again.delivery_count) == ("a1", 1)
            await receiver.renew_message_lock(again)
            await receiver.complete_message(again)
        async with client.get_queue_receiver(
            "async", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as dlq:
            [dead] = await dlq.receive_messages(max_wait_time=5)
            assert (dead.message_id, dead.dead_letter_reason) == ("a2", "async")
            await dlq.complete_message(dead)


async def test_many_concurrent_connections(emulator) -> None:
    senders, per_sender = 20, 5

    async def send_from_own_connection(n: int) -> None:
        async with (
            AsyncServiceBusClient.from_connection_string(emulator.connection_string) as client,
            client.get_queue_sender("many-connections") as sender,
        ):
            for i in range(per_sender):
                await sender.send_messages(ServiceBusMessage(f"{n}-{i}"))

    await asyncio.gather(*(send_from_own_connection(n) for n in range(senders)))
    async with (
        AsyncServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_receiver("many-connections") as receiver,
    ):
        bodies: list[str] = []
        while len(bodies) < senders * per_sender:
            batch = await receiver.receive_messages(max_message_count=50, max_wait_time=5)
            assert batch, f"only {len(bodies)} messages arrived"
            for message in batch:
                bodies.append(body_text(message))
                await receiver.complete_message(message)
    assert sorted(bodies) == sorted(f"{n}-{i}" for n in range(senders) for i in range(per_sender))


def test_competing_receivers_never_hold_the_same_message(emulator) -> None:
    total = 40
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_sender("competing") as sender,
    ):
        sender.send_messages([ServiceBusMessage(str(i), message_id=str(i)) for i in range(total)])
    taken: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    start = threading.Barrier(len(taken))

    def consume(name: str) -> None:
        # Separate clients: separate connections, as separate workers would have.
        with (
            ServiceBusClient.from_connection_string(emulator.connection_string) as client,
            client.get_queue_receiver("competing") as receiver,
        ):
            start.wait()
            while True:
                batch = receiver.receive_messages(max_message_count=3, max_wait_time=2)
                if not batch:
                    return
                for message in batch:
                    taken[name].append(message.message_id)
                    receiver.complete_message(message)

    threads = [threading.Thread(target=consume, args=(name,)) for name in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    everything = [m for ids in taken.values() for m in ids]
    assert sorted(everything, key=int) == [str(i) for i in range(total)]  # each exactly once
    assert sum(1 for ids in taken.values() if ids) >= 2  # the load was actually shared


def test_prefetch_delivers_everything_once(client: ServiceBusClient) -> None:
    with client.get_queue_sender("prefetch") as sender:
        sender.send_messages([ServiceBusMessage(f"pf{i}") for i in range(30)])
    with client.get_queue_receiver("prefetch", prefetch_count=20) as receiver:
        received = receive_all(receiver, 30)
        assert sorted(body_text(m) for m in received) == sorted(f"pf{i}" for i in range(30))
        for message in received:
            receiver.complete_message(message)
        assert held_messages(receiver) == []
