"""The publisher's links to one queue, on the Service Bus emulator (issue 44,
the two-host bench): sends to one queue no longer wait in line behind one
link. Concurrent sends spread over at most `links` senders, each sending one
message at a time, and every message arrives once; a link whose send failed
is dropped alone, and sends go on over the others."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from adapters.servicebus import LINKS_PER_QUEUE, ServiceBusPublisher

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

QUEUE = "links"
SENDS = 40


@pytest.fixture(scope="module")
def links_servicebus(servicebus_emulator):
    emulator = servicebus_emulator.start({QUEUE: {"DefaultMessageTimeToLive": "PT1H"}})
    yield emulator
    emulator.stop()


class CountingLocks:
    """asyncio locks that record how many sends held a link's lock at once.
    The publisher makes its link-opening lock first: that one is not counted."""

    def __init__(self) -> None:
        self.peak = 0
        self._now = 0
        self._made = 0

    def __call__(self) -> CountingLocks._Lock:
        self._made += 1
        return CountingLocks._Lock(self, counted=self._made > 1)

    class _Lock(asyncio.Lock):
        def __init__(self, owner: CountingLocks, counted: bool) -> None:
            super().__init__()
            self._owner = owner
            self._counted = counted

        async def __aenter__(self) -> None:
            await super().__aenter__()
            if self._counted:
                self._owner._now += 1
                self._owner.peak = max(self._owner.peak, self._owner._now)

        async def __aexit__(self, *exc: object) -> None:
            if self._counted:
                self._owner._now -= 1
            await super().__aexit__(*exc)


@contextlib.asynccontextmanager
async def _publisher(emulator, **options):
    """A client and the product's publisher over it, both closed after."""
    async with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        publisher = ServiceBusPublisher(client, send_timeout=20, **options)
        try:
            yield client, publisher
        finally:
            await publisher.close()


async def _received(client: ServiceBusClient, want: int) -> list[str]:
    ids: list[str] = []
    async with client.get_queue_receiver(
        QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        while len(ids) < want:
            batch = await receiver.receive_messages(max_message_count=50, max_wait_time=5)
            if not batch:
                break
            ids.extend(str(m.message_id) for m in batch)
    return ids


async def test_concurrent_sends_to_one_queue_use_several_links_and_each_message_arrives_once(
    links_servicebus,
):
    locks = CountingLocks()
    async with _publisher(links_servicebus, locks=locks) as (client, publisher):
        await asyncio.gather(*(publisher.send(QUEUE, b"{}", f"m-{n}") for n in range(SENDS)))
        links = sorted(k for queue, k in publisher._senders if queue == QUEUE)
        ids = await _received(client, SENDS)

    assert sorted(ids) == sorted(f"m-{n}" for n in range(SENDS))
    # More than one link took part, never more than the limit, and sends
    # held different links' locks at once.
    assert 1 < len(links) <= LINKS_PER_QUEUE
    assert locks.peak > 1


async def test_one_link_keeps_every_send_in_line(links_servicebus):
    async with _publisher(links_servicebus, links=1) as (client, publisher):
        await asyncio.gather(*(publisher.send(QUEUE, b"{}", f"one-{n}") for n in range(10)))
        assert list(publisher._senders) == [(QUEUE, 0)]
        ids = await _received(client, 10)
    assert sorted(ids) == sorted(f"one-{n}" for n in range(10))


async def test_a_link_forgotten_after_a_failed_send_goes_alone(links_servicebus):
    # `_forget` is what a failed send calls on its own link.
    async with _publisher(links_servicebus, links=2) as (client, publisher):
        await asyncio.gather(*(publisher.send(QUEUE, b"{}", f"f-{n}") for n in range(10)))
        assert len(publisher._senders) == 2
        await publisher._forget((QUEUE, 1))
        assert list(publisher._senders) == [(QUEUE, 0)]
        await publisher.send(QUEUE, b"{}", "f-after")
        ids = await _received(client, 11)
    assert sorted(ids) == sorted([*(f"f-{n}" for n in range(10)), "f-after"])
