"""Service Bus publishing through azure.servicebus.aio: one client per
process, one sender per queue, opened on first use. A missing queue or an
oversize message is permanent; a busy, full or unreachable namespace
transient. Every message carries its "send" span's trace context (ADR 015)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient, ServiceBusSender
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusError,
)

from adapters import telemetry
from adapters.settings import ServiceBusAccess, SettingsError, azure_credential
from domain.errors import PermanentError, TransientError

log = logging.getLogger(__name__)

# The app's fixed queues, named once here (infra/ declares the same names; the
# ingress and reply queues are per application and come from settings).
AGENT_REQUESTS_QUEUE = "agent-requests"
AGENT_RESPONSES_QUEUE = "agent-responses"
ALERTS_QUEUE = "alerts"

_PERMANENT = (
    MessagingEntityNotFoundError,
    MessagingEntityDisabledError,
    MessageSizeExceededError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
)


def servicebus_client(access: ServiceBusAccess) -> ServiceBusClient:
    """An aio client from the host-style connection setting: a connection
    string locally, the app's identity in Azure."""
    if access.connection_string:
        return ServiceBusClient.from_connection_string(access.connection_string)
    if not access.fully_qualified_namespace:
        raise SettingsError(
            "ServiceBusConnection: neither a connection string nor __fullyQualifiedNamespace"
        )
    return ServiceBusClient(access.fully_qualified_namespace, azure_credential(access.client_id))


LINKS_PER_QUEUE = 4


class ServiceBusPublisher:
    """Implements adapters.ports.MessagePublisher. `locks` makes the locks
    that serialise link opens and the sends on one link, `wait_for` bounds a
    send by its timeout (the simulation hands in a no-op lock and an inline await).

    Up to `links` senders (AMQP links) per queue, each sending one message at
    a time: a send waits for the broker's acknowledgement, so with one link a
    process sent at most one message per round trip to a queue, and under
    load the Scheduler's activities queued behind that lock (issue 44: 236 ms
    a send on the local stack at 200 orders in flight, the lock found taken
    in 87 % of sends). A send takes the link with the fewest sends on it or
    waiting for it (the first of them)."""

    def __init__(
        self,
        client: ServiceBusClient,
        send_timeout: float = 30.0,
        *,
        locks: Callable[[], AbstractAsyncContextManager[Any]] = asyncio.Lock,
        wait_for: Callable[[Awaitable[Any], float], Awaitable[Any]] = asyncio.wait_for,
        links: int = LINKS_PER_QUEUE,
    ) -> None:
        self._client = client
        self._senders: dict[tuple[str, int], ServiceBusSender] = {}
        self._locks = locks
        self._wait_for = wait_for
        self._send_locks: dict[tuple[str, int], AbstractAsyncContextManager[Any]] = {}
        self._lock = locks()
        self._send_timeout = send_timeout
        self._links = max(1, links)
        self._busy: dict[tuple[str, int], int] = {}  # sends on a link or waiting for it

    async def _sender(self, link: tuple[str, int]) -> ServiceBusSender:
        # Open each link under the lock: concurrent first sends on one unopened
        # sender race inside the SDK ("'NoneType' object has no attribute
        # 'create_sender_link'"), and so do concurrent opens on one connection.
        queue = link[0]
        async with self._lock:
            sender = self._senders.get(link)
            if sender is None:
                sender = self._client.get_queue_sender(queue)
                try:
                    await sender.__aenter__()
                except _PERMANENT as exc:
                    raise PermanentError(f"cannot open a sender to queue {queue!r}: {exc}") from exc
                except ServiceBusError as exc:
                    raise TransientError(f"cannot open a sender to queue {queue!r}: {exc}") from exc
                self._senders[link] = sender
            return sender

    async def send(
        self,
        queue: str,
        body: bytes,
        message_id: str,
        application_properties: dict[str, Any] | None = None,
        subject: str | None = None,
    ) -> None:
        await self._publish(queue, body, message_id, application_properties, subject=subject)

    async def schedule(
        self,
        queue: str,
        body: bytes,
        message_id: str,
        enqueue_at: datetime,
        application_properties: dict[str, Any] | None = None,
    ) -> None:
        """Send a message that becomes visible at `enqueue_at` (a back-off
        retry of a received message: see adapters.settlement.MessageGate)."""
        await self._publish(
            queue, body, message_id, application_properties, scheduled_enqueue_time_utc=enqueue_at
        )

    async def _publish(
        self,
        queue: str,
        body: bytes,
        message_id: str,
        application_properties: dict[str, Any] | None,
        **extra: Any,
    ) -> None:
        """One JSON message, in a producer span whose context rides in its properties."""
        with self._producer_span(queue, message_id, application_properties):
            message = ServiceBusMessage(
                body,
                message_id=message_id,
                content_type="application/json",
                application_properties=telemetry.message_properties(application_properties),
                **extra,
            )
            await self._send(queue, message)

    @staticmethod
    def _producer_span(queue: str, message_id: str, properties: dict[str, Any] | None):
        """The "send" span whose context the message carries."""
        order_id = (properties or {}).get("OrderID")
        return telemetry.span(
            f"send {queue}",
            telemetry.SpanKind.PRODUCER,
            **{
                "messaging.system": "servicebus",
                "messaging.destination.name": queue,
                "messaging.message.id": message_id,
                telemetry.ORDER_ID: order_id if isinstance(order_id, str) else None,
            },
        )

    async def _send(self, queue: str, message: ServiceBusMessage) -> None:
        message_id = message.message_id
        link = min(((queue, k) for k in range(self._links)), key=lambda c: self._busy.get(c, 0))
        self._busy[link] = self._busy.get(link, 0) + 1
        try:
            await self._send_on(link, message)
        finally:
            self._busy[link] -= 1
        log.debug("sent %s to %s", message_id, queue)

    async def _send_on(self, link: tuple[str, int], message: ServiceBusMessage) -> None:
        queue = link[0]
        sender = await self._sender(link)
        # One send at a time per link: concurrent sends on one aio sender can
        # hang inside the SDK (seen as activities that never return), and a
        # send that does not finish in time is a transient failure, not a hang.
        lock = self._send_locks.setdefault(link, self._locks())
        try:
            async with lock:
                await self._wait_for(
                    sender.send_messages(message, timeout=self._send_timeout),
                    self._send_timeout + 5,
                )
        except TimeoutError as exc:
            await self._forget(link)
            raise TransientError(f"sending to queue {queue!r} timed out") from exc
        except _PERMANENT as exc:
            await self._forget(link)
            raise PermanentError(f"cannot send to queue {queue!r}: {exc}") from exc
        except ServiceBusError as exc:
            await self._forget(link)
            raise TransientError(f"sending to queue {queue!r} failed: {exc}") from exc

    async def _forget(self, link: tuple[str, int]) -> None:
        # A sender whose link failed may be unusable; the next send opens a new one.
        async with self._lock:
            sender = self._senders.pop(link, None)
        if sender is not None:
            try:
                await sender.close()
            except Exception:  # noqa: BLE001 - closing a broken link may itself fail
                log.debug("closing sender for %s failed", link[0], exc_info=True)

    async def close(self) -> None:
        for link in list(self._senders):
            await self._forget(link)
        await self._client.close()
