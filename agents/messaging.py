"""From a delivered request message to a sent reply and a settled message.

Both runners (the Functions trigger and the standalone worker) hand each
delivery to `RequestProcessor.process` with their own way of settling it, so
the decisions are made once, here, and tested without a broker:

| what happened                         | settlement                          |
|---------------------------------------|-------------------------------------|
| body is not a valid AgentRequest      | dead-letter, reason InvalidMessage  |
| reply sent (ok, transient, permanent) | complete                            |
| reply could not be sent               | abandon: redelivered; the retry     |
|                                       | re-calls with the same key (a       |
|                                       | replay) or, past the deadline, not  |
|                                       | at all; the reply's stable id makes |
|                                       | a second copy a duplicate           |
| unexpected error                      | abandon (dead-lettered by the queue |
|                                       | after MaxDeliveryCount)             |
"""

from __future__ import annotations

import asyncio
import logging
from enum import StrEnum
from typing import Any, Protocol

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver, ServiceBusSender
from azure.servicebus.exceptions import ServiceBusError

from adapters.settings import ServiceBusAccess
from agents.agent import Agent, reply_event_id
from domain.codec import decode, encode
from domain.errors import TransientError, ValidationFailed
from domain.models import AgentReply, AgentRequest

log = logging.getLogger(__name__)

INVALID_MESSAGE = "InvalidMessage"
MAX_DEAD_LETTER_DESCRIPTION = 1000


class Disposition(StrEnum):
    COMPLETED = "completed"
    ABANDONED = "abandoned"
    DEAD_LETTERED = "dead-lettered"


class Settlement(Protocol):
    """How the runner settles the message being processed."""

    async def complete(self) -> None: ...

    async def abandon(self) -> None: ...

    async def dead_letter(self, reason: str, description: str) -> None: ...


class ReplySender(Protocol):
    async def send(self, reply: AgentReply, message_id: str) -> None:
        """Raises TransientError when the reply could not be sent."""
        ...


class RequestProcessor:
    """Decode, handle, reply, settle. Receives the Agent and the reply sender."""

    def __init__(self, agent: Agent, replies: ReplySender) -> None:
        self._agent = agent
        self._replies = replies

    async def process(
        self, body: bytes | str, settlement: Settlement, *, message_id: str | None = None
    ) -> Disposition:
        try:
            request = decode(AgentRequest, body)
        except ValidationFailed as exc:
            log.error("agent request %s is invalid, dead-lettering: %s", message_id, exc.reason)
            await settlement.dead_letter(INVALID_MESSAGE, exc.reason[:MAX_DEAD_LETTER_DESCRIPTION])
            return Disposition.DEAD_LETTERED
        try:
            reply = await self._agent.handle(request)
            await self._replies.send(reply, reply_event_id(request))
        except TransientError as exc:
            log.warning("could not send the reply to %s, abandoning: %s", message_id, exc)
            await settlement.abandon()
            return Disposition.ABANDONED
        except Exception:
            log.exception("unexpected failure handling agent request %s, abandoning", message_id)
            await settlement.abandon()
            return Disposition.ABANDONED
        await settlement.complete()
        return Disposition.COMPLETED


class ServiceBusReplySender:
    """Sends replies to the responses queue with a stable MessageId, so the
    queue's duplicate detection drops a reply re-sent after a crash between
    sending and settling. Receives its (aio) client; opens one sender lazily
    and keeps it (links are expensive to open per message)."""

    def __init__(self, client: ServiceBusClient, queue_name: str) -> None:
        self._client = client
        self._queue_name = queue_name
        self._sender: ServiceBusSender | None = None
        self._lock = asyncio.Lock()

    async def send(self, reply: AgentReply, message_id: str) -> None:
        message = ServiceBusMessage(
            encode(reply),
            message_id=message_id,
            content_type="application/json",
            subject=reply.EventName,
            application_properties={"SchemaVersion": reply.SchemaVersion},
        )
        try:
            sender = await self._open()
            await sender.send_messages(message)
        except ServiceBusError as exc:
            await self._reset()
            raise TransientError(f"sending reply {message_id}: {exc}") from exc

    async def _open(self) -> ServiceBusSender:
        async with self._lock:
            if self._sender is None:
                sender = self._client.get_queue_sender(self._queue_name)
                await sender.__aenter__()
                self._sender = sender
            return self._sender

    async def _reset(self) -> None:
        # A failed link is not reused: the next send opens a fresh one.
        async with self._lock:
            sender, self._sender = self._sender, None
        if sender is not None:
            try:
                await sender.close()
            except Exception:  # noqa: BLE001 - closing a broken link may fail too
                log.debug("closing a failed reply sender", exc_info=True)

    async def close(self) -> None:
        await self._reset()


class ReceiverSettlement:
    """Settlement through an azure.servicebus.aio receiver (the worker)."""

    def __init__(self, receiver: ServiceBusReceiver, message: Any) -> None:
        self._receiver = receiver
        self._message = message

    async def complete(self) -> None:
        await self._receiver.complete_message(self._message)

    async def abandon(self) -> None:
        await self._receiver.abandon_message(self._message)

    async def dead_letter(self, reason: str, description: str) -> None:
        await self._receiver.dead_letter_message(
            self._message, reason=reason, error_description=description
        )


def servicebus_client(access: ServiceBusAccess) -> ServiceBusClient:
    """An aio client from the host-style connection setting: a connection
    string locally, identity-based (no key in settings) in Azure."""
    if access.connection_string:
        return ServiceBusClient.from_connection_string(access.connection_string)
    from azure.identity.aio import DefaultAzureCredential

    assert access.fully_qualified_namespace
    return ServiceBusClient(access.fully_qualified_namespace, DefaultAzureCredential())


def message_body(message: Any) -> bytes:
    """The body of a received message as bytes, from the SDK's
    ServiceBusReceivedMessage (a data body is an iterable of byte chunks) or
    azure.functions.ServiceBusMessage (get_body())."""
    if hasattr(message, "get_body"):
        return bytes(message.get_body())
    body = message.body
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        return b"".join(bytes(chunk) for chunk in body)
    except TypeError:
        # An AMQP value or sequence body, not data: not an AgentRequest. An
        # empty body fails decoding and is dead-lettered as InvalidMessage.
        return b""
