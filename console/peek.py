"""Peeking at queues for the console, with one receiver per (queue,
dead-letter) per event loop kept open: opening a link costs about a second,
a peek on an open one milliseconds. Peeking never locks or settles.

Two SDK behaviours matter: `peek_messages` without a sequence number goes on
after the last message that receiver peeked (so every call names where to
start), and a receiver is not made for concurrent operations (so each has a
lock, and every wait a timeout). A failed receiver is replaced once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue
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

    async def peek_all(self, queue: str, cap: int, dead_letter: bool = False) -> list[Any]:
        """The messages of `queue` (or of its dead-letter queue), peeked page
        by page: `cap` and one more at most, so a caller sees there are more."""
        found: list[Any] = []
        start = FIRST_SEQUENCE
        while len(found) <= cap:
            page = await self.peek(queue, min(250, cap - len(found) + 1), dead_letter, start)
            if not page:
                break
            found += page
            start = max(m.sequence_number or 0 for m in page) + 1
        return found

    async def count(self, queue: str, cap: int, dead_letter: bool = True) -> tuple[int, bool]:
        """How many messages (up to `cap`) the queue holds, and whether there
        are more than `cap`."""
        found = len(await self.peek_all(queue, cap, dead_letter))
        return min(found, cap), found > cap

    async def take(
        self,
        queue: str,
        sequence: int,
        act: Callable[[Any], Awaitable[None]],
        scan_limit: int = 500,
        dead_letter: bool = False,
    ) -> bool:
        """Receive (peek-lock) message `sequence` of `queue` (or of its
        dead-letter queue), run `act` on it, then complete it; False when it
        is gone. Others received on the way are abandoned; the receiver is its
        own, so the peek links' locks are not shared."""
        receiver = self._client.get_queue_receiver(
            queue,
            sub_queue=ServiceBusSubQueue.DEAD_LETTER if dead_letter else None,
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            prefetch_count=0,
        )
        held: list[Any] = []
        await asyncio.wait_for(receiver.__aenter__(), self._timeout)
        try:
            found = None
            while found is None and len(held) < scan_limit:
                batch = await asyncio.wait_for(
                    receiver.receive_messages(max_message_count=50, max_wait_time=2),
                    self._timeout,
                )
                if not batch:
                    break
                for m in batch:
                    if found is None and m.sequence_number == sequence:
                        found = m
                    else:
                        held.append(m)
            if found is None:
                return False
            await act(found)
            await asyncio.wait_for(receiver.complete_message(found), self._timeout)
            return True
        finally:
            for m in held:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(receiver.abandon_message(m), self._timeout)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(receiver.close(), self._timeout)

    async def send(self, queue: str, message: Any) -> None:
        """One message to `queue` on a sender of its own (never shared)."""
        async with self._client.get_queue_sender(queue) as sender:
            await asyncio.wait_for(sender.send_messages(message), self._timeout)

    async def close(self) -> None:
        for key in list(self._receivers):
            await self._drop(key)
