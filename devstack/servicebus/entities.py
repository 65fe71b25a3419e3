"""The broker's own job, which the SDK leaves entirely to the service: queues,
topics and their subscriptions, sessions (session locks, state, in-order
delivery to one receiver), sequence numbers, peek-locks and their expiry,
delivery counts, the dead-letter queue, auto-forwarding, duplicate detection,
time to live, scheduled and deferred messages, and size limits.

This module knows nothing about AMQP framing. The protocol layer hands it
parsed messages and lock tokens, and registers consumers (its sender links)
that it calls back with deliveries. Time comes from an injectable clock in
milliseconds so the rules can be reasoned about apart from the wall clock.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from .codec import (
    AMQPTypes,
    ParsedMessage,
    app_properties,
    encode_message,
    new_lock_token,
    system_properties,
    typed,
    with_changes,
)
from .config import QueueSettings, TopicSettings
from .filters import (
    SYSTEM_PROPERTIES,
    FilterEvaluationError,
    MessageView,
    evaluate_rules,
)

_LOG = logging.getLogger("devstack.servicebus")

DEAD_LETTER_SUFFIX = "/$deadletterqueue"
# Service Bus Standard tier quotas (learn.microsoft.com, "Service Bus quotas"):
# "Message size ... 256 KB for Standard tier ... The message size includes the size of
# properties (system and user) and the size of payload": `ParsedMessage.size` counts every
# section the sender wrote, header sections included.
MAX_MESSAGE_SIZE = 256 * 1024
# "Cumulative size of all properties can't exceed 64 KB. This limit applies to the entire
# header of the brokered message, which has both user properties and system properties";
# here: the encoded message annotations, properties and application properties.
MAX_HEADER_SIZE = 64 * 1024

AVAILABLE, LOCKED, DEFERRED, SCHEDULED = "available", "locked", "deferred", "scheduled"

REASON_MAX_DELIVERY = "MaxDeliveryCountExceeded"
REASON_TTL = "TTLExpiredException"
REASON_FILTER = "FilterEvaluationException"
REASON_HOPS = "MaxTransferHopCountExceeded"
#: Service Bus forwards a message through at most this many entities.
MAX_FORWARD_HOPS = 4

#: Messages and bytes a send would add, per quota scope (a queue or subscription with its
#: dead-letter queue), so that a send that fans out can be refused before anything is stored.
Demand: TypeAlias = "dict[Queue, list[int]]"


class BrokerError(Exception):
    """An operation the service would refuse; `condition` is the AMQP error symbol."""

    condition = b"amqp:internal-error"

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class LockLost(BrokerError):
    """The lock token is unknown: expired, already settled, or never issued."""

    condition = b"com.microsoft:message-lock-lost"


class QuotaExceeded(BrokerError):
    """The queue is at its size or message-count limit."""

    condition = b"amqp:resource-limit-exceeded"


class MessageTooLarge(BrokerError):
    """A single message exceeds the tier's maximum message size."""

    condition = b"amqp:link:message-size-exceeded"


def check_message_size(body: ParsedMessage) -> None:
    """Refuse a message over the Standard tier's message or header size quota."""
    if body.size > MAX_MESSAGE_SIZE:
        raise MessageTooLarge(f"The message is larger than {MAX_MESSAGE_SIZE} bytes.")
    header = len(body.annotation_items) + len(body.properties_raw) + len(body.app_items)
    if header > MAX_HEADER_SIZE:
        # Azure's words for it (its SerializationException, sent as message-size-exceeded).
        raise MessageTooLarge(
            "A serialization error occurred while processing the message header stream. The "
            f"serialization process return the following message: The size quota for this "
            f"stream ({MAX_HEADER_SIZE}) has been exceeded."
        )


class MessageNotFound(BrokerError):
    """No deferred message has the requested sequence number."""

    condition = b"com.microsoft:message-not-found"


class SessionLockLost(BrokerError):
    """The session lock ended (expired, or its receiver closed)."""

    condition = b"com.microsoft:session-lock-lost"


class SessionCannotBeLocked(BrokerError):
    """Another receiver holds the session."""

    condition = b"com.microsoft:session-cannot-be-locked"


class NotAllowed(BrokerError):
    """The operation contradicts the entity's configuration (Azure's InvalidOperationException)."""

    condition = b"amqp:not-allowed"


class Consumer(Protocol):
    """What the protocol layer's sender link offers a queue."""

    peek_lock: bool

    def has_credit(self) -> bool: ...

    def deliver(self, message: StoredMessage, payload: bytes, lock: Lock | None) -> None:
        """Send `payload` (the encoded `message`); `lock` is None when it was received and deleted.

        The link sends only the bytes; `message` is there for a consumer that watches the
        stored message (the broker tests' fake reads its delivery count)."""

    def session_granted(self, session: MessageSession) -> None:
        """A next-available session receiver waiting for a session now holds `session`."""

    def session_lost(self) -> None:
        """The consumer's session lock expired: the link must be closed with session-lock-lost."""


class Journal(Protocol):
    """Where state changes go when --data-dir is set (see journal.py)."""

    def put(self, queue: str, message: StoredMessage) -> None: ...

    def delete(self, queue: str, sequence_number: int) -> None: ...

    def put_sequence(self, queue: str, next_sequence_number: int) -> None: ...

    def put_duplicate(self, queue: str, message_id: str, seen_ms: int) -> None: ...

    def put_session_state(
        self, queue: str, session_id: str, state: bytes | None, updated_ms: int = 0
    ) -> None: ...

    def flush(self) -> None: ...


class NullJournal:
    """Memory only: every change is forgotten at exit."""

    def put(self, queue: str, message: StoredMessage) -> None:
        pass

    def delete(self, queue: str, sequence_number: int) -> None:
        pass

    def put_sequence(self, queue: str, next_sequence_number: int) -> None:
        pass

    def put_duplicate(self, queue: str, message_id: str, seen_ms: int) -> None:
        pass

    def put_session_state(
        self, queue: str, session_id: str, state: bytes | None, updated_ms: int = 0
    ) -> None:
        pass

    def flush(self) -> None:
        pass


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(eq=False)
class StoredMessage:
    """One message held by a queue.

    Attributes:
        sequence_number: Unique and increasing within the queue (kept in its dead-letter queue).
        body: The parsed message.
        enqueued_ms: When it was accepted (or became active, if scheduled).
        expires_ms: When its time to live ends, or None.
        scheduled_ms: When a scheduled message becomes active, or None.
        state: available, locked, deferred or scheduled.
        delivery_count: Deliveries that ended without settlement.
        deferred: Returns to deferred rather than available when its lock ends.
        dead_letter_source: The queue it was dead-lettered from.
        lock: The current peek-lock, if any.
    """

    sequence_number: int
    body: ParsedMessage
    enqueued_ms: int
    expires_ms: int | None
    scheduled_ms: int | None = None
    state: str = AVAILABLE
    delivery_count: int = 0
    deferred: bool = False
    dead_letter_source: str | None = None
    lock: Lock | None = None

    @property
    def message_id(self) -> str | None:
        return self.body.message_id

    @property
    def session_id(self) -> str | None:
        return self.body.session_id


@dataclass(eq=False)
class MessageSession:
    """One session of a session-enabled entity: its messages, state and lock.

    Attributes:
        session_id: The SessionId its messages carry.
        available: Sequence numbers of its available messages (a heap: delivered in order).
        state: The session state a receiver stored, or None.
        state_updated_ms: When a receiver last set the state (get-message-sessions filters on it).
        holder: The receiver that holds the session lock, or None.
        locked_until_ms: When the session lock ends unless renewed.
        locks: Message locks taken under this session lock (they end with it).
    """

    session_id: str
    available: list[int] = field(default_factory=list)
    state: bytes | None = None
    state_updated_ms: int = 0
    holder: Consumer | None = None
    locked_until_ms: int = 0
    locks: set[uuid.UUID] = field(default_factory=set)


@dataclass(eq=False)
class Lock:
    """A peek-lock: the message is invisible to other receivers until it ends.

    Attributes:
        token: The lock token (the delivery tag, as `bytes_le`).
        queue: The queue that holds the message.
        message: The locked message.
        locked_until_ms: When the lock expires unless renewed.
        on_end: Called once when the lock ends for any reason (lets the link forget the delivery).
        session: The session lock this message lock belongs to (it has no expiry of its own).
    """

    token: uuid.UUID
    queue: Queue
    message: StoredMessage
    locked_until_ms: int
    on_end: Callable[[], None] | None = None
    session: MessageSession | None = None


@dataclass(order=True)
class _Timer:
    due_ms: int
    order: int
    kind: str = field(compare=False)
    target: object = field(compare=False)


class Queue:
    """A queue or a dead-letter sub-queue and the messages it holds."""

    def __init__(
        self, broker: Broker, settings: QueueSettings, path: str, parent: Queue | None = None
    ):
        self.broker = broker
        self.settings = settings
        self.path = path  # display name, e.g. "orders" or "orders/$DeadLetterQueue"
        self.parent = parent
        self.is_dead_letter = parent is not None
        self.is_subscription = "/subscriptions/" in path.lower()
        self.messages: dict[int, StoredMessage] = {}
        self._available: list[int] = []
        self.consumers: list[Consumer] = []
        self._next_consumer = 0
        self.next_sequence_number = 1
        self.size_bytes = 0
        self.duplicates: OrderedDict[str, int] = OrderedDict()
        self.dead_letter: Queue | None = None
        self.sessions: dict[str, MessageSession] = {}
        self.session_waiters: list[Consumer] = []

    @property
    def sessionful(self) -> bool:
        """Messages go to session receivers (a dead-letter queue never requires sessions)."""
        return self.settings.requires_session and not self.is_dead_letter

    def session(self, session_id: str) -> MessageSession:
        """The session with this id, created on first use (sessions need no declaration)."""
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = MessageSession(session_id)
        return session

    def _push_available(self, message: StoredMessage) -> None:
        if self.sessionful:
            heapq.heappush(
                self.session(message.session_id or "").available, message.sequence_number
            )
        else:
            heapq.heappush(self._available, message.sequence_number)

    # -- bookkeeping -----------------------------------------------------

    @property
    def journal_name(self) -> str:
        return self.path.lower()

    def _root(self) -> Queue:
        return self.parent or self

    def total_held(self) -> tuple[int, int]:
        """Messages and bytes held by the queue and its dead-letter queue (the quota's scope)."""
        root = self._root()
        count, size = len(root.messages), root.size_bytes
        if root.dead_letter is not None:
            count += len(root.dead_letter.messages)
            size += root.dead_letter.size_bytes
        return count, size

    def _add(self, message: StoredMessage) -> None:
        self.messages[message.sequence_number] = message
        self.size_bytes += message.body.size
        if message.state == AVAILABLE:
            self._push_available(message)
        self.broker.journal.put(self.journal_name, message)

    def restore(self, message: StoredMessage) -> None:
        """Hold a message loaded from the journal (no journal write)."""
        self.messages[message.sequence_number] = message
        self.size_bytes += message.body.size
        if message.state == AVAILABLE:
            self._push_available(message)

    def _remove(self, message: StoredMessage) -> None:
        if self.messages.pop(message.sequence_number, None) is not None:
            self.size_bytes -= message.body.size
            self.broker.journal.delete(self.journal_name, message.sequence_number)

    def make_available(self, message: StoredMessage) -> None:
        message.state = DEFERRED if message.deferred else AVAILABLE
        if message.state == AVAILABLE:
            self._push_available(message)
        # Its time to live may have ended while it was locked; expire it even if nobody receives.
        self.broker.add_timer(message.expires_ms, "expiry", (self, message))
        self.broker.journal.put(self.journal_name, message)

    # -- sending -------------------------------------------------------

    def accept(
        self,
        body: ParsedMessage,
        now_ms: int,
        scheduled_ms: int | None = None,
        hops: int = 0,
    ) -> int | None:
        """Take a sent message (or pass it on, with ForwardTo).

        Args:
            body: The parsed message.
            now_ms: The current time.
            scheduled_ms: Enqueue time of a scheduled message (also read from its annotation).
            hops: Entities the message was forwarded through to get here.

        Returns:
            Its sequence number, or None when it was dropped as a duplicate.
        """
        self.check(body)
        forward = self.broker.forward_target(self.settings.forward_to)
        if forward is not None and not self.is_dead_letter:
            if hops < MAX_FORWARD_HOPS:
                # Auto-forwarding: the message never rests here.
                number = forward.accept(body, now_ms, scheduled_ms, hops + 1)
                forward.pump()
                return number
            number = self._store(body, now_ms, scheduled_ms)
            message = self.messages.get(number) if number is not None else None
            if message is not None:
                self.move_to_dead_letter(
                    message,
                    REASON_HOPS,
                    f"The message was forwarded more than {MAX_FORWARD_HOPS} times.",
                    forward=False,
                )
            return number
        return self._store(body, now_ms, scheduled_ms)

    def _store(self, body: ParsedMessage, now_ms: int, scheduled_ms: int | None) -> int | None:
        if self._is_duplicate(body.message_id, now_ms):
            _LOG.debug(
                "entity=%s message_id=%s outcome=duplicate-dropped", self.path, body.message_id
            )
            return None
        self.check_room(1, body.size)
        if scheduled_ms is None:
            annotated = body.annotations.get(b"x-opt-scheduled-enqueue-time")
            if isinstance(annotated, int):
                scheduled_ms = annotated
        sequence_number = self.next_sequence_number
        self.next_sequence_number += 1
        self.broker.journal.put_sequence(self.journal_name, self.next_sequence_number)
        self._remember_duplicate(body.message_id, now_ms)
        active_at = scheduled_ms if scheduled_ms is not None and scheduled_ms > now_ms else now_ms
        message = StoredMessage(
            sequence_number=sequence_number,
            body=body,
            enqueued_ms=active_at,
            expires_ms=active_at + self._ttl_ms(body),
            scheduled_ms=scheduled_ms if active_at > now_ms else None,
            state=SCHEDULED if active_at > now_ms else AVAILABLE,
        )
        self._add(message)
        if message.state == SCHEDULED:
            self.broker.add_timer(active_at, "scheduled", (self, message))
        else:
            self.broker.add_timer(message.expires_ms, "expiry", (self, message))
        _LOG.debug(
            "entity=%s message_id=%s sequence=%s outcome=%s",
            self.path,
            body.message_id,
            sequence_number,
            message.state,
        )
        return sequence_number

    def check_room(self, count: int, size: int) -> None:
        """Refuse `count` more messages of `size` bytes in all if they would exceed the quota."""
        held, held_size = self.total_held()
        limit = self.settings.max_message_count
        if (
            limit is not None and held + count > limit
        ) or held_size + size > self.settings.max_size_bytes:
            raise QuotaExceeded(
                f"The maximum entity size has been reached or exceeded for queue '{self.path}'. "
                f"Size of entity in bytes:{held_size}, Max entity size in bytes:{self.settings.max_size_bytes}. "
                f"Messages:{held}, Max messages:{limit}."
            )

    def add_demand(self, body: ParsedMessage, now_ms: int, hops: int, demand: Demand) -> None:
        """Add to `demand` what `accept(body, now_ms, hops=hops)` would store, per quota scope,
        and raise what it would raise for the message itself; nothing is stored."""
        self.check(body)
        forward = self.broker.forward_target(self.settings.forward_to)
        if forward is not None and not self.is_dead_letter and hops < MAX_FORWARD_HOPS:
            forward.add_demand(body, now_ms, hops + 1, demand)
            return
        self.add_own_demand(body, now_ms, demand)

    def add_own_demand(self, body: ParsedMessage, now_ms: int, demand: Demand) -> None:
        """Add what `_store(body, now_ms, ...)` would hold here (nothing for a duplicate)."""
        if self._is_duplicate(body.message_id, now_ms):
            return
        slot = demand.setdefault(self._root(), [0, 0])
        slot[0] += 1
        slot[1] += body.size

    def check(self, body: ParsedMessage) -> None:
        """Refuse a message this entity can never take, whatever its fill level."""
        check_message_size(body)
        if self.sessionful and body.session_id is None:
            raise NotAllowed(
                f"The SessionId was not set on a message, and it cannot be sent to the entity "
                f"'{self.path}'. Entities that have session support enabled can only receive "
                "messages that have the SessionId set to a valid value."
            )

    def accept_batch(self, bodies: list[ParsedMessage], now_ms: int) -> None:
        """Take the messages of one batch delivery: all of them, or none."""
        for body in bodies:
            self.check(body)
        if len(bodies) > 1:
            count, size = self.total_held()
            limit = self.settings.max_message_count
            if (limit is not None and count + len(bodies) > limit) or (
                size + sum(b.size for b in bodies) > self.settings.max_size_bytes
            ):
                raise QuotaExceeded(
                    f"The maximum entity size has been reached or exceeded for queue '{self.path}'."
                )
        for body in bodies:
            self.accept(body, now_ms)
        self.pump()

    def _ttl_ms(self, body: ParsedMessage) -> int:
        default = int(self.settings.default_ttl * 1000)
        requested = body.ttl_ms
        return min(default, requested) if requested else default

    def _is_duplicate(self, message_id: str | None, now_ms: int) -> bool:
        if not self.settings.requires_duplicate_detection or message_id is None:
            return False
        self._forget_old_duplicates(now_ms)
        return message_id in self.duplicates

    def _remember_duplicate(self, message_id: str | None, now_ms: int) -> None:
        if not self.settings.requires_duplicate_detection or message_id is None:
            return
        self.duplicates[message_id] = now_ms
        self.duplicates.move_to_end(message_id)
        self.broker.journal.put_duplicate(self.journal_name, message_id, now_ms)

    def _forget_old_duplicates(self, now_ms: int) -> None:
        horizon = now_ms - int(self.settings.duplicate_window * 1000)
        while self.duplicates:
            _, seen = next(iter(self.duplicates.items()))
            if seen >= horizon:
                break
            self.duplicates.popitem(last=False)

    def cancel_scheduled(self, sequence_numbers: Iterable[int]) -> None:
        for sequence_number in sequence_numbers:
            message = self.messages.get(sequence_number)
            if message is not None and message.state == SCHEDULED:
                self._remove(message)
                _LOG.debug(
                    "entity=%s sequence=%s outcome=schedule-cancelled", self.path, sequence_number
                )

    # -- receiving -----------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if consumer in self.session_waiters:
            self.session_waiters.remove(consumer)
        session = getattr(consumer, "message_session", None)
        if session is not None and session.holder is consumer:
            # Closing a session receiver releases the session for other receivers at once.
            self.release_session(session)

    # -- sessions --------------------------------------------------------

    def _free_session(self, now_ms: int) -> MessageSession | None:
        """The unlocked session whose oldest available message is the oldest of all."""
        best: MessageSession | None = None
        best_head = 0
        for session in self.sessions.values():
            if session.holder is not None:
                continue
            heap = session.available
            while heap and (
                (m := self.messages.get(heap[0])) is None
                or m.state != AVAILABLE
                or (m.expires_ms is not None and m.expires_ms <= now_ms)
            ):
                popped = heapq.heappop(heap)
                if m is not None and m.state == AVAILABLE and self.messages.get(popped) is m:
                    self.expire(m)
            if heap and (best is None or heap[0] < best_head):
                best, best_head = session, heap[0]
        return best

    def acquire_session(self, session_id: str | None, consumer: Consumer) -> MessageSession | None:
        """Lock a session for a session receiver.

        Args:
            session_id: The session asked for, or None for the next available one.
            consumer: The receiver that will hold it.

        Returns:
            The locked session, or None when no session has messages (next-available only).
        """
        now_ms = self.broker.clock()
        if session_id is None:
            session = self._free_session(now_ms)
            if session is None:
                return None
        else:
            session = self.session(session_id)
            if session.holder is not None:
                raise SessionCannotBeLocked(
                    f"The requested session '{session_id}' cannot be accepted. "
                    "It may be locked by another receiver."
                )
        self.broker.hold_session(self, session, consumer, now_ms)
        consumer.message_session = session  # type: ignore[attr-defined]
        return session

    def wait_for_session(self, consumer: Consumer) -> None:
        """Queue a next-available receiver until some session has messages."""
        self.session_waiters.append(consumer)

    def _serve_waiters(self, now_ms: int) -> None:
        while self.session_waiters:
            session = self._free_session(now_ms)
            if session is None:
                return
            waiter = self.session_waiters.pop(0)
            self.broker.hold_session(self, session, waiter, now_ms)
            waiter.message_session = session  # type: ignore[attr-defined]
            waiter.session_granted(session)

    def release_session(self, session: MessageSession) -> None:
        """End a session lock: its locked messages return to the session, counted as deliveries."""
        session.holder = None
        tokens = list(session.locks)
        session.locks.clear()
        for token in tokens:
            lock = self.broker.locks.get(token)
            if lock is not None:
                self.broker._end_lock(token)
                self.broker.lost_session_tokens[token] = None
                self.abandon(lock.message, pump=False)
        while len(self.broker.lost_session_tokens) > 10_000:
            self.broker.lost_session_tokens.popitem(last=False)
        if not session.available and session.state is None:
            self.sessions.pop(session.session_id, None)
        self.pump()

    def held_session(self, session_id: str | None) -> MessageSession:
        """A session that a receiver holds; anything else is a lost session lock."""
        session = self.sessions.get(session_id or "")
        if session is None or session.holder is None:
            raise SessionLockLost(
                f"The session lock has expired on the session '{session_id}'. Accept a new session."
            )
        return session

    def set_session_state(self, session_id: str | None, state: bytes | None) -> None:
        session = self.held_session(session_id)
        session.state = state
        session.state_updated_ms = self.broker.clock()
        self.broker.journal.put_session_state(
            self.journal_name, session.session_id, state, session.state_updated_ms
        )

    def session_ids(self, state_updated_after_ms: int | None) -> list[str]:
        """The sessions get-message-sessions lists, in the order they were first seen: with
        `state_updated_after_ms` None, those with an active message (available or locked)
        or a stored state; else those whose state was set after that time."""
        if state_updated_after_ms is not None:
            return [
                sid
                for sid, session in self.sessions.items()
                if session.state_updated_ms > state_updated_after_ms
            ]
        active = {
            m.session_id or "" for m in self.messages.values() if m.state in (AVAILABLE, LOCKED)
        }
        return [
            sid
            for sid, session in self.sessions.items()
            if sid in active or session.state is not None
        ]

    def _pick_consumer(self) -> Consumer | None:
        """Round-robin over consumers with credit, so competing receivers share the load."""
        n = len(self.consumers)
        for i in range(n):
            consumer = self.consumers[(self._next_consumer + i) % n]
            if consumer.has_credit():
                self._next_consumer = (self._next_consumer + i + 1) % n
                return consumer
        return None

    def _pop_available(self, now_ms: int) -> StoredMessage | None:
        return self._pop_from(self._available, now_ms)

    def _pop_from(self, heap: list[int], now_ms: int) -> StoredMessage | None:
        while heap:
            sequence_number = heapq.heappop(heap)
            message = self.messages.get(sequence_number)
            if message is None or message.state != AVAILABLE:
                continue  # a stale heap entry: the message moved on since it was pushed
            if message.expires_ms is not None and message.expires_ms <= now_ms:
                self.expire(message)
                continue
            return message
        return None

    def pump(self) -> None:
        """Hand available messages to consumers while both exist."""
        now_ms = self.broker.clock()
        if self.sessionful:
            self._pump_sessions(now_ms)
            return
        while self._available and self.consumers:
            consumer = self._pick_consumer()
            if consumer is None:
                return
            message = self._pop_available(now_ms)
            if message is None:
                return
            self._deliver(consumer, message, now_ms, None)

    def _pump_sessions(self, now_ms: int) -> None:
        """Each session's messages go, in order, only to the receiver holding its lock."""
        self._serve_waiters(now_ms)
        for consumer in list(self.consumers):
            session = getattr(consumer, "message_session", None)
            if session is None or session.holder is not consumer:
                continue
            while consumer.has_credit():
                message = self._pop_from(session.available, now_ms)
                if message is None:
                    break
                self._deliver(consumer, message, now_ms, session)

    def _deliver(
        self,
        consumer: Consumer,
        message: StoredMessage,
        now_ms: int,
        session: MessageSession | None,
    ) -> None:
        if consumer.peek_lock:
            lock = self.broker.lock(self, message, now_ms, session)
            consumer.deliver(message, self.encode(message, lock), lock)
        else:
            payload = self.encode(message, None)
            self._remove(message)
            consumer.deliver(message, payload, None)
        _LOG.debug(
            "entity=%s message_id=%s sequence=%s delivery_count=%s outcome=%s",
            self.path,
            message.message_id,
            message.sequence_number,
            message.delivery_count,
            "locked" if consumer.peek_lock else "received-and-deleted",
        )

    def encode(self, message: StoredMessage, lock: Lock | None) -> bytes:
        """The message as the SDK receives it, with the broker's annotations."""
        annotations = [
            (
                typed(AMQPTypes.symbol, b"x-opt-sequence-number"),
                typed(AMQPTypes.long, message.sequence_number),
            ),
            (
                typed(AMQPTypes.symbol, b"x-opt-enqueued-time"),
                typed(AMQPTypes.timestamp, message.enqueued_ms),
            ),
        ]
        if lock is not None:
            annotations.append(
                (
                    typed(AMQPTypes.symbol, b"x-opt-locked-until"),
                    typed(AMQPTypes.timestamp, lock.locked_until_ms),
                )
            )
        # Service Bus's message state: 0 active, 1 deferred, 2 scheduled (what peek shows).
        state = 2 if message.state == SCHEDULED else 1 if message.deferred else 0
        annotations.append(
            (typed(AMQPTypes.symbol, b"x-opt-message-state"), typed(AMQPTypes.int, state))
        )
        if message.dead_letter_source:
            annotations.append(
                (
                    typed(AMQPTypes.symbol, b"x-opt-deadletter-source"),
                    typed(AMQPTypes.string, message.dead_letter_source),
                )
            )
        return encode_message(message.body, message.delivery_count, annotations)

    def peek(
        self, from_sequence_number: int, count: int, session_id: str | None = None
    ) -> list[StoredMessage]:
        """Up to `count` messages from a sequence number on (of one session if given), unlocked."""
        found = [
            m
            for s, m in self.messages.items()
            if s >= from_sequence_number and (session_id is None or m.session_id == session_id)
        ]
        found.sort(key=lambda m: m.sequence_number)
        return found[:count]

    def take_deferred(
        self, sequence_numbers: Iterable[int], peek_lock: bool, session_id: str | None = None
    ) -> list[tuple[StoredMessage, bytes, Lock | None]]:
        """Receive deferred messages by sequence number (locked, or removed in receive-and-delete).

        On a session entity only the receiver's own session's deferred messages are found,
        and their locks belong to its session lock.
        """
        now_ms = self.broker.clock()
        session = self.held_session(session_id) if self.sessionful else None
        taken = []
        for sequence_number in sequence_numbers:
            message = self.messages.get(sequence_number)
            if (
                message is None
                or message.state != DEFERRED
                or (session is not None and message.session_id != session.session_id)
            ):
                raise MessageNotFound(
                    f"Failed to retrieve deferred message with sequence number {sequence_number}."
                )
            if peek_lock:
                lock = self.broker.lock(self, message, now_ms, session)
                taken.append((message, self.encode(message, lock), lock))
            else:
                payload = self.encode(message, None)
                self._remove(message)
                taken.append((message, payload, None))
        return taken

    # -- settlement ----------------------------------------------------

    def complete(self, message: StoredMessage) -> None:
        self._remove(message)

    def abandon(
        self, message: StoredMessage, count_delivery: bool = True, pump: bool = True
    ) -> None:
        """Return a message whose lock ended; dead-letter it once it used up its deliveries."""
        if count_delivery:
            message.delivery_count += 1
        if not self.is_dead_letter and message.delivery_count >= self.settings.max_delivery_count:
            self.move_to_dead_letter(
                message,
                REASON_MAX_DELIVERY,
                f"Message could not be consumed after {self.settings.max_delivery_count} delivery attempts.",
            )
            return
        self.make_available(message)
        if pump:
            self.pump()

    def defer(self, message: StoredMessage) -> None:
        message.deferred = True
        message.state = DEFERRED
        self.broker.journal.put(self.journal_name, message)

    def move_to_dead_letter(
        self,
        message: StoredMessage,
        reason: str | None,
        description: str | None,
        forward: bool = True,
    ) -> None:
        """Move a message to the dead-letter queue with a reason, as the service does
        (or to the entity named by ForwardDeadLetteredMessagesTo)."""
        if self.is_dead_letter or self.dead_letter is None:
            self.complete(message)  # a dead-lettered dead letter is removed, as in the service
            return
        self._remove(message)
        pairs = []
        if reason is not None:
            pairs.append(
                (typed(AMQPTypes.string, "DeadLetterReason"), typed(AMQPTypes.string, reason))
            )
        if description is not None:
            pairs.append(
                (
                    typed(AMQPTypes.string, "DeadLetterErrorDescription"),
                    typed(AMQPTypes.string, description),
                )
            )
        body = message.body.with_app_properties(pairs) if pairs else message.body
        target = self.broker.forward_target(self.settings.forward_dead_lettered_to)
        if forward and target is not None:
            _LOG.debug(
                "entity=%s message_id=%s sequence=%s outcome=dead-letter-forwarded to=%s",
                self.path,
                message.message_id,
                message.sequence_number,
                target.path,
            )
            try:
                target.accept(body, self.broker.clock(), hops=1)
                target.pump()
                return
            except BrokerError as exc:  # the target refuses it: keep it in our own DLQ
                _LOG.warning("cannot forward a dead letter to %s: %s", target.path, exc)
        dead = StoredMessage(
            sequence_number=message.sequence_number,
            body=body,
            enqueued_ms=message.enqueued_ms,
            expires_ms=None,  # dead letters do not expire
            delivery_count=message.delivery_count,
            dead_letter_source=self.path,
        )
        self.dead_letter._add(dead)
        _LOG.debug(
            "entity=%s message_id=%s sequence=%s delivery_count=%s outcome=dead-lettered reason=%s",
            self.path,
            message.message_id,
            message.sequence_number,
            message.delivery_count,
            reason,
        )
        self.dead_letter.pump()

    def expire(self, message: StoredMessage) -> None:
        """End a message's time to live: dead-letter it where configured, else drop it."""
        _LOG.debug(
            "entity=%s message_id=%s sequence=%s outcome=expired",
            self.path,
            message.message_id,
            message.sequence_number,
        )
        if self.settings.dead_letter_on_expiration:
            self.move_to_dead_letter(
                message, REASON_TTL, "The message expired and was dead lettered."
            )
        else:
            self._remove(message)


class Topic:
    """A topic: it holds nothing itself, and gives each subscription a copy of every
    message its rules match (one copy for the rules without action, one more per
    matching rule with an action, as Service Bus does)."""

    is_dead_letter = False
    is_subscription = False
    sessionful = False

    def __init__(self, broker: Broker, settings: TopicSettings) -> None:
        self.broker = broker
        self.settings = settings
        self.path = settings.name
        self.subscriptions: list[Queue] = []
        self.next_sequence_number = 1
        self.duplicates: OrderedDict[str, int] = OrderedDict()
        # Topic sequence number of a scheduled message -> its copies, so it can be cancelled.
        self.scheduled: dict[int, list[tuple[Queue, int]]] = {}
        self.messages: dict[int, StoredMessage] = {}  # always empty: for flow's "available"

    @property
    def journal_name(self) -> str:
        return self.path.lower()

    def check(self, body: ParsedMessage) -> None:
        check_message_size(body)

    def _copies(self, body: ParsedMessage, sequence_number: int) -> list[tuple[Queue, Any]]:
        """(subscription, copy or FilterEvaluationError) for every copy the rules make."""
        system = system_properties(body)
        user = app_properties(body)

        def view() -> MessageView:
            values = {sql: system.get(name) for sql, name in SYSTEM_PROPERTIES.items()}
            values.update(sequencenumber=sequence_number, deliverycount=0, size=body.size)
            return MessageView(values, dict(user))

        copies: list[tuple[Queue, Any]] = []
        for subscription in self.subscriptions:
            try:
                views = evaluate_rules(list(subscription.settings.rules), view)
            except FilterEvaluationError as exc:
                if subscription.settings.dead_letter_on_filter_exceptions:
                    copies.append((subscription, exc))
                continue
            for matched in views or []:
                if not (matched.set_system or matched.set_user or matched.removed_user):
                    copy = body
                else:
                    copy = with_changes(
                        body,
                        {SYSTEM_PROPERTIES[k]: v for k, v in matched.set_system.items()},
                        matched.set_user,
                        matched.removed_user,
                    )
                subscription.check(copy)
                copies.append((subscription, copy))
        return copies

    def add_demand(self, body: ParsedMessage, now_ms: int, hops: int, demand: Demand) -> None:
        """Add to `demand` what `accept(body, now_ms, hops=hops)` would store in the
        subscriptions (and where they forward to); nothing is stored."""
        self.check(body)
        if self._is_duplicate(body.message_id, now_ms):
            return
        self._add_copies_demand(
            body, self._copies(body, self.next_sequence_number), now_ms, hops, demand
        )

    @staticmethod
    def _add_copies_demand(
        body: ParsedMessage, copies: list[tuple[Queue, Any]], now_ms: int, hops: int, demand: Demand
    ) -> None:
        for subscription, copy in copies:
            if isinstance(copy, FilterEvaluationError):
                subscription.add_own_demand(body, now_ms, demand)  # stored, then dead-lettered
            else:
                subscription.add_demand(copy, now_ms, hops, demand)

    @staticmethod
    def _check_demand(demand: Demand) -> None:
        """Refuse the whole send if any subscription (or forwarding target) lacks room:
        a send to a topic is atomic in Service Bus, every subscription gets its copy or
        the sender gets the error and nothing is kept, so its retry is not a duplicate."""
        for queue, (count, size) in demand.items():
            queue.check_room(count, size)

    def accept_batch(self, bodies: list[ParsedMessage], now_ms: int) -> None:
        for body in bodies:
            self.check(body)
        planned = []
        demand: Demand = {}
        for body in bodies:
            if self._is_duplicate(body.message_id, now_ms):
                planned.append((body, None))
                continue
            # Evaluate every subscription first: a copy a subscription refuses (no SessionId
            # for a session subscription, no room) fails the whole send, before anything is stored.
            copies = self._copies(body, self.next_sequence_number + len(planned))
            self._add_copies_demand(body, copies, now_ms, 0, demand)
            planned.append((body, copies))
        self._check_demand(demand)
        for body, copies in planned:
            self._fan_out(body, copies, now_ms, None)
        self.pump()

    def accept(
        self,
        body: ParsedMessage,
        now_ms: int,
        scheduled_ms: int | None = None,
        hops: int = 0,
    ) -> int | None:
        """Take one message (sent, scheduled, or forwarded here); return its sequence number."""
        self.check(body)
        if self._is_duplicate(body.message_id, now_ms):
            return None
        copies = self._copies(body, self.next_sequence_number)
        demand: Demand = {}
        self._add_copies_demand(body, copies, now_ms, hops, demand)
        self._check_demand(demand)
        return self._fan_out(body, copies, now_ms, scheduled_ms, hops)

    def _fan_out(
        self,
        body: ParsedMessage,
        copies: list[tuple[Queue, Any]] | None,
        now_ms: int,
        scheduled_ms: int | None,
        hops: int = 0,
    ) -> int | None:
        if copies is None:
            _LOG.debug(
                "entity=%s message_id=%s outcome=duplicate-dropped", self.path, body.message_id
            )
            return None
        sequence_number = self.next_sequence_number
        self.next_sequence_number += 1
        self.broker.journal.put_sequence(self.journal_name, self.next_sequence_number)
        stored: list[tuple[Queue, int]] = []
        for subscription, copy in copies:
            if isinstance(copy, FilterEvaluationError):
                number = subscription._store(body, now_ms, None)
                message = subscription.messages.get(number) if number is not None else None
                if message is not None:
                    subscription.move_to_dead_letter(message, REASON_FILTER, str(copy))
                continue
            number = subscription.accept(copy, now_ms, scheduled_ms, hops)
            if number is not None:
                stored.append((subscription, number))
        # Only a send that reached every subscription counts for duplicate detection
        # (the caller checked their room first), so a refused send can be retried.
        self._remember_duplicate(body.message_id, now_ms)
        if scheduled_ms is not None and scheduled_ms > now_ms:
            self.scheduled[sequence_number] = stored
        _LOG.debug(
            "entity=%s message_id=%s sequence=%s outcome=fanned-out copies=%s",
            self.path,
            body.message_id,
            sequence_number,
            ",".join(s.path for s, _ in stored) or "none",
        )
        return sequence_number

    def cancel_scheduled(self, sequence_numbers: Iterable[int]) -> None:
        for sequence_number in sequence_numbers:
            for subscription, number in self.scheduled.pop(sequence_number, []):
                subscription.cancel_scheduled([number])

    def pump(self) -> None:
        for subscription in self.subscriptions:
            subscription.pump()

    def _is_duplicate(self, message_id: str | None, now_ms: int) -> bool:
        if not self.settings.requires_duplicate_detection or message_id is None:
            return False
        horizon = now_ms - int(self.settings.duplicate_window * 1000)
        while self.duplicates and next(iter(self.duplicates.values())) < horizon:
            self.duplicates.popitem(last=False)
        return message_id in self.duplicates

    def _remember_duplicate(self, message_id: str | None, now_ms: int) -> None:
        if not self.settings.requires_duplicate_detection or message_id is None:
            return
        self.duplicates[message_id] = now_ms
        self.duplicates.move_to_end(message_id)
        self.broker.journal.put_duplicate(self.journal_name, message_id, now_ms)


Entity = Queue | Topic


class Broker:
    """All queues and topics of the emulated namespace, the lock table and the timers."""

    def __init__(
        self,
        settings: Iterable[QueueSettings | TopicSettings],
        journal: Journal | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.clock = clock
        self.journal: Journal = journal or NullJournal()
        self.queues: dict[str, Queue] = {}
        self.topics: dict[str, Topic] = {}
        self.locks: dict[uuid.UUID, Lock] = {}
        # Tokens of message locks that ended with their session lock: settling one is
        # a session-lock-lost error, as on Service Bus, not a message-lock-lost one.
        self.lost_session_tokens: OrderedDict[uuid.UUID, None] = OrderedDict()
        self._timers: list[_Timer] = []
        self._timer_order = itertools.count()
        for entity_settings in settings:
            if isinstance(entity_settings, TopicSettings):
                topic = Topic(self, entity_settings)
                self.topics[topic.journal_name] = topic
                topic.subscriptions = [self._add_queue(s) for s in entity_settings.subscriptions]
            else:
                self._add_queue(entity_settings)

    def _add_queue(self, queue_settings: QueueSettings) -> Queue:
        queue = Queue(self, queue_settings, queue_settings.name)
        dead_letter = Queue(
            self, queue_settings, f"{queue_settings.name}/$DeadLetterQueue", parent=queue
        )
        queue.dead_letter = dead_letter
        self.queues[queue.journal_name] = queue
        self.queues[dead_letter.journal_name] = dead_letter
        return queue

    @property
    def queue_count(self) -> int:
        return sum(
            1 for q in self.queues.values() if not q.is_dead_letter and not q.is_subscription
        )

    def entity(self, journal_name: str) -> Entity | None:
        return self.queues.get(journal_name) or self.topics.get(journal_name)

    def forward_target(self, name: str | None) -> Entity | None:
        """The queue or topic a ForwardTo / ForwardDeadLetteredMessagesTo names."""
        return self.entity(name.lower()) if name else None

    def resolve(self, address: str | bytes | None) -> Queue | None:
        """The queue an AMQP address names (`amqps://host/orders`, `orders/$DeadLetterQueue`, ...)."""
        if address is None:
            return None
        if isinstance(address, bytes):
            address = address.decode("utf-8", "replace")
        path = address
        if "://" in path:
            path = path.split("://", 1)[1]
            path = path.split("/", 1)[1] if "/" in path else ""
        path = path.strip("/").lower()
        return self.queues.get(path)

    def resolve_entity(self, address: str | bytes | None) -> Entity | None:
        """The queue, subscription or topic an AMQP address names."""
        queue = self.resolve(address)
        if queue is not None or address is None:
            return queue
        if isinstance(address, bytes):
            address = address.decode("utf-8", "replace")
        if "://" in address:
            address = address.split("://", 1)[1]
            address = address.split("/", 1)[1] if "/" in address else ""
        return self.topics.get(address.strip("/").lower())

    # -- locks -----------------------------------------------------------

    def lock(
        self,
        queue: Queue,
        message: StoredMessage,
        now_ms: int,
        session: MessageSession | None = None,
    ) -> Lock:
        """Peek-lock a message; under a session lock it lasts exactly as long as the session's."""
        lock = Lock(
            token=new_lock_token(),
            queue=queue,
            message=message,
            locked_until_ms=session.locked_until_ms
            if session is not None
            else now_ms + int(queue.settings.lock_duration * 1000),
            session=session,
        )
        message.state = LOCKED
        message.lock = lock
        self.locks[lock.token] = lock
        if session is not None:
            session.locks.add(lock.token)
        else:
            self.add_timer(lock.locked_until_ms, "lock", lock)
        return lock

    def hold_session(
        self, queue: Queue, session: MessageSession, consumer: Consumer, now_ms: int
    ) -> None:
        session.holder = consumer
        session.locked_until_ms = now_ms + int(queue.settings.lock_duration * 1000)
        self.add_timer(session.locked_until_ms, "session", (queue, session))

    def renew_session(self, queue: Queue, session_id: str | None) -> int:
        """Extend a held session's lock (and its messages' locks); return the new expiry."""
        session = queue.held_session(session_id)
        session.locked_until_ms = self.clock() + int(queue.settings.lock_duration * 1000)
        for token in session.locks:
            lock = self.locks.get(token)
            if lock is not None:
                lock.locked_until_ms = session.locked_until_ms
        self.add_timer(session.locked_until_ms, "session", (queue, session))
        return session.locked_until_ms

    def _end_lock(self, token: uuid.UUID) -> Lock:
        lock = self.locks.pop(token, None)
        if lock is None and token in self.lost_session_tokens:
            raise SessionLockLost(
                "The session lock has expired on the session. Accept a new session."
            )
        if lock is None:
            raise LockLost(
                "The lock supplied is invalid. Either the lock expired, or the message has already been "
                "removed from the queue."
            )
        lock.message.lock = None
        if lock.session is not None:
            lock.session.locks.discard(token)
        if lock.on_end is not None:
            lock.on_end()
        return lock

    def renew(self, token: uuid.UUID) -> int:
        lock = self.locks.get(token)
        if lock is None:
            raise LockLost(
                "The lock supplied is invalid. Either the lock expired, or the message has already been removed."
            )
        lock.locked_until_ms = self.clock() + int(lock.queue.settings.lock_duration * 1000)
        self.add_timer(lock.locked_until_ms, "lock", lock)
        return lock.locked_until_ms

    def settle(
        self,
        token: uuid.UUID,
        outcome: str,
        reason: str | None = None,
        description: str | None = None,
    ) -> None:
        """Apply a receiver's outcome to a locked message.

        Args:
            token: The lock token.
            outcome: complete, abandon, defer, dead-letter or release.
            reason: Dead-letter reason.
            description: Dead-letter description.
        """
        lock = self._end_lock(token)
        queue, message = lock.queue, lock.message
        _LOG.debug(
            "entity=%s message_id=%s sequence=%s delivery_count=%s outcome=%s",
            queue.path,
            message.message_id,
            message.sequence_number,
            message.delivery_count,
            outcome,
        )
        if outcome == "complete":
            queue.complete(message)
        elif outcome == "abandon":
            queue.abandon(message)
        elif outcome == "release":
            queue.abandon(message, count_delivery=False)
        elif outcome == "defer":
            queue.defer(message)
        elif outcome == "dead-letter":
            queue.move_to_dead_letter(message, reason, description)
        else:
            raise ValueError(f"unknown outcome {outcome!r}")

    # -- timers ----------------------------------------------------------

    def add_timer(self, due_ms: int | None, kind: str, target: object) -> None:
        if due_ms is None:
            return
        heapq.heappush(self._timers, _Timer(due_ms, next(self._timer_order), kind, target))
        if len(self._timers) > 10_000 and len(self._timers) > 4 * self._live_objects():
            self._compact_timers()

    def _live_objects(self) -> int:
        return len(self.locks) + sum(len(q.messages) for q in self.queues.values())

    def _timer_alive(self, timer: _Timer) -> bool:
        if timer.kind == "lock":
            return self.locks.get(timer.target.token) is timer.target  # type: ignore[attr-defined]
        if timer.kind == "session":
            queue, session = timer.target  # type: ignore[misc]
            return session.holder is not None
        queue, message = timer.target  # type: ignore[misc]
        return queue.messages.get(message.sequence_number) is message

    def _compact_timers(self) -> None:
        """Drop timers of settled messages and ended locks.

        A completed message's expiry timer would otherwise sit in the heap until its
        time to live (days by default), so memory would grow with every message ever sent.
        """
        self._timers = [t for t in self._timers if self._timer_alive(t)]
        heapq.heapify(self._timers)

    def next_timer_ms(self) -> int | None:
        return self._timers[0].due_ms if self._timers else None

    def run_timers(self) -> None:
        """Fire every timer that is due: lock expiry, scheduled enqueue, time to live."""
        now_ms = self.clock()
        touched: set[Queue] = set()
        while self._timers and self._timers[0].due_ms <= now_ms:
            timer = heapq.heappop(self._timers)
            if timer.kind == "lock":
                self._lock_timer(timer.target, now_ms, touched)  # type: ignore[arg-type]
            elif timer.kind == "scheduled":
                queue, message = timer.target  # type: ignore[misc]
                if (
                    queue.messages.get(message.sequence_number) is message
                    and message.state == SCHEDULED
                ):
                    message.state = AVAILABLE
                    message.scheduled_ms = None
                    queue.make_available(message)
                    self.add_timer(message.expires_ms, "expiry", (queue, message))
                    touched.add(queue)
            elif timer.kind == "session":
                queue, session = timer.target  # type: ignore[misc]
                holder = session.holder
                if holder is not None and session.locked_until_ms <= now_ms:
                    _LOG.debug(
                        "entity=%s session=%s outcome=session-lock-expired",
                        queue.path,
                        session.session_id,
                    )
                    queue.release_session(session)
                    holder.session_lost()
            elif timer.kind == "expiry":
                queue, message = timer.target  # type: ignore[misc]
                if queue.messages.get(message.sequence_number) is message and message.state in (
                    AVAILABLE,
                    DEFERRED,
                ):
                    queue.expire(message)
        for queue in touched:
            queue.pump()

    def _lock_timer(self, lock: Lock, now_ms: int, touched: set[Queue]) -> None:
        if self.locks.get(lock.token) is not lock:
            return  # settled already
        if lock.locked_until_ms > now_ms:
            return  # renewed: a later timer exists
        _LOG.debug(
            "entity=%s message_id=%s sequence=%s delivery_count=%s outcome=lock-expired",
            lock.queue.path,
            lock.message.message_id,
            lock.message.sequence_number,
            lock.message.delivery_count,
        )
        self._end_lock(lock.token)
        lock.queue.abandon(lock.message)
        touched.add(lock.queue)
