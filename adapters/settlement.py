"""What to do with a received Service Bus message (`Settle`), decided by a
handler and carried out by `MessageGate`, the one path every message to Submit
and the reply bridge takes, so that no message ends silently: body reading,
delayed retries, dead letters with alerts. Why: docs/adr/014-message-settlement.md."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from adapters.clock import SYSTEM_CLOCK, Clock
from domain.boundary import readable_order_id
from domain.errors import AlertNotQueued
from domain.models import mask_card_numbers

if TYPE_CHECKING:  # the gate loads neither the SDK nor reporting
    from adapters.servicebus import ServiceBusPublisher
    from reporting.alerts import Alerts

log = logging.getLogger(__name__)

INVALID_MESSAGE = "InvalidMessage"
PROCESSING_FAILED = "ProcessingFailed"
RETRIES_EXHAUSTED = "RetriesExhausted"

# Properties of a rescheduled copy: its retry number and the chain's first
# message id. A client can set either, so neither names anything (copies and
# alerts are named by the broker's sequence number): a client that sets the
# count only shortens its own budget.
RETRY_PROPERTY = "x-retry-count"
ORIGINAL_ID_PROPERTY = "x-original-message-id"

MAX_DESCRIPTION = 1024
MAX_MESSAGE_ID = 128  # Service Bus's limit


class SettleKind(StrEnum):
    COMPLETE = "complete"
    ABANDON = "abandon"
    DEAD_LETTER = "dead_letter"
    RETRY = "retry"  # transient: try again after a back-off delay


@dataclass(frozen=True)
class Settle:
    kind: SettleKind
    reason: str | None = None
    description: str | None = None
    order_id: str | None = None

    @classmethod
    def complete(cls, order_id: str | None = None) -> Settle:
        return cls(SettleKind.COMPLETE, order_id=order_id)

    @classmethod
    def abandon(cls, description: str, order_id: str | None = None) -> Settle:
        return cls(SettleKind.ABANDON, description=description, order_id=order_id)

    @classmethod
    def retry(cls, description: str, order_id: str | None = None) -> Settle:
        return cls(SettleKind.RETRY, description=description[:MAX_DESCRIPTION], order_id=order_id)

    @classmethod
    def dead_letter(cls, reason: str, description: str, order_id: str | None = None) -> Settle:
        return cls(SettleKind.DEAD_LETTER, reason, dead_letter_text(description), order_id)


def dead_letter_text(text: str, limit: int = MAX_DESCRIPTION) -> str:
    """A dead-letter description as ASCII, card numbers masked (ADR 014): the
    SDK's AMQP disposition refuses other text, which would turn a dead letter
    into a silent redelivery."""
    return mask_card_numbers(text).encode("ascii", "backslashreplace").decode("ascii")[:limit]


# --- bodies ------------------------------------------------------------------------------


class BodyRefused(ValueError):
    """The message's body cannot carry contract JSON; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _kind(message: Any) -> str:
    body_type = getattr(message, "body_type", None)
    return str(getattr(body_type, "value", body_type) or "data").lower()


def _text_chunk(chunk: Any, where: str) -> bytes:
    if isinstance(chunk, bytes | bytearray | memoryview):
        return bytes(chunk)
    if isinstance(chunk, str):
        return chunk.encode("utf-8", "surrogatepass")
    raise BodyRefused(
        f"{where} holds an AMQP {type(chunk).__name__}, not JSON text; "
        "send the contract as JSON in a data body (or a string value)"
    )


def read_body(message: Any, max_bytes: int = 1024 * 1024) -> bytes:
    """The JSON text a received message carries, from any AMQP body kind (data
    sections, a binary or string value, sequences of binary or strings);
    anything else is refused naming what was found. Works on the SDK's
    ServiceBusReceivedMessage and on azure.functions.ServiceBusMessage."""
    if hasattr(message, "get_body") and not hasattr(message, "body_type"):
        return bytes(message.get_body())
    kind = _kind(message)
    body = message.body
    if kind == "value":
        if body is None:
            raise BodyRefused("AMQP value body is null, not JSON text")
        return _text_chunk(body, "AMQP value body")
    out = bytearray()
    if isinstance(body, bytes | bytearray | memoryview | str):
        body = [body]
    for section in body if isinstance(body, Iterable) else [body]:
        if kind == "sequence":
            if not isinstance(section, list | tuple):
                raise BodyRefused(
                    f"AMQP sequence section is a {type(section).__name__}, not a list"
                )
            for item in section:
                out += _text_chunk(item, "AMQP sequence body")
        else:
            out += _text_chunk(section, "AMQP data body")
        if len(out) > max_bytes:
            raise BodyRefused(f"body is over {max_bytes} bytes")
    return bytes(out)


# --- message facts ---------------------------------------------------------------------


def _prop(message: Any, name: str) -> Any:
    props = getattr(message, "application_properties", None) or {}
    for key, value in props.items():
        if (key.decode("utf-8", "replace") if isinstance(key, bytes) else key) == name:
            return value
    return None


def retry_count(message: Any) -> int:
    value = _prop(message, RETRY_PROPERTY)
    return value if type(value) is int and value >= 0 else 0


def message_label(message: Any) -> str:
    """The message id, or (a message may be sent without one) its sequence number."""
    mid = getattr(message, "message_id", None)
    if mid:
        return str(mid)
    return f"sequence-number:{getattr(message, 'sequence_number', '?')}"


def _broker_name(message: Any, body: bytes | None) -> str:
    """What names `message` for our own ids: its sequence number (the
    broker's, the same on every redelivery), never an id the sender chose;
    without one (no broker delivered it), a digest of its id and body."""
    seq = getattr(message, "sequence_number", None)
    if type(seq) is int and seq >= 0:
        return f"seq-{seq}"
    digest = hashlib.sha256(message_label(message).encode("utf-8", "surrogatepass"))
    digest.update(body or b"")
    return f"sha-{digest.hexdigest()[:48]}"


# retry/<root>/<retry>/<the delivery that made it>; the shorter
# retry/<root>/<retry> is read too.
_COPY_ID = re.compile(r"^retry/(seq-\d+)/\d+(?:/[0-9A-Za-z.-]+)?$")


def _delivery_count(message: Any) -> int:
    count = getattr(message, "delivery_count", None)
    return count if type(count) is int and count >= 0 else 0


def _delivery_name(message: Any) -> str:
    """What tells this delivery of a message from every other: a digest of
    its lock token (new each delivery; digested, so a copy's id carries no
    live lock), else its delivery count. Not the count alone: the Functions
    binding counts from 1 and an SDK receiver from 0, and both consume
    agent-requests."""
    token = getattr(message, "lock_token", None)
    if token:
        return hashlib.sha256(str(token).encode()).hexdigest()[:16]
    return str(_delivery_count(message))


def _retry_message_id(message: Any, attempt: int, body: bytes | None = None) -> str:
    """The back-off copy one delivery of `message` makes: named by the
    message first copied, the retry it is, and the delivery making it, so a
    schedule repeated within one delivery is a duplicate and a redelivery's
    copy is not (docs/adr/021i-copy-per-delivery.md)."""
    own = _broker_name(message, body)
    copy = _COPY_ID.match(str(getattr(message, "message_id", None) or ""))
    root = copy.group(1) if copy is not None else own
    delivery = f"{own}.{_delivery_name(message)}"
    name = f"retry/{root}/{attempt}/{delivery}"
    if len(name) > MAX_MESSAGE_ID:  # two digest names (no broker numbered them) and a token
        name = f"retry/{root}/{attempt}/{hashlib.sha256(delivery.encode()).hexdigest()[:40]}"
    return name


# --- the gate ------------------------------------------------------------------------


@dataclass(frozen=True)
class BackoffPolicy:
    """`delays[n]` seconds before retry n+1. `max_delivery_count` is the
    queue's MaxDeliveryCount: a delivery whose count reaches it - 1 is the
    last (the count is 0-based on the wire; a 1-based runtime makes us stop
    one delivery early, never late)."""

    delays: tuple[float, ...] = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0)
    max_delivery_count: int = 5

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> BackoffPolicy:
        env = dict(os.environ if env is None else env)
        delays = cls.delays
        raw = env.get("REDELIVERY_DELAYS_SECONDS", "").strip()
        if raw:
            delays = tuple(float(x) for x in raw.split(","))
        return cls(delays, int(env.get("MAX_DELIVERY_COUNT", cls.max_delivery_count)))

    def is_last_delivery(self, message: Any) -> bool:
        count = getattr(message, "delivery_count", None) or 0
        return count >= self.max_delivery_count - 1


Handler = Callable[[bytes], Awaitable[Settle]]


class MessageGate:
    """Runs one handler on one queue's messages and settles each exactly once."""

    def __init__(
        self,
        queue: str,
        alerts: Alerts,
        scheduler: ServiceBusPublisher | None,
        policy: BackoffPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
        run_sync: RunSync = asyncio.to_thread,
    ) -> None:
        self.queue = queue
        self._run_sync = run_sync
        self._alerts = alerts
        self._scheduler = scheduler
        self._policy = policy or BackoffPolicy()
        self._clock = clock

    async def decide(self, message: Any, handle: Handler) -> tuple[Settle, bytes | None]:
        """The final outcome for `message` (never RETRY), without settling."""
        body: bytes | None = None
        try:
            body = read_body(message)
        except BodyRefused as exc:
            return Settle.dead_letter(INVALID_MESSAGE, exc.reason), None
        except Exception as exc:  # noqa: BLE001 - an SDK body we do not understand
            return Settle.dead_letter(INVALID_MESSAGE, f"body unreadable: {_name(exc)}"), None
        try:
            outcome = await handle(body)
        except Exception as exc:  # noqa: BLE001 - the point: nothing ends silently
            log.exception("%s message %s: handler failed", self.queue, message_label(message))
            outcome = Settle.dead_letter(
                PROCESSING_FAILED, f"handler raised {_name(exc)}", readable_order_id(body)
            )
        if outcome.kind is SettleKind.ABANDON:
            outcome = Settle.retry(outcome.description or "abandoned", outcome.order_id)
        if outcome.kind is SettleKind.RETRY:
            outcome = await self._retry(message, body, outcome)
        if outcome.kind is SettleKind.DEAD_LETTER and outcome.order_id is None:
            outcome = replace(outcome, order_id=readable_order_id(body))
        return outcome, body

    async def run(self, message: Any, actions: Any, handle: Handler) -> Settle:
        outcome, body = await self.decide(message, handle)
        if outcome.kind is SettleKind.DEAD_LETTER:
            try:
                await self.alert(message, outcome, body)
            except AlertNotQueued as exc:
                # A dead letter goes with its alert: a delayed copy comes back to
                # it; without one, the alert is held by this process (ADR 014).
                later = await self._retry(
                    message, body, Settle.retry(f"alert not queued: {exc}", outcome.order_id)
                )
                if later.kind is SettleKind.COMPLETE:
                    outcome = later
                else:
                    self._alerts.hold(exc.alert, exc.alert_id)
        log.info(
            "%s message %s (delivery %s): %s %s",
            self.queue,
            message_label(message),
            getattr(message, "delivery_count", None),
            outcome.kind.value,
            outcome.reason or "",
            extra={"order_id": outcome.order_id},
        )
        await settle(message, actions, outcome, run_sync=self._run_sync)
        return outcome

    async def alert(self, message: Any, outcome: Settle, body: bytes | None = None) -> None:
        reason = outcome.reason or PROCESSING_FAILED
        await self._alerts.raise_alert(
            reason,
            outcome.description or "",
            self._clock.now(),
            outcome.order_id,
            message_id=message_label(message),
            queue=self.queue,
            alert_id=_alert_id(self.queue, _alert_source(message, body), reason),
            required=True,
        )

    async def later(
        self, message: Any, body: bytes | None, description: str, order_id: str | None = None
    ) -> Settle:
        """Come back to `message` later, on the back-off schedule: complete
        (a delayed copy is scheduled), abandon (the copy could not be sent:
        the queue redelivers), or dead-letter RetriesExhausted (the schedule
        is spent, or this is the last delivery and no copy could be sent).
        For a caller that settles on its own (the agents' RequestProcessor)."""
        return await self._retry(message, body, Settle.retry(description, order_id))

    async def _retry(self, message: Any, body: bytes | None, outcome: Settle) -> Settle:
        done = retry_count(message)
        delays = self._policy.delays
        if done >= len(delays):
            return Settle.dead_letter(
                RETRIES_EXHAUSTED,
                f"still failing after {done} retries over {sum(delays):.0f}s: {outcome.description}",
                outcome.order_id,
            )
        if self._scheduler is not None and body is not None:
            enqueue_at = self._clock.now() + timedelta(seconds=delays[done])
            try:
                await self._scheduler.schedule(
                    self.queue,
                    body,
                    _retry_message_id(message, done + 1, body),
                    enqueue_at,
                    {
                        RETRY_PROPERTY: done + 1,
                        ORIGINAL_ID_PROPERTY: str(
                            _prop(message, ORIGINAL_ID_PROPERTY) or message_label(message)
                        ),
                    },
                )
                log.warning(
                    "%s message %s: %s; retry %d scheduled in %.1fs",
                    self.queue,
                    message_label(message),
                    outcome.description,
                    done + 1,
                    delays[done],
                )
                return Settle.complete(outcome.order_id)
            except Exception as exc:  # noqa: BLE001 - fall back to the queue's own redelivery
                log.warning(
                    "scheduling a retry of %s failed: %s", message_label(message), _name(exc)
                )
        if self._policy.is_last_delivery(message):
            return Settle.dead_letter(
                RETRIES_EXHAUSTED,
                f"last delivery and no retry could be scheduled: {outcome.description}",
                outcome.order_id,
            )
        return Settle.abandon(outcome.description or "", outcome.order_id)


def _alert_source(message: Any, body: bytes | None = None) -> str:
    """What an alert about `message` is named by: its sequence number, or a
    copy's original's (`retry/seq-N/k`), with the body's digest, so the
    original and its copies alert once between them, and a sender who names
    its message like a copy cannot silence another message's alert. From a
    message no broker numbered: its id."""
    mid = str(getattr(message, "message_id", None) or "")
    copy = _COPY_ID.match(mid)
    seq = getattr(message, "sequence_number", None)
    if copy is not None:
        source = copy.group(1)
    elif type(seq) is int and seq >= 0:
        source = f"seq-{seq}"
    else:
        return message_label(message)
    if body is None:
        return source
    return f"{source}/{hashlib.sha256(body).hexdigest()[:16]}"


def _alert_id(queue: str, original_id: str, reason: str) -> str:
    """One stable alert id per dead-lettered message (a message id is at most
    128 characters, so a long one is hashed)."""
    alert_id = f"alert/{queue}/{original_id}/{reason}"
    if len(alert_id) <= 128:
        return alert_id
    return f"alert/{queue}/{hashlib.sha256(alert_id.encode('utf-8', 'surrogatepass')).hexdigest()}"


def _name(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}"[:600] if text else type(exc).__name__


_TRACE_HEADERS = frozenset({"traceparent", "tracestate", "Diagnostic-Id"})


def defuse_trace_headers(message: Any) -> None:
    """Drop client-set trace headers the SDK cannot read from our copy of the
    message: with tracing on, azure-servicebus decodes `traceparent`,
    `tracestate` and `Diagnostic-Id` as ASCII on every settlement, so a
    non-ASCII one makes every settlement raise. Settlement sends no properties."""
    props = getattr(message, "application_properties", None)
    if not isinstance(props, dict):
        return
    for key in list(props):
        name = key.decode("utf-8", "replace") if isinstance(key, bytes | bytearray) else key
        if name not in _TRACE_HEADERS:
            continue
        value = props[key]
        try:
            if isinstance(value, bytes | bytearray):
                value.decode("ascii")
            elif isinstance(value, str):
                value.encode("ascii")
            else:
                raise TypeError
        except (UnicodeError, TypeError):
            log.warning(
                "dropping an unreadable %s header from message %s", name, message_label(message)
            )
            del props[key]


# How a synchronous settlement call is run off the event loop: a worker thread
# (asyncio.to_thread), or inline where the actions are in memory (the simulation).
RunSync = Callable[..., Awaitable[Any]]


async def settle(
    message: Any, actions: Any, outcome: Settle, *, run_sync: RunSync = asyncio.to_thread
) -> None:
    """Carry out `outcome` through the binding's (synchronous) actions, off the loop."""
    defuse_trace_headers(message)
    if outcome.kind is SettleKind.COMPLETE:
        await run_sync(actions.complete, message)
    elif outcome.kind is SettleKind.DEAD_LETTER:
        await run_sync(
            actions.deadletter,
            message,
            deadletter_reason=outcome.reason,
            deadletter_error_description=outcome.description,
        )
    else:
        await run_sync(actions.abandon, message)
