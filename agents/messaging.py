"""From a delivered agent request to a sent reply and a settled message:
`RequestProcessor` makes the decisions once for both runners (the Functions
trigger and the standalone worker), each settling in its own way. The
settlement table: docs/adr/014-message-settlement.md.

Nothing is called for a request whose signature (domain.signing, under
AGENT_SIGNING_KEYS) does not verify first: a fencing token, an undo or a
charge is only honoured from the Scheduler. A refused request is
dead-lettered `ForgedRequest` or `UnknownStep` with one alert and no reply;
every reply is signed (ADR 017e, which also tells how an alert that cannot be
queued travels with a delayed copy)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver

from adapters import telemetry
from adapters.clock import SYSTEM_CLOCK, Clock
from adapters.servicebus import AGENT_REQUESTS_QUEUE, ServiceBusPublisher
from adapters.settlement import (
    INVALID_MESSAGE,
    PROCESSING_FAILED,
    RETRIES_EXHAUSTED,
    BackoffPolicy,
    BodyRefused,
    MessageGate,
    Settle,
    SettleKind,
    _alert_id,
    _alert_source,
    dead_letter_text,
    defuse_trace_headers,
    message_label,
    read_body,
)
from agents.agent import Agent, reply_event_id
from domain.boundary import readable_order_id
from domain.codec import decode, encode
from domain.errors import AlertNotQueued, TransientError, ValidationFailed
from domain.models import AgentReply, AgentRequest
from domain.signing import KeyRing, check_request, sign_reply
from domain.steps import UnknownStep

if TYPE_CHECKING:
    from reporting.alerts import Alerts

log = logging.getLogger(__name__)

MAX_DEAD_LETTER_DESCRIPTION = 1000

# Dead-letter reasons (and alert kinds) of requests that prove nothing.
FORGED_REQUEST = "ForgedRequest"
UNKNOWN_STEP = "UnknownStep"


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
    """Decode, verify, handle, reply, settle. `keys`: what requests must be
    signed with and replies are signed with."""

    def __init__(
        self,
        agent: Agent,
        replies: ReplySender,
        alerts: Alerts | None = None,
        policy: BackoffPolicy | None = None,
        *,
        keys: KeyRing,
        scheduler: ServiceBusPublisher | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`scheduler` sends the delayed copy of a refused request whose alert
        could not be queued (to agent-requests); without one, such a request
        is abandoned to the queue's own redelivery."""
        self._keys = keys
        self._agent = agent
        self._replies = replies
        self._alerts = alerts
        self._policy = policy or BackoffPolicy()
        self._clock = clock
        self._later = MessageGate(
            AGENT_REQUESTS_QUEUE,
            alerts,  # type: ignore[arg-type]  # unused by `later`
            scheduler,
            self._policy,
            clock,
        )

    async def close(self) -> None:
        """At shutdown: the alerts' open windows go as their aggregates."""
        if self._alerts is not None:
            await self._alerts.close()

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
            message=message,
            message_id=label,
            last_delivery=self._policy.is_last_delivery(message),
            # 1-based in the Functions runtime, 0-based on the wire: > 1 may be
            # late by one delivery, never early (Agent.handle relies on that).
            redelivered=(getattr(message, "delivery_count", None) or 0) > 1,
        )

    async def process(
        self,
        body: bytes | str,
        settlement: Settlement,
        *,
        message: Any = None,
        message_id: str | None = None,
        last_delivery: bool = False,
        redelivered: bool = False,
    ) -> SettleKind:
        """`message`: the received message of `body`, whose sequence number
        names its alert and delayed copies; `redelivered`: see Agent.handle."""
        body_bytes = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
        try:
            request = decode(AgentRequest, body)
        except ValidationFailed as exc:
            await self._dead_letter(
                settlement, INVALID_MESSAGE, exc.reason, message_id, readable_order_id(body)
            )
            return SettleKind.DEAD_LETTER
        refused = self._refusal(request)
        if refused is not None:
            reason, description = refused
            # A forgery goes with its alert; on the last delivery too, as a
            # delayed copy (when there is a received message to name one by).
            return await self._dead_letter(
                settlement,
                reason,
                description,
                message_id,
                request.OrderID,
                alert_required=message is not None or not last_delivery,
                message=message,
                body=body_bytes,
            )
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
            reply = sign_reply(self._keys, reply)
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

    def _refusal(self, request: AgentRequest) -> tuple[str, str] | None:
        """Why this request must not be acted on (reason, description), or
        None. The signature first: until it verifies, nothing the request
        says (its step, its fencing token) is believed."""
        what = (
            f"{request.Action} of step {request.Step!r} for order {request.OrderID} "
            f"(instance {request.InstanceId}, fencing token {request.FencingToken})"
        )
        why = check_request(self._keys, request)
        if why is not None:
            return FORGED_REQUEST, f"request {what}: signature {why}; nothing called"
        try:
            self._agent.steps.step_named(request.Step)
        except UnknownStep:
            return UNKNOWN_STEP, f"signed request {what}: no such step here; nothing called"
        return None

    async def _dead_letter(
        self,
        settlement: Settlement,
        reason: str,
        description: str,
        message_id: str | None,
        order_id: str | None,
        *,
        alert_required: bool = False,
        message: Any = None,
        body: bytes | None = None,
    ) -> SettleKind:
        """Dead-letter with one alert. With `alert_required`, while the alert
        cannot be queued, come back to the message later instead: a delayed
        copy (then complete); when no copy can be made, dead-letter it now
        with its alert held by this process (Alerts.hold)."""
        description = dead_letter_text(description, MAX_DEAD_LETTER_DESCRIPTION)
        # One alert per dead letter: redeliveries and delayed copies raise the
        # same id, named by the broker's sequence number, never the sender's.
        source = _alert_source(message, body) if message is not None else message_id
        if self._alerts is not None:
            try:
                await self._alerts.raise_alert(
                    reason,
                    description,
                    self._clock.now(),
                    order_id,
                    message_id=message_id,
                    queue=AGENT_REQUESTS_QUEUE,
                    alert_id=_alert_id(AGENT_REQUESTS_QUEUE, source, reason) if source else None,
                    required=alert_required,
                )
            except AlertNotQueued as exc:
                why = f"alert not queued: {exc}"
                later = (
                    await self._later.later(message, body, why, order_id)
                    if message is not None  # nothing to name a copy by
                    else Settle.dead_letter(reason, description, order_id)
                )
                if later.kind is SettleKind.COMPLETE:
                    log.warning(
                        "alert for agent request %s not queued, a delayed copy carries it: %s",
                        message_id,
                        exc,
                    )
                    await settlement.complete()
                    return SettleKind.COMPLETE
                # No copy: dead-lettered now, its alert held by this process
                # (Alerts.hold), not abandoned to deliveries that may be lost.
                self._alerts.hold(exc.alert, exc.alert_id)
        # Logged at INFO: the alert (aggregated by kind) is the operators' line.
        log.info("agent request %s dead-lettered %s: %s", message_id, reason, description)
        await settlement.dead_letter(reason, description)
        return SettleKind.DEAD_LETTER


class ServiceBusReplySender:
    """Sends replies to the responses queue with a stable MessageId, so the
    queue's duplicate detection drops a reply re-sent after a crash between
    sending and settling; through adapters.servicebus's publisher, which
    serialises the concurrent invocations' sends."""

    def __init__(
        self,
        client: ServiceBusClient,
        queue_name: str,
        send_timeout: float = 30.0,
        publisher: ServiceBusPublisher | None = None,
    ) -> None:
        self._publisher = publisher or ServiceBusPublisher(client, send_timeout)
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
