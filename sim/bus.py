"""In-memory Service Bus queues with the rules the product depends on: peek-lock
with a lock that the host renews while the handler runs (and that a fault can
expire), abandon with immediate redelivery, delivery count up to max delivery
then the dead-letter queue with a reason, duplicate detection on MessageId
within a window, and scheduled (delayed) delivery.

Below the product's adapters (issue 21): `SimServiceBusClient` is the
azure.servicebus.aio client the product's own `ServiceBusPublisher` (and the
agents' `ServiceBusReplySender`) send through, `SimActions` the
message-actions object the Service Bus triggers settle with (the agents'
`FunctionsSettlement` over it, triggers/agents.py), `SimReceiver` the receiver the standalone
worker's `ReceiverSettlement` settles with. Faults are raised as the SDK
raises them (ServiceBusConnectionError, MessageLockLostError,
OperationTimeoutError), so the adapters' own translation runs.
`SimPublisher`, `SimReplySender` and `SimSettlement` are the older fakes of
the ports above the adapters (kept for tests that build a port directly)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    ServiceBusQuotaExceededError,
)

from adapters.settlement import _delivery_name
from devstack.servicebus.config import QueueSettings, load_config
from domain.codec import encode
from domain.errors import TransientError

from .world import World

DUPLICATE_WINDOW = timedelta(minutes=10)
LOCK_DURATION = timedelta(seconds=30)
MAX_DELIVERY = 10
DEPLOYED_CONFIG = Path(__file__).parents[1] / "devstack" / "servicebus" / "Config.json"


@dataclass(frozen=True)
class QueueRules:
    """What a queue does with a message, as deployed: devstack/servicebus/Config.json,
    which tests/infra keeps equal to the Bicep. A queue the file does not name
    (an application's queue made up by a test) gets the reply queues' rules."""

    dedup: bool = True
    window: timedelta = DUPLICATE_WINDOW
    max_delivery: int = MAX_DELIVERY
    # The queue's DefaultMessageTimeToLive. The bus does not expire messages
    # (an 8-day whole-app outage keeps them all); checks use it to tell what
    # Service Bus would have expired first (`Bus.outlived_ttl`). None: never.
    ttl: timedelta | None = None


@functools.cache
def deployed_rules() -> dict[str, QueueRules]:
    rules = {}
    for entity in load_config(DEPLOYED_CONFIG):
        if isinstance(entity, QueueSettings):
            rules[entity.name] = QueueRules(
                dedup=entity.requires_duplicate_detection,
                window=timedelta(seconds=entity.duplicate_window),
                max_delivery=entity.max_delivery_count,
                ttl=timedelta(seconds=entity.default_ttl),
            )
    return rules


def rules_for(queue: str) -> QueueRules:
    return deployed_rules().get(queue) or QueueRules()


@dataclass
class Msg:
    message_id: str
    body: bytes
    props: dict[str, Any]
    seq: int
    visible_at: datetime
    delivery_count: int = 0
    lock_token: int | None = None
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None
    # When the queue took it (a scheduled message: the time it was scheduled
    # for), which its time to live counts from; visible_at moves on with every
    # redelivery, this does not (seed 1001500).
    enqueued_at: datetime | None = None
    # Dead-lettered by a delivery whose send of its next back-off copy had
    # faulted (Bus.copy_send_faulted): the handler had no way left to carry it on.
    copy_faulted: bool = False
    # When its sender sent it (a scheduled copy: when the delivery that made
    # it did), for the time to live of the message that made a copy.
    sent_at: datetime | None = None
    # A gate's back-off copy: the lock token of the delivery that scheduled it.
    made_by: int | None = None

    def __post_init__(self) -> None:
        if self.enqueued_at is None:
            self.enqueued_at = self.visible_at

    # what a ServiceBusReceivedMessage offers the triggers
    @property
    def application_properties(self) -> dict[str, Any]:
        return self.props


@dataclass
class Queue:
    name: str
    messages: list[Msg] = field(default_factory=list)
    dead: list[Msg] = field(default_factory=list)
    seen: dict[str, datetime] = field(default_factory=dict)
    sent: list[Msg] = field(default_factory=list)  # every accepted send, for the checks


# The lock token of the delivery the running handler holds (set by the
# simulation for each delivery it hands over): a back-off copy knows its maker.
HANDLING: contextvars.ContextVar[int | None] = contextvars.ContextVar("sim_handling", default=None)


class Bus:
    def __init__(self, world: World) -> None:
        self.world = world
        self.queues: dict[str, Queue] = {}
        self._seq = itertools.count(1)
        self._tokens = itertools.count(1)
        self.after_send = None  # (queue, visible_at): lets the simulation deliver it
        # Per message id, the lock tokens of its deliveries that a fault ended
        # (a crash, a lock expiry, a failing settlement, or a send of its own
        # back-off copy that faulted, after which the handler can only leave
        # it to redelivery): when every delivery did, Service Bus's own
        # MaxDeliveryCountExceeded is the only verdict.
        self.faulted: dict[str, set[int]] = {}
        # Lock tokens of deliveries whose back-off copy's send faulted
        # (`copy_send_faulted`): counted in `faulted` once they end unsettled.
        self._copy_faulted: set[int] = set()

    def queue(self, name: str) -> Queue:
        if name not in self.queues:
            self.queues[name] = Queue(name)
        return self.queues[name]

    def send(
        self,
        queue: str,
        body: bytes,
        message_id: str,
        props: dict | None = None,
        fault_free: bool = False,
        enqueue_at: datetime | None = None,
        made_by: int | None = None,
    ) -> bool:
        """False when duplicate detection dropped it."""
        q = self.queue(queue)
        now = self.world.clock.now
        rules = rules_for(queue)
        seen = q.seen.get(message_id)
        if rules.dedup and seen is not None and now - seen < rules.window:
            self.world.log(f"bus {queue} drop duplicate {message_id}")
            self.world.counters["duplicate_dropped"] += 1
            return False
        q.seen[message_id] = now
        delay = 0.0
        faults = self.world.faults
        if not fault_free and faults.draw(
            faults.config.delay, "message_delay", f"{queue} {message_id}"
        ):
            delay = round(self.world.rng.uniform(1, 20), 3)
        visible = max(now, enqueue_at) if enqueue_at is not None else now  # a scheduled message
        msg = Msg(
            message_id,
            body,
            dict(props or {}),
            next(self._seq),
            visible + timedelta(seconds=delay),
            sent_at=now,
            made_by=made_by,
        )
        q.messages.append(msg)
        q.sent.append(msg)
        if self.after_send is not None:
            self.after_send(queue, msg.visible_at)
        self.world.log(f"bus {queue} +{message_id}" + (f" delay {delay}" if delay else ""))
        if not fault_free and faults.draw(
            faults.config.duplicate, "message_duplicate", f"{queue} {message_id}"
        ):
            # A copy that slipped past detection (sent after the window, or by a
            # producer outside it): handlers must be idempotent anyway.
            copy = Msg(
                message_id,
                body,
                dict(props or {}),
                next(self._seq),
                now + timedelta(seconds=round(self.world.rng.uniform(0, 30), 3)),
            )
            q.messages.append(copy)
            if self.after_send is not None:
                self.after_send(queue, copy.visible_at)
        return True

    # --- receiving
    def receivable(self, queue: str) -> Msg | None:
        q = self.queue(queue)
        now = self.world.clock.now
        down = self.world.faults.bus_down_until()
        if down is not None:
            # A Service Bus outage: nothing is delivered until it ends (the
            # receive links are down too); then the queue is pumped again.
            if self.after_send is not None:
                self.after_send(queue, down)
            return None
        ready = [m for m in q.messages if m.lock_token is None and m.visible_at <= now]
        if not ready:
            return None
        msg = min(ready, key=lambda m: (m.visible_at, m.seq))
        msg.delivery_count += 1
        msg.lock_token = next(self._tokens)
        return msg

    def next_visible(self, queue: str) -> datetime | None:
        times = [m.visible_at for m in self.queue(queue).messages if m.lock_token is None]
        return min(times) if times else None

    def release(self, queue: str, msg: Msg, token: int, why: str) -> None:
        """The lock ended without a settlement (crash, expiry): visible again,
        or dead-lettered once the delivery count is used up."""
        if msg.lock_token != token or msg not in self.queue(queue).messages:
            return
        msg.lock_token = None
        if (why != "abandon" and why != "function raised") or token in self._copy_faulted:
            self.faulted.setdefault(msg.message_id, set()).add(token)
        self.world.log(f"bus {queue} {why} {msg.message_id} (delivery {msg.delivery_count})")
        if msg.delivery_count >= rules_for(queue).max_delivery:
            self._dead_letter(
                queue, msg, "MaxDeliveryCountExceeded", f"delivered {msg.delivery_count} times"
            )
        else:
            msg.visible_at = self.world.clock.now

    def _dead_letter(
        self, queue: str, msg: Msg, reason: str | None, description: str | None
    ) -> None:
        q = self.queue(queue)
        q.messages.remove(msg)
        msg.lock_token = None
        msg.dead_letter_reason = reason
        msg.dead_letter_description = description
        q.dead.append(msg)
        self.world.log(f"bus {queue} DLQ {msg.message_id} {reason}")

    def settle(
        self,
        queue: str,
        msg: Msg,
        token: int,
        kind: str,
        reason: str | None = None,
        description: str | None = None,
    ) -> None:
        if msg.lock_token != token or msg not in self.queue(queue).messages:
            self.world.faults.hit("lock_lost")  # the fault surface
            raise MessageLockLostError(message=f"the lock on {msg.message_id} was lost")
        fault = self.world.faults.settle_fault(queue, kind)
        if fault is not None:
            self.faulted.setdefault(msg.message_id, set()).add(token)
        if fault == "dropped":
            self.world.log(f"bus {queue} {kind} {msg.message_id}: link dropped")
            raise ServiceBusConnectionError(message=f"{kind} of {msg.message_id}: link detached")
        if fault == "lock_lost":
            self.release(queue, msg, token, "lock lost at settlement")
            raise MessageLockLostError(message=f"the lock on {msg.message_id} was lost")
        self._settle(queue, msg, token, kind, reason, description)
        if fault == "after":
            self.world.log(f"bus {queue} {kind} {msg.message_id} applied, answer lost")
            raise OperationTimeoutError(message=f"{kind} of {msg.message_id} timed out")

    def outlived_ttl(self, queue: str, message_id: str, at: datetime) -> bool:
        """Whether a message `message_id` on `queue` handled at `at` had waited
        longer than the queue's time to live since it was enqueued: Service
        Bus would have expired it before any delivery (a scheduled copy's time
        to live starts at the time it was scheduled for)."""
        ttl = rules_for(queue).ttl
        sent = [m for m in self.queue(queue).sent if m.message_id == message_id]
        if ttl is None or not sent:
            return False
        if at - max(m.enqueued_at for m in sent) > ttl:
            return True
        # A back-off copy made by a delivery of a message that had itself
        # outlived its time to live could not be made in Azure either (seed
        # 4000374, two orders: a forgery redelivered 8 days later, after a
        # whole-app outage, made a copy that alerted again six seconds on).
        copy = _COPY.match(message_id)
        maker = copy.group(3) if copy else None
        if maker is None:
            return False
        seq = int(maker.split(".")[0].removeprefix("seq-"))
        made_by = next((m for m in self.queue(queue).sent if m.seq == seq), None)
        latest = max(sent, key=lambda m: m.enqueued_at)
        return (
            made_by is not None
            and latest.sent_at is not None
            and self.outlived_ttl(queue, made_by.message_id, latest.sent_at)
        )

    def every_delivery_faulted(self, msg: Msg) -> bool:
        return len(self.faulted.get(msg.message_id, ())) >= msg.delivery_count

    def copy_send_faulted(self, queue: str, copy_id: str) -> None:
        """A scheduled send of `copy_id` to `queue` faulted (refused, or
        applied with its answer lost). When it is a gate's back-off copy
        (`retry/<root>/<retry>`), the delivery that was making it (a locked
        message of that lineage one retry earlier) cannot carry the message on
        and can only abandon it to redelivery: that delivery, if it ends
        unsettled, was ended by the fault (seed 400174: a forged request's
        copy abandoned after its alert and its next copy both faulted)."""
        copy = _COPY.match(copy_id)
        if copy is None:
            return
        root, retry, maker = copy.group(1), int(copy.group(2)), copy.group(3)
        for m in self.queue(queue).messages:
            if m.lock_token is None:
                continue
            if maker is not None:  # the copy names the delivery that made it
                if maker == f"seq-{m.seq}.{_delivery_name(m)}":
                    self._copy_faulted.add(m.lock_token)
                continue
            mine = _COPY.match(m.message_id)
            parent = (mine.group(1), int(mine.group(2))) if mine else (f"seq-{m.seq}", 0)
            if parent == (root, retry - 1):
                self._copy_faulted.add(m.lock_token)

    def _settle(
        self,
        queue: str,
        msg: Msg,
        token: int,
        kind: str,
        reason: str | None,
        description: str | None,
    ) -> None:
        if kind == "complete":
            self.queue(queue).messages.remove(msg)
            msg.lock_token = None
            self.world.log(f"bus {queue} complete {msg.message_id}")
        elif kind == "deadletter":
            msg.copy_faulted = token in self._copy_faulted
            self._dead_letter(queue, msg, reason, description)
        else:
            self.release(queue, msg, token, "abandon")


class Delivery:
    """One delivery: the received message (as the trigger sees it) and the
    lock token it holds."""

    def __init__(self, bus: Bus, queue: str, msg: Msg) -> None:
        self.bus = bus
        self.queue = queue
        self.msg = msg
        self.token = msg.lock_token
        self.lock_token = msg.lock_token  # as the SDK's and the binding's messages carry it
        self.message_id = msg.message_id
        self.delivery_count = msg.delivery_count
        # The broker's count of this delivery (1-based), whatever the consumer's
        # SDK shows (the standalone worker's receiver counts from 0).
        self.broker_count = msg.delivery_count
        self.sequence_number = msg.seq  # assigned by the broker, unique in the bus
        self.body = msg.body
        self.application_properties = msg.props


class SimActions:
    """The ServiceBusMessageActions the triggers settle with (sync, like the
    SDK-type binding's)."""

    def __init__(self, delivery: Delivery) -> None:
        self.d = delivery

    def complete(self, message) -> None:
        self.d.bus.settle(self.d.queue, self.d.msg, self.d.token, "complete")

    def abandon(self, message) -> None:
        self.d.bus.settle(self.d.queue, self.d.msg, self.d.token, "abandon")

    def deadletter(
        self, message, deadletter_reason=None, deadletter_error_description=None
    ) -> None:
        self.d.bus.settle(
            self.d.queue,
            self.d.msg,
            self.d.token,
            "deadletter",
            deadletter_reason,
            deadletter_error_description,
        )


class SimReceiver:
    """The azure.servicebus.aio receiver's settlement methods over one
    delivery (what the standalone worker's ReceiverSettlement calls)."""

    def __init__(self, delivery: Delivery) -> None:
        self._a = SimActions(delivery)

    async def complete_message(self, message) -> None:
        self._a.complete(message)

    async def abandon_message(self, message) -> None:
        self._a.abandon(message)

    async def dead_letter_message(self, message, reason=None, error_description=None) -> None:
        self._a.deadletter(message, reason, error_description)


class SimSettlement:
    """The agents' Settlement port over one delivery."""

    def __init__(self, delivery: Delivery) -> None:
        self._a = SimActions(delivery)

    async def complete(self) -> None:
        self._a.complete(None)

    async def abandon(self) -> None:
        self._a.abandon(None)

    async def dead_letter(self, reason: str, description: str) -> None:
        self._a.deadletter(None, reason, description)


FAILABLE_SENDS = ("status", "alert", "reply")


class SimPublisher:
    """The MessagePublisher port. Sends to reply queues (statuses) and to the
    alerts queue can fail (a fault), as can the agents' reply sends."""

    def __init__(self, world: World, bus: Bus, reply_queues: set[str]) -> None:
        self.world = world
        self.bus = bus
        self.reply_queues = reply_queues

    async def send(
        self,
        queue: str,
        body: bytes,
        message_id: str,
        application_properties: dict[str, str] | None = None,
    ) -> None:
        await self.world.point(f"bus.send.{queue}")
        kind = "status" if queue in self.reply_queues else "alert" if queue == "alerts" else None
        faults = self.world.faults
        if kind and faults.draw(faults.config.send_fail, f"{kind}_send_fail", message_id):
            raise TransientError(f"sending to queue {queue!r} failed: simulated ServiceBusError")
        accepted = self.bus.send(queue, body, message_id, application_properties)
        if self.on_sent is not None:
            self.on_sent(queue, message_id, accepted)

    on_sent = None  # (queue, message id, accepted): the simulation's bookkeeping

    async def schedule(
        self,
        queue: str,
        body: bytes,
        message_id: str,
        enqueue_at: datetime,
        application_properties: dict | None = None,
    ) -> None:
        """The gate's delayed retry: a copy on the same queue, visible at `enqueue_at`."""
        await self.world.point(f"bus.schedule.{queue}")
        self.bus.send(queue, body, message_id, application_properties, enqueue_at=enqueue_at)

    async def close(self) -> None:
        return None


class SimReplySender:
    def __init__(self, world: World, bus: Bus, queue: str = "agent-responses") -> None:
        self.world = world
        self.bus = bus
        self.queue = queue

    async def send(self, reply, message_id: str) -> None:
        await self.world.point("bus.send.reply")
        faults = self.world.faults
        if faults.draw(faults.config.send_fail, "reply_send_fail", message_id):
            raise TransientError(f"sending reply {message_id}: simulated ServiceBusError")
        self.bus.send(self.queue, encode(reply), message_id, {"SchemaVersion": reply.SchemaVersion})


# --- below the adapter: the azure.servicebus.aio client the product sends through


class SimSender:
    """`ServiceBusClient.get_queue_sender(queue)`: `send_messages` of one
    ServiceBusMessage (scheduled when it has a scheduled enqueue time)."""

    def __init__(self, client: SimServiceBusClient, queue: str) -> None:
        self.client = client
        self.queue = queue

    async def __aenter__(self) -> SimSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def close(self) -> None:
        return None

    def _refused(self, message) -> None:
        if self.client.on_refused is not None:
            self.client.on_refused(self.queue, message.message_id)
        if self.queue == "alerts":
            with contextlib.suppress(ValueError):
                self.client.refused_alerts.append(json.loads(b"".join(message.body)))

    async def send_messages(self, message, timeout: float | None = None, **_: Any) -> None:
        c, queue = self.client, self.queue
        world, faults = c.world, c.world.faults
        message_id = message.message_id
        scheduled = message.scheduled_enqueue_time_utc
        label = "schedule" if scheduled else "send"
        await world.point(
            "bus.send.reply"
            if queue == c.responses_queue and not scheduled
            else f"bus.{label}.{queue}"
        )
        refusal = faults.queue_refuses(queue)
        if refusal is not None:
            if scheduled:
                c.bus.copy_send_faulted(queue, message_id)
            self._refused(message)
            world.log(f"bus {queue} {label} {message_id} refused: the queue is {refusal}")
            raise _REFUSALS[refusal](message=f"sending to {queue}: the entity is {refusal}")
        if faults.queue_full(queue):
            if scheduled:
                c.bus.copy_send_faulted(queue, message_id)
            self._refused(message)
            world.log(f"bus {queue} {label} {message_id} refused: the queue is full")
            raise ServiceBusQuotaExceededError(
                message=f"sending to {queue}: the entity is full (QuotaExceeded)"
            )
        # The sends that could fail before the fallible world (statuses,
        # alerts, replies; never a scheduled copy), drawn as they were.
        kind = (
            None
            if scheduled
            else "status"
            if queue in c.reply_queues
            else "alert"
            if queue == "alerts"
            else "reply"
            if queue == c.responses_queue
            else None
        )
        if kind and faults.draw(faults.config.send_fail, f"{kind}_send_fail", message_id):
            self._refused(message)
            raise ServiceBusConnectionError(message=f"sending to {queue}: link detached")
        fault = faults.send_fault(queue, message_id)
        if fault is not None and scheduled:
            c.bus.copy_send_faulted(queue, message_id)
        if fault == "refused":
            self._refused(message)
            world.log(f"bus {queue} {label} {message_id} refused")
            raise ServiceBusConnectionError(message=f"sending to {queue}: connection refused")
        body = b"".join(message.body)
        props = dict(message.application_properties or {})
        maker = HANDLING.get() if scheduled else None
        accepted = c.bus.send(queue, body, message_id, props, enqueue_at=scheduled, made_by=maker)
        if not scheduled and queue != c.responses_queue and c.on_sent is not None:
            c.on_sent(queue, message_id, accepted)
        if not scheduled and queue == c.responses_queue and c.on_reply is not None:
            c.on_reply(body)  # an agent's reply, sent by the delivery this task handles
        if scheduled and not accepted and c.on_copy_dropped is not None:
            c.on_copy_dropped(queue, message_id, maker)
        if fault == "after":
            world.log(f"bus {queue} {message_id} accepted, answer lost")
            raise OperationTimeoutError(message=f"sending to {queue}: no answer in time")


# How a refusing entity (FaultConfig.refusing_reply) answers a send, as the
# SDK raises it: disabled, deleted, the app's Sender role removed, or full.
_REFUSALS = {
    "disabled": MessagingEntityDisabledError,
    "deleted": MessagingEntityNotFoundError,
    "forbidden": ServiceBusAuthorizationError,
    "full": ServiceBusQuotaExceededError,
}


class SimServiceBusClient:
    """What `ServiceBusPublisher` needs of azure.servicebus.aio.ServiceBusClient."""

    def __init__(
        self,
        world: World,
        bus: Bus,
        reply_queues: set[str],
        responses_queue: str = "agent-responses",
    ) -> None:
        self.world = world
        self.bus = bus
        self.reply_queues = reply_queues
        self.responses_queue = responses_queue
        self.on_sent = None  # (queue, message id, accepted): the simulation's bookkeeping
        self.on_refused = None  # (queue, message id): a send refused, nothing sent
        self.on_reply = None  # (body): a reply the queue took, in the sending task
        # The bodies of alerts a fault refused (nothing reached the queue): a
        # dead letter whose alert and last back-off copy were both refused
        # goes with only its log event (adapters.settlement.MessageGate.run).
        self.refused_alerts: list[dict[str, Any]] = []
        # (queue, copy id, the lock token of the delivery making it): a
        # scheduled back-off copy duplicate detection dropped.
        self.on_copy_dropped = None

    def get_queue_sender(self, queue: str) -> SimSender:
        return SimSender(self, queue)

    async def close(self) -> None:
        return None


class _NoLock:
    """The publisher's per-link lock in the simulation: a send parks inside
    it (a scheduling point), and a second actor blocked on a real
    asyncio.Lock would be neither parked nor finished. The simulated sender
    has no link to protect: each send is atomic after its point."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _inline_wait_for(aw, timeout):
    """`asyncio.wait_for` as the publisher's seam in the simulation: awaits
    inline (on Python 3.11 wait_for runs the send in a task of its own,
    which is no actor of the world)."""
    return await aw


def publisher(client: SimServiceBusClient):
    """The product's ServiceBusPublisher over the simulated client, with the
    no-op lock and the inline wait (its seams: `_NoLock`, `_inline_wait_for`)."""
    from adapters.servicebus import ServiceBusPublisher

    return ServiceBusPublisher(
        client,  # type: ignore[arg-type]
        locks=_NoLock,
        wait_for=_inline_wait_for,
    )


def reply_sender(client: SimServiceBusClient, queue: str = "agent-responses"):
    """The agents' ServiceBusReplySender over the simulated client, through a
    publisher of its own as `publisher` builds it."""
    from agents.messaging import ServiceBusReplySender

    return ServiceBusReplySender(client, queue, publisher=publisher(client))  # type: ignore[arg-type]


# retry/<root>/<retry>[/<the delivery that made it: seq-N.<its delivery name>>]
# (ADR 021i; the delivery's name: adapters.settlement._delivery_name)
_COPY = re.compile(r"^retry/(seq-\d+)/(\d+)(?:/(seq-\d+\.[0-9a-f]+))?$")


def copy_root(message_id: str, seq: int) -> str:
    """The first message of the back-off lineage a message (its id and
    sequence number) belongs to, as `seq-N`: a copy's names it, a first
    message is its own. Two messages with one id (a client's message sent
    twice) are two lineages here, one name in ORIGINAL_ID_PROPERTY."""
    mine = _COPY.match(message_id)
    return mine.group(1) if mine else f"seq-{seq}"


def later_copy(message: Msg, other: Msg) -> bool:
    """`other` is a later back-off copy of `message` (the gate names a copy
    `retry/<the first message's sequence number>/<retry>/<its maker>`)."""
    mine = _COPY.match(message.message_id)
    root, retry = (mine.group(1), int(mine.group(2))) if mine else (f"seq-{message.seq}", 0)
    theirs = _COPY.match(other.message_id)
    return theirs is not None and theirs.group(1) == root and int(theirs.group(2)) > retry
