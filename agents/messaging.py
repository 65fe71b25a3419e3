"""From a delivered agent request to a sent reply and a settled message:
`RequestProcessor` makes the decisions once for both runners (the Functions
trigger and the standalone worker), each settling in its own way. The
settlement table: docs/adr/014-message-settlement.md."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver

from adapters import telemetry
from adapters.clock import SYSTEM_CLOCK
from adapters.servicebus import AGENT_REQUESTS_QUEUE, ServiceBusPublisher
from adapters.settlement import (
    INVALID_MESSAGE,
    PROCESSING_FAILED,
    RETRIES_EXHAUSTED,
    BackoffPolicy,
    BodyRefused,
    SettleKind,
    dead_letter_text,
    defuse_trace_headers,
    message_label,
    read_body,
)
from agents.agent import Agent, reply_event_id
from domain.boundary import readable_order_id
from domain.codec import decode, encode
from domain.errors import TransientError, ValidationFailed
from domain.models import AgentReply, AgentRequest

if TYPE_CHECKING:
    from reporting.alerts import Alerts

log = logging.getLogger(__name__)

MAX_DEAD_LETTER_DESCRIPTION = 1000


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

    def __init__(
        self,
        agent: Agent,
        replies: ReplySender,
        alerts: Alerts | None = None,
        policy: BackoffPolicy | None = None,
    ) -> None:
        self._agent = agent
        self._replies = replies
        self._alerts = alerts
        self._policy = policy or BackoffPolicy()

    async def process_message(self, message: Any, settlement: Settlement) -> SettleKind:
        """A received message of any AMQP body kind, in a span that continues
        the trace of the activity that sent it (its `traceparent`)."""
        with telemetry.consume(
            "agent", message, **{"messaging.destination.name": AGENT_REQUESTS_QUEUE}
        ):
            disposition = await self._process_message(message, settlement)
            telemetry.annotate(settlement=disposition.value)
            return disposition

    async def _process_message(self, message: Any, settlement: Settlement) -> SettleKind:
        label = message_label(message)
        try:
            body = read_body(message)
        except BodyRefused as exc:
            await self._dead_letter(settlement, INVALID_MESSAGE, exc.reason, label, None)
            return SettleKind.DEAD_LETTER
        return await self.process(
            body,
            settlement,
            message_id=label,
            last_delivery=self._policy.is_last_delivery(message),
            # 1-based in the Functions runtime, 0-based on the wire (the
            # standalone worker): > 1 is exact for the one and only late by one
            # delivery for the other, never early (a first delivery may be a
            # copy of a request that already answered, Agent.handle).
            redelivered=(getattr(message, "delivery_count", None) or 0) > 1,
        )

    async def process(
        self,
        body: bytes | str,
        settlement: Settlement,
        *,
        message_id: str | None = None,
        last_delivery: bool = False,
        redelivered: bool = False,
    ) -> SettleKind:
        """`redelivered`: the message's delivery count is above 1 (Agent.handle)."""
        try:
            request = decode(AgentRequest, body)
        except ValidationFailed as exc:
            await self._dead_letter(
                settlement, INVALID_MESSAGE, exc.reason, message_id, readable_order_id(body)
            )
            return SettleKind.DEAD_LETTER
        telemetry.annotate(
            **{
                telemetry.ORDER_ID: request.OrderID,
                telemetry.INSTANCE_ID: request.InstanceId,
                "step": request.Step,
                "step.action": request.Action,
            }
        )
        try:
            reply = await self._agent.handle(request, redelivered=redelivered)
            telemetry.annotate(**{"reply.outcome": reply.Outcome.value})
            await self._replies.send(reply, reply_event_id(request))
        except TransientError as exc:
            if last_delivery:
                await self._dead_letter(
                    settlement,
                    RETRIES_EXHAUSTED,
                    f"last delivery and the reply still could not be sent: {exc}",
                    message_id,
                    request.OrderID,
                )
                return SettleKind.DEAD_LETTER
            log.warning("could not send the reply to %s, abandoning: %s", message_id, exc)
            await settlement.abandon()
            return SettleKind.ABANDON
        except Exception as exc:  # noqa: BLE001 - nothing ends silently
            log.exception("unexpected failure handling agent request %s", message_id)
            await self._dead_letter(
                settlement,
                PROCESSING_FAILED,
                f"handler raised {type(exc).__name__}: {exc}",
                message_id,
                request.OrderID,
            )
            return SettleKind.DEAD_LETTER
        await settlement.complete()
        return SettleKind.COMPLETE

    async def _dead_letter(
        self,
        settlement: Settlement,
        reason: str,
        description: str,
        message_id: str | None,
        order_id: str | None,
    ) -> None:
        description = dead_letter_text(description, MAX_DEAD_LETTER_DESCRIPTION)
        log.error("agent request %s dead-lettered %s: %s", message_id, reason, description)
        if self._alerts is not None:
            await self._alerts.raise_alert(
                reason,
                description,
                SYSTEM_CLOCK.now(),
                order_id,
                message_id=message_id,
                queue=AGENT_REQUESTS_QUEUE,
            )
        await settlement.dead_letter(reason, description)


class ServiceBusReplySender:
    """Sends replies to the responses queue with a stable MessageId, so the
    queue's duplicate detection drops a reply re-sent after a crash between
    sending and settling. Sends through the app's one Service Bus publisher
    (adapters.servicebus): one link kept open, one send at a time per link and
    a timeout, because the agent's invocations run concurrently and concurrent
    sends on one aio sender hang inside the SDK."""

    def __init__(
        self, client: ServiceBusClient, queue_name: str, send_timeout: float = 30.0
    ) -> None:
        self._publisher = ServiceBusPublisher(client, send_timeout)
        self._queue_name = queue_name

    async def send(self, reply: AgentReply, message_id: str) -> None:
        await self._publisher.send(
            self._queue_name,
            encode(reply),
            message_id,
            {"SchemaVersion": reply.SchemaVersion},
            subject=reply.EventName,
        )

    async def close(self) -> None:
        await self._publisher.close()


class ReceiverSettlement:
    """Settlement through an azure.servicebus.aio receiver (the worker)."""

    def __init__(self, receiver: ServiceBusReceiver, message: Any) -> None:
        self._receiver = receiver
        self._message = message
        defuse_trace_headers(message)  # else settling raises with tracing on

    async def complete(self) -> None:
        await self._receiver.complete_message(self._message)

    async def abandon(self) -> None:
        await self._receiver.abandon_message(self._message)

    async def dead_letter(self, reason: str, description: str) -> None:
        await self._receiver.dead_letter_message(
            self._message, reason=reason, error_description=description
        )


def message_body(message: Any) -> bytes:
    """The body of a received message as bytes (any AMQP body kind; see
    adapters.settlement.read_body). Raises BodyRefused for a body that cannot
    carry JSON text."""
    return read_body(message)
