"""The standalone agent worker (`python -m agents.worker`): the Agent in its
own process, for a separate runtime or trust boundary. How it receives,
renews locks and shuts down: docs/agents.md, "Standalone worker"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.aio import AutoLockRenewer, ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import ServiceBusError

from adapters.clock import SYSTEM_CLOCK, Clock
from adapters.servicebus import AGENT_REQUESTS_QUEUE, servicebus_client
from adapters.settlement import BodyRefused, read_body
from agents.config import (
    AgentSettings,
    require_servicebus,
)
from agents.messaging import (
    ReceiverSettlement,
    RequestProcessor,
    ServiceBusReplySender,
)
from domain.codec import decode
from domain.errors import ValidationFailed
from domain.models import AgentRequest

log = logging.getLogger("agents.worker")

READY_LINE = "agent-worker ready"
RECEIVE_WAIT_SECONDS = 1.0  # how quickly a stop request is noticed while idle
RECEIVE_RETRY_SECONDS = 2.0


class WorkerRuntime:
    """What the worker's loop runs on: asyncio's tasks and waits, and the
    SDK's lock renewer; the simulation's (sim/worker.py) runs on virtual time."""

    def spawn(self, handling: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.create_task(handling)

    async def wait(
        self, tasks: set[asyncio.Task[Any]], timeout: float | None = None, first: bool = False
    ) -> set[asyncio.Task[Any]]:
        """Until every one of `tasks` (or, with `first`, one) is done or
        `timeout` passes; returns those still pending."""
        _, pending = await asyncio.wait(
            tasks,
            timeout=timeout,
            return_when=asyncio.FIRST_COMPLETED if first else asyncio.ALL_COMPLETED,
        )
        return pending

    def renewer(self) -> AutoLockRenewer:
        return AutoLockRenewer(on_lock_renew_failure=_lock_renew_failed)


class AgentWorker:
    """Receives requests and hands each to the processor, `max_concurrency`
    at a time."""

    def __init__(
        self,
        client: ServiceBusClient,
        processor: RequestProcessor,
        settings: AgentSettings,
        *,
        clock: Clock = SYSTEM_CLOCK,
        runtime: WorkerRuntime | None = None,
    ) -> None:
        self._client = client
        self._processor = processor
        self._settings = settings
        self._clock = clock
        self._runtime = runtime or WorkerRuntime()
        self._in_flight: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event, on_ready: Callable[[], Any] | None = None) -> None:
        receiver = self._client.get_queue_receiver(
            AGENT_REQUESTS_QUEUE,
            receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
            # No prefetch: a prefetched message's lock runs while it waits in
            # our buffer, unrenewed.
            prefetch_count=0,
        )
        renewer = self._runtime.renewer()
        async with receiver:
            if on_ready is not None:
                on_ready()
            try:
                await self._receive_until(stop, receiver, renewer)
            finally:
                # Also when receiving failed for good: settle what is in
                # flight while the receiver (its link) is still open.
                await self._drain()
                await renewer.close()

    async def _receive_until(
        self, stop: asyncio.Event, receiver: ServiceBusReceiver, renewer: AutoLockRenewer
    ) -> None:
        limit = self._settings.max_concurrency
        while not stop.is_set():
            free = limit - len(self._in_flight)
            if free <= 0:
                await self._until_stopped(stop, self._in_flight)
                continue
            # Not cancelled on stop: a receive cut short could leave messages
            # locked to us that nobody handles until their lock expires.
            try:
                messages = await receiver.receive_messages(
                    max_message_count=free, max_wait_time=RECEIVE_WAIT_SECONDS
                )
            except ServiceBusError as exc:
                # The SDK reopens its link on the next receive; pause so a
                # namespace that is down is not polled in a tight loop.
                log.warning("receiving from %s failed: %s", AGENT_REQUESTS_QUEUE, exc)
                await self._until_stopped(stop, set(), RECEIVE_RETRY_SECONDS)
                continue
            for message in messages:
                renewer.register(
                    receiver, message, max_lock_renewal_duration=self._renewal_for(message)
                )
                task = self._runtime.spawn(self._handle(receiver, message))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)

    async def _until_stopped(
        self, stop: asyncio.Event, tasks: set[asyncio.Task[None]], timeout: float | None = None
    ) -> None:
        """Until `stop` is set, one of `tasks` is done or `timeout` passes."""
        stopping = asyncio.create_task(stop.wait())
        try:
            await self._runtime.wait({*tasks, stopping}, timeout=timeout, first=True)
        finally:
            stopping.cancel()

    async def _handle(self, receiver: ServiceBusReceiver, message: Any) -> None:
        settlement = ReceiverSettlement(receiver, message)
        try:
            disposition = await self._processor.process_message(message, settlement)
            log.info("request %s %s", message.message_id, disposition.value)
        except asyncio.CancelledError:
            # Shutting down past the grace period: give the message back now.
            with contextlib.suppress(Exception):
                await asyncio.shield(settlement.abandon())
            raise
        except Exception:
            # Settling failed (lock lost, connection dropped): the message
            # comes back after its lock expires; the reply's stable id makes
            # a re-sent reply a duplicate.
            log.exception("could not settle request %s", message.message_id)

    async def _drain(self) -> None:
        if not self._in_flight:
            return
        log.info("stopping: waiting for %d requests in flight", len(self._in_flight))
        pending = await self._runtime.wait(
            set(self._in_flight), timeout=self._settings.shutdown_grace
        )
        for task in pending:
            task.cancel()
        if pending:
            await self._runtime.wait(pending)

    def _renewal_for(self, message: Any) -> float:
        """Renew until the request's deadline plus the slack for replying and
        settling, never forever: a handler stuck past that loses the lock and
        the message is redelivered (then answered without a call)."""
        slack = self._settings.lock_renewal_slack
        try:
            request = decode(AgentRequest, read_body(message))
        except (ValidationFailed, BodyRefused):
            return slack  # dead-lettered at once by the processor
        left = (request.Deadline - self._clock.now()).total_seconds()
        return max(left, 0.0) + slack


async def _lock_renew_failed(renewable: Any, error: Exception | None) -> None:
    log.warning("lock renewal failed for %s: %s", getattr(renewable, "message_id", "?"), error)


# The processor and its reply sender, given the worker's client and session
# (closed before them): the composition root's, handed in by the entry.
ProcessorFactory = Callable[
    [ServiceBusClient, aiohttp.ClientSession, AgentSettings],
    tuple[RequestProcessor, ServiceBusReplySender],
]


async def serve(
    settings: AgentSettings,
    stop: asyncio.Event,
    on_ready: Callable[[], Any],
    processors: ProcessorFactory,
) -> None:
    access = require_servicebus(settings)
    async with aiohttp.ClientSession() as session, servicebus_client(access) as client:
        processor, replies = processors(client, session, settings)
        try:
            await AgentWorker(client, processor, settings).run(stop, on_ready)
        finally:
            await processor.close()
            await replies.close()
