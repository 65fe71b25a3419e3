"""Peeking at queues for the console, with one receiver per queue kept open.

Opening and closing a receiver link costs about a second on the local
emulator (half each way), which made every page with a peek slow; a peek on
an open link takes milliseconds. So the console keeps one receiver per
(queue, dead-letter) per event loop. Peeking never locks, receives or settles
a message: the links exist only for the peek management operation.

Two things the SDK does that matter here: a receiver's `peek_messages`
without a sequence number continues after the last message that receiver
peeked (so every call names where to start), and one receiver is not made
for concurrent operations (so each has a lock, and every wait has a
timeout). A receiver that fails is closed and replaced once; a second
failure is the caller's error."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from azure.servicebus import ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver

log = logging.getLogger(__name__)

FIRST_SEQUENCE = 1


class QueuePeeker:
    def __init__(self, client: ServiceBusClient, timeout: float = 15.0) -> None:
        self._client = client
        self._timeout = timeout
        self._receivers: dict[tuple[str, bool], ServiceBusReceiver] = {}
        self._locks: dict[tuple[str, bool], asyncio.Lock] = {}

    async def peek(
        self, queue: str, limit: int, dead_letter: bool = False, from_sequence: int | None = None
    ) -> list[Any]:
        key = (queue, dead_letter)
        lock = self._locks.setdefault(key, asyncio.Lock())
        await asyncio.wait_for(lock.acquire(), self._timeout)
        try:
            for attempt in (1, 2):
                receiver = await self._receiver(key)
                try:
                    return await asyncio.wait_for(
                        receiver.peek_messages(
                            max_message_count=limit, sequence_number=from_sequence or FIRST_SEQUENCE
                        ),
                        self._timeout,
                    )
                except Exception as exc:  # noqa: BLE001 - a broken link is replaced once
                    await self._drop(key)
                    if attempt == 2:
                        raise
                    log.info("console: peek %s failed (%s); reopening the receiver", queue, exc)
            raise AssertionError("unreachable")
        finally:
            lock.release()

    async def _receiver(self, key: tuple[str, bool]) -> ServiceBusReceiver:
        receiver = self._receivers.get(key)
        if receiver is None:
            queue, dead_letter = key
            receiver = self._client.get_queue_receiver(
                queue,
                prefetch_count=0,
                sub_queue=ServiceBusSubQueue.DEAD_LETTER if dead_letter else None,
            )
            await asyncio.wait_for(receiver.__aenter__(), self._timeout)
            self._receivers[key] = receiver
        return receiver

    async def _drop(self, key: tuple[str, bool]) -> None:
        receiver = self._receivers.pop(key, None)
        if receiver is not None:
            # already broken; the next call opens a new one
            with contextlib.suppress(Exception):
                await asyncio.wait_for(receiver.close(), self._timeout)

    async def close(self) -> None:
        for key in list(self._receivers):
            await self._drop(key)
