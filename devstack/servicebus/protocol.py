"""One AMQP 1.0 connection, in the Service Bus dialect the SDK speaks.

Layers, as the SDK uses them: SASL ANONYMOUS, then open, sessions (begin),
links (attach). Three kinds of link exist on the broker side:

- entity links: a client sender's messages go into a queue; a client
  receiver becomes a consumer of a queue or its dead-letter sub-queue;
- `$cbs`: put-token requests, always accepted (the emulator has no auth);
- `<entity>/$management`: request/response operations (management.py).

Requests arrive on a link the client sends on and are answered on the
broker's sending link on the same connection whose source address is the
request link's target (that is how the SDK pairs them; CBS requests carry no
reply-to).

Flow control follows AMQP: a consumer gets messages only while it has link
credit and the session's incoming window is open. Settlement follows the
notes in docs/servicebus-emulator.md: in PEEK_LOCK the client's disposition
is unsettled and the broker echoes a settled one with the outcome it applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import uuid
from typing import TYPE_CHECKING, Any

from . import http_refusal, management
from .codec import (
    AMQP_HEADER,
    BATCH_FORMAT,
    SASL_HEADER,
    Accepted,
    AMQPError,
    AMQPTypes,
    Modified,
    Rejected,
    Released,
    Source,
    Target,
    decode_frame,
    decode_payload,
    encode_amqp_frame,
    encode_response,
    parse_message,
    request_message_id_raw,
    typed,
)
from .codec import (
    performatives as pf,
)
from .entities import (
    MAX_MESSAGE_SIZE,
    BrokerError,
    Entity,
    Lock,
    LockLost,
    MessageSession,
    Queue,
    SessionLockLost,
    StoredMessage,
    Topic,
)

if TYPE_CHECKING:
    from .server import EmulatorServer

_LOG = logging.getLogger("devstack.servicebus")

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
SASL_INIT = 0x41

MAX_FRAME_SIZE = 256 * 1024
SESSION_WINDOW = 5000
LINK_CREDIT = 1000
NOT_FOUND = b"amqp:not-found"
NOT_ALLOWED = b"amqp:not-allowed"
NOT_IMPLEMENTED = b"amqp:not-implemented"
SESSION_FILTER = b"com.microsoft:session-filter"
SESSION_LOCKED_UNTIL = b"com.microsoft:locked-until-utc"
OPERATION_TIMEOUT = b"com.microsoft:timeout"  # link property: how long to wait for a session
TIMEOUT = b"com.microsoft:timeout"
DATETIMEOFFSET_EPOCH = 621355968000000000  # .NET ticks at the Unix epoch
DEFAULT_SESSION_WAIT_MS = 60_000  # the service's wait for a next-available session
TRANSFER_DESTINATION = b"com.microsoft:transfer-destination-address"
ROLE_SENDER, ROLE_RECEIVER = False, True
SETTLE_MODE_SETTLED = 1


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _address(terminus: Any) -> str | None:
    if not terminus:
        return None
    return _text(terminus[0])


def is_coordinator(terminus: Any) -> bool:
    """Whether an attach's target is a transaction coordinator, not a node address.

    The codec drops descriptors: a target's first field is its address (a string), a
    coordinator's is its capabilities (an array of symbols).
    """
    return (
        isinstance(terminus, (list, tuple))
        and bool(terminus)
        and isinstance(terminus[0], (list, tuple))
    )


def _normalise(address: str | None) -> str:
    """Compare addresses without scheme and host: the SDK mixes `amqps://host/x` and `x`."""
    if not address:
        return ""
    if "://" in address:
        rest = address.split("://", 1)[1]
        address = rest.split("/", 1)[1] if "/" in rest else ""
    return address.strip("/").lower()


class Link:
    """A link as the broker sees it.

    Attributes:
        session: The owning session.
        name: The link name.
        handle: The client's handle, also used as ours (handles are per-session and unique).
        role: The broker's role (ROLE_SENDER when the client receives).
        address: The entity-side address (source if we send, target if we receive).
        kind: "queue", "cbs" or "management".
        queue: The queue of a queue link, or of a management link.
    """

    def __init__(
        self,
        session: Session,
        name: Any,
        handle: int,
        role: bool,
        address: str | None,
        kind: str,
        queue: Entity | None,
        peek_lock: bool = True,
    ) -> None:
        self.session = session
        self.name = name
        self.handle = handle
        self.role = role
        self.address = address
        self.kind = kind
        self.queue = queue
        self.peek_lock = peek_lock
        self.detached = False
        # Sender side (we send): AMQP link credit bookkeeping.
        self.delivery_count = 0
        self.credit = 0
        self.drain = False
        # Receiver side (we receive): the credit we granted and a partial transfer.
        self.received = 0
        self.granted = 0
        self.partial: bytearray | None = None
        self.partial_first: list[Any] | None = None
        self.attach_fields: list[Any] = []
        # Session receivers: the session this link holds, and its wait for one.
        self.message_session: MessageSession | None = None
        self.session_wait: asyncio.TimerHandle | None = None

    # -- the Consumer protocol of entities.Queue --------------------------

    def has_credit(self) -> bool:
        return (
            not self.detached
            and self.credit > 0
            and self.session.remote_incoming_window > 0
            and not self.session.connection.closed
        )

    def deliver(self, _message: StoredMessage, payload: bytes, lock: Lock | None) -> None:
        tag = lock.token.bytes_le if lock else uuid.uuid4().bytes_le
        delivery_id = self.session.send_transfer(self, payload, tag, settled=lock is None)
        self.delivery_count += 1
        self.credit -= 1
        if lock is not None:
            self.session.unsettled[delivery_id] = (lock.token, self)

    def session_granted(self, session: MessageSession) -> None:
        self.session.connection.session_granted(self, session)

    def session_lost(self) -> None:
        self.session.connection.session_lost(self)

    def forget(self) -> None:
        """The link is gone: stop consuming, give back its session, stop waiting for one."""
        self.detached = True
        if self.session_wait is not None:
            self.session_wait.cancel()
            self.session_wait = None
        if self.queue is not None and self.kind == "queue" and self.role == ROLE_SENDER:
            self.queue.remove_consumer(self)


class Session:
    """An AMQP session: links, transfer ids and windows."""

    def __init__(
        self,
        connection: Connection,
        channel: int,
        remote_next_outgoing_id: int,
        remote_incoming_window: int,
    ) -> None:
        self.connection = connection
        self.channel = channel
        self.links: dict[int, Link] = {}
        self.next_outgoing_id = 0
        self.next_incoming_id = remote_next_outgoing_id
        self.incoming_window = SESSION_WINDOW
        self.remote_incoming_window = remote_incoming_window
        self.unsettled: dict[int, tuple[uuid.UUID, Link]] = {}  # delivery id -> lock, link

    def send(self, performative: Any) -> None:
        self.connection.send(self.channel, performative)

    def send_transfer(
        self, link: Link, payload: bytes, tag: bytes, settled: bool, message_format: int = 0
    ) -> int:
        """Send one delivery, split into frames that fit the client's max frame size."""
        delivery_id = self.next_outgoing_id
        self.next_outgoing_id += 1
        self.remote_incoming_window -= 1
        limit = self.connection.remote_max_frame_size - 256
        offset = 0
        first = True
        while True:
            chunk = payload[offset : offset + limit]
            offset += len(chunk)
            more = offset < len(payload)
            self.send(
                pf.TransferFrame(
                    handle=link.handle,
                    delivery_id=delivery_id if first else None,
                    delivery_tag=tag if first else None,
                    message_format=message_format if first else None,
                    settled=settled,
                    more=more,
                    payload=chunk,
                )
            )
            first = False
            if not more:
                return delivery_id

    def send_flow(self, link: Link | None = None, echo: bool = False) -> None:
        fields: dict[str, Any] = {
            "next_incoming_id": self.next_incoming_id,
            "incoming_window": self.incoming_window,
            "next_outgoing_id": self.next_outgoing_id,
            "outgoing_window": SESSION_WINDOW,
        }
        if link is not None:
            fields["handle"] = link.handle
            if link.role == ROLE_SENDER:
                fields.update(
                    delivery_count=link.delivery_count,
                    link_credit=link.credit,
                    available=len(link.queue.messages) if link.queue else 0,
                    drain=link.drain,
                )
            else:
                fields.update(
                    delivery_count=link.received, link_credit=link.granted - link.received
                )
        fields["echo"] = echo
        self.send(pf.FlowFrame(**fields))

    def reply_link(self, address: str | None) -> Link | None:
        """The broker's sending link, anywhere on the connection, whose source is `address`."""
        wanted = _normalise(address)
        for session in [self, *self.connection.sessions.values()]:
            for link in session.links.values():
                if (
                    link.role == ROLE_SENDER
                    and link.kind != "queue"
                    and _normalise(link.address) == wanted
                ):
                    return link
        return None


class Connection:
    """One client connection: reads frames, dispatches them, writes replies."""

    def __init__(
        self, server: EmulatorServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ):
        self.server = server
        self.broker = server.broker
        self.reader = reader
        self.writer = writer
        self.sessions: dict[int, Session] = {}
        self.remote_max_frame_size = 512
        self.closed = False
        self._out = bytearray()
        self._flush_scheduled = False
        self._heartbeat: asyncio.Task | None = None

    # -- output -------------------------------------------------------------

    def send(self, channel: int, performative: Any, frame_type: int = 0) -> None:
        if self.closed:
            return
        self._out += encode_amqp_frame(channel, performative, frame_type)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Write buffered frames once the current batch of work is journaled."""
        self._flush_scheduled = False
        # Acknowledge nothing before it is durable: the journal commits first.
        self.broker.journal.flush()
        if self._out and not self.closed:
            self.writer.write(bytes(self._out))
        self._out.clear()

    # -- input --------------------------------------------------------------

    async def _read_frame(self) -> tuple[int, int, int | None, list[Any] | None]:
        head = await self.reader.readexactly(8)
        size, doff, frame_type, channel = struct.unpack(">IBBH", head)
        body = await self.reader.readexactly(size - 8) if size > 8 else b""
        body = body[doff * 4 - 8 :]
        if not body:
            return frame_type, channel, None, None  # heartbeat
        code, fields = decode_frame(memoryview(body))
        return frame_type, channel, code, fields

    async def _handshake(self) -> bool:
        header = await self.reader.readexactly(8)
        if http_refusal.is_http(header):
            # The management REST API (ServiceBusAdministrationClient), not AMQP.
            await http_refusal.answer(header, self.reader, self.writer)
            return False
        if header == SASL_HEADER:
            self.writer.write(SASL_HEADER)
            # ANONYMOUS is what the SDK uses with a development-emulator connection string.
            mechanisms = pf.SASLMechanism(
                sasl_server_mechanisms=[b"ANONYMOUS", b"MSSBCBS", b"PLAIN", b"EXTERNAL"]
            )
            self.writer.write(encode_amqp_frame(0, mechanisms, frame_type=1))
            _, _, code, _ = await self._read_frame()
            if code != SASL_INIT:
                return False
            self.writer.write(
                encode_amqp_frame(0, pf.SASLOutcome(code=0, additional_data=None), frame_type=1)
            )
            header = await self.reader.readexactly(8)
        self.writer.write(AMQP_HEADER)
        return header == AMQP_HEADER

    async def run(self) -> None:
        try:
            if not await self._handshake():
                return
            while not self.closed:
                _, channel, code, fields = await self._read_frame()
                if code is None:
                    continue
                self._dispatch(channel, code, fields)
                if len(self._out) > 1 << 20:
                    self._flush()
                    await self.writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception:  # a bug here must not take the broker down: drop this connection only
            _LOG.exception("connection failed")
        finally:
            self._teardown()

    def _teardown(self) -> None:
        if self._out and not self.closed:
            self._flush()
        self.closed = True
        if self._heartbeat:
            self._heartbeat.cancel()
        for session in list(self.sessions.values()):
            self._drop_session(session)
        self.sessions.clear()
        with contextlib.suppress(Exception):  # the socket may already be gone
            self.writer.close()
        self.server.forget(self)

    def _drop_session(self, session: Session) -> None:
        # Locks outlive the link: an abruptly closed client's messages return at lock expiry.
        for link in list(session.links.values()):
            link.forget()

    def _dispatch(self, channel: int, code: int, fields: list[Any]) -> None:
        if code == OPEN:
            self._on_open(fields)
        elif code == BEGIN:
            self._on_begin(channel, fields)
        elif code == CLOSE:
            self.send(0, pf.CloseFrame(error=None))
            self._flush()
            self.closed = True
        else:
            session = self.sessions.get(channel)
            if session is None:
                return
            if code == ATTACH:
                self._on_attach(session, fields)
            elif code == FLOW:
                self._on_flow(session, fields)
            elif code == TRANSFER:
                self._on_transfer(session, fields)
            elif code == DISPOSITION:
                self._on_disposition(session, fields)
            elif code == DETACH:
                self._on_detach(session, fields)
            elif code == END:
                self._drop_session(session)
                del self.sessions[channel]
                session.send(pf.EndFrame(error=None))

    # -- connection and session ----------------------------------------------

    def _on_open(self, fields: list[Any]) -> None:
        self.remote_max_frame_size = min(fields[2] or MAX_FRAME_SIZE, 1 << 24)
        self.send(
            0,
            pf.OpenFrame(
                container_id="devstack-servicebus",
                hostname=None,
                max_frame_size=MAX_FRAME_SIZE,
                channel_max=65535,
                idle_timeout=None,
                outgoing_locales=None,
                incoming_locales=None,
                offered_capabilities=None,
                desired_capabilities=None,
                properties=None,
            ),
        )
        idle_ms = fields[4]
        if idle_ms:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat(idle_ms / 2000))

    async def _beat(self, interval: float) -> None:
        """Empty frames keep a client with an idle timeout from closing the connection."""
        while not self.closed:
            await asyncio.sleep(interval)
            if not self.closed:
                self.writer.write(b"\x00\x00\x00\x08\x02\x00\x00\x00")

    def _on_begin(self, channel: int, fields: list[Any]) -> None:
        session = Session(self, channel, fields[1] or 0, fields[2] or 0)
        self.sessions[channel] = session
        session.send(
            pf.BeginFrame(
                remote_channel=channel,
                next_outgoing_id=0,
                incoming_window=SESSION_WINDOW,
                outgoing_window=SESSION_WINDOW,
                handle_max=65535,
                offered_capabilities=None,
                desired_capabilities=None,
                properties=None,
            )
        )

    # -- links ------------------------------------------------------------------

    def _on_attach(self, session: Session, fields: list[Any]) -> None:
        name, handle, client_role = fields[0], fields[1], fields[2]
        snd_mode = fields[3]
        source, target = _address(fields[5]), _address(fields[6])
        role = not client_role  # the broker takes the opposite role
        address = source if role == ROLE_SENDER else target
        kind, queue = self._classify(address)
        peek_lock = snd_mode != SETTLE_MODE_SETTLED
        link = Link(session, name, handle, role, address, kind, queue, peek_lock=peek_lock)
        link.attach_fields = fields
        session.links[handle] = link
        if role == ROLE_RECEIVER and is_coordinator(fields[6]):
            self._refuse(
                link,
                NOT_IMPLEMENTED,
                "Transactions (a link to the AMQP transaction coordinator) are not supported "
                "by this emulator.",
            )
            return
        if kind == "missing":
            self._refuse(link, NOT_FOUND, f"The messaging entity '{address}' could not be found.")
            return
        refusal = self._refusal(link, fields)
        if refusal is not None:
            self._refuse(link, *refusal)
            return
        if kind == "queue" and role == ROLE_SENDER and queue is not None and queue.sessionful:
            self._attach_session_receiver(link, queue, fields)
            return
        self._send_attach(link)
        if role == ROLE_RECEIVER:
            link.granted = LINK_CREDIT
            session.send_flow(link)
        elif kind == "queue" and queue is not None:
            queue.add_consumer(link)

    def _send_attach(
        self,
        link: Link,
        refused: bool = False,
        filters: dict[bytes, Any] | None = None,
        properties: dict[bytes, Any] | None = None,
    ) -> None:
        fields = link.attach_fields
        source, target = _address(fields[5]), _address(fields[6])
        link.session.send(
            pf.AttachFrame(
                name=link.name,
                handle=link.handle,
                role=link.role,
                send_settle_mode=fields[3],
                rcv_settle_mode=fields[4],
                # The SDK detaches (and waits for an error) unless both termini come back; for a
                # refused link the broker's own terminus is null, as the service does.
                source=None
                if refused and link.role == ROLE_SENDER
                else Source(source or "", *([None] * 6), filters, None, None, None),
                target=None
                if refused and link.role == ROLE_RECEIVER
                else Target(target or "", *([None] * 6)),
                unsettled=None,
                incomplete_unsettled=None,
                initial_delivery_count=0 if link.role == ROLE_SENDER else None,
                max_message_size=MAX_MESSAGE_SIZE if link.role == ROLE_RECEIVER else None,
                offered_capabilities=None,
                desired_capabilities=None,
                properties=properties,
            )
        )

    def _refuse(
        self, link: Link, condition: bytes, description: str, attached: bool = False
    ) -> None:
        """Answer an attach with an error at once, so the SDK raises it instead of waiting for a
        timeout or, worse, working on a link that does not do what it asked for."""
        link.detached = True
        link.session.links.pop(link.handle, None)
        if not attached:
            self._send_attach(link, refused=True)
        _LOG.info("refused link %r to %s: %s", _text(link.name), link.address, description)
        link.session.send(
            pf.DetachFrame(
                handle=link.handle,
                closed=True,
                error=AMQPError(condition=condition, description=description, info=None),
            )
        )

    # -- session receivers ------------------------------------------------------

    def _attach_session_receiver(self, link: Link, queue: Queue, fields: list[Any]) -> None:
        """Lock the asked-for session (or the next one with messages) before answering the attach."""
        wanted = fields[5][7][SESSION_FILTER]
        session_id = _text(wanted)
        try:
            granted = queue.acquire_session(session_id, link)
        except BrokerError as exc:
            self._refuse(link, exc.condition, exc.description)
            return
        if granted is not None:
            self.session_granted(link, granted)
            return
        # No session has messages: wait, as the service does, up to the client's operation
        # timeout (the SDK sends it when max_wait_time is set) or the service's default.
        properties = fields[13] if len(fields) > 13 and isinstance(fields[13], dict) else {}
        timeout_ms = properties.get(OPERATION_TIMEOUT) or DEFAULT_SESSION_WAIT_MS
        queue.wait_for_session(link)
        link.session_wait = asyncio.get_running_loop().call_later(
            timeout_ms / 1000, self._session_wait_ended, link, queue
        )

    def session_granted(self, link: Link, granted: MessageSession) -> None:
        if link.session_wait is not None:
            link.session_wait.cancel()
            link.session_wait = None
        if link.detached or self.closed:
            # The client gave up while we looked: give the session back.
            link.queue.remove_consumer(link)  # type: ignore[union-attr]
            return
        self._send_attach(
            link,
            filters={SESSION_FILTER: granted.session_id},
            properties={
                SESSION_LOCKED_UNTIL: typed(
                    AMQPTypes.long, granted.locked_until_ms * 10_000 + DATETIMEOFFSET_EPOCH
                )
            },
        )
        link.queue.add_consumer(link)  # type: ignore[union-attr]
        link.queue.pump()  # type: ignore[union-attr]

    def _session_wait_ended(self, link: Link, queue: Queue) -> None:
        link.session_wait = None
        if link in queue.session_waiters:
            queue.session_waiters.remove(link)
            self._refuse(
                link,
                TIMEOUT,
                f"No session with messages became available on '{queue.path}' in time "
                "(next-available session receiver).",
            )
            self._flush()

    def session_lost(self, link: Link) -> None:
        """The session lock expired: close the link with session-lock-lost, as the service does."""
        if link.detached:
            return
        link.queue.remove_consumer(link)  # type: ignore[union-attr]
        self._refuse(
            link,
            SessionLockLost.condition,
            "The session lock has expired on the session. Accept a new session.",
            attached=True,
        )
        self._flush()

    def _refusal(self, link: Link, fields: list[Any]) -> tuple[bytes, str] | None:
        """Why an attach asks for something this emulator does not do, or None.

        Refusing at attach, with a description naming the feature, makes the SDK raise a
        clear error when the sender or receiver opens, rather than fail later in a way
        that never mentions the feature.
        """
        source = fields[5] if isinstance(fields[5], (list, tuple)) else None
        filters = source[7] if source is not None and len(source) > 7 else None
        properties = fields[13] if len(fields) > 13 and isinstance(fields[13], dict) else {}
        if link.kind == "queue" and link.role == ROLE_SENDER and isinstance(link.queue, Topic):
            return (
                NOT_ALLOWED,
                f"Cannot receive from the topic '{link.queue.path}': receive from one of its "
                f"subscriptions, '{link.queue.path}/Subscriptions/<name>'.",
            )
        if (
            link.kind == "queue"
            and link.role == ROLE_RECEIVER
            and link.queue is not None
            and link.queue.is_subscription
            and not link.queue.is_dead_letter
        ):
            return (
                NOT_ALLOWED,
                f"Cannot send to the subscription '{link.queue.path}': send to its topic.",
            )
        if link.kind == "queue" and link.role == ROLE_SENDER:
            for key in filters or {}:
                if key != SESSION_FILTER:
                    return (
                        NOT_IMPLEMENTED,
                        f"The link filter '{_text(key)}' is not supported by this emulator; "
                        "only the Service Bus session filter is.",
                    )
            sessionful = link.queue is not None and link.queue.sessionful
            if sessionful and not (filters and SESSION_FILTER in filters):
                return (
                    NOT_ALLOWED,
                    f"It is not possible for the entity '{link.queue.path}', which requires "  # type: ignore[union-attr]
                    "sessions, to create a non-sessionful message receiver; open a session "
                    "receiver (session_id=...).",
                )
            if not sessionful and filters and SESSION_FILTER in filters:
                return (
                    NOT_ALLOWED,
                    f"A sessionful message receiver cannot be created on the entity "
                    f"'{link.queue.path if link.queue else link.address}' because it does not require sessions "
                    "(set RequiresSession in Config.json).",
                )
        if link.kind == "queue" and link.role == ROLE_RECEIVER:
            if link.queue is not None and link.queue.is_dead_letter:
                return (
                    NOT_ALLOWED,
                    f"Cannot send to the dead-letter queue '{link.queue.path}'.",
                )
            if TRANSFER_DESTINATION in properties:
                return (
                    NOT_IMPLEMENTED,
                    "Send-via (transfer destination, used by cross-entity transactions) "
                    "is not supported by this emulator.",
                )
        return None

    def _classify(self, address: str | None) -> tuple[str, Entity | None]:
        path = _normalise(address)
        if path == "$cbs":
            return "cbs", None
        if path.endswith("/$management"):
            entity = self.broker.resolve_entity(path[: -len("/$management")])
            return ("management", entity) if entity is not None else ("missing", None)
        entity = self.broker.resolve_entity(path)
        return ("queue", entity) if entity is not None else ("missing", None)

    def _on_detach(self, session: Session, fields: list[Any]) -> None:
        link = session.links.pop(fields[0], None)
        if link is None:
            return
        link.forget()
        # The link's unsettled deliveries go with it (AMQP 1.0: closing a link ends its state,
        # unsettled map included, is gone): a disposition that names them later is not
        # applied. Their locks stay until they expire, so the message can still be settled
        # through the management link (update-disposition with its lock token), which is
        # what the SDK falls back to; Azure answers that with success
        # (test_queue_message_settle_through_mgmt_link_due_to_broken_receiver_link).
        for delivery_id in [d for d, (_, held) in session.unsettled.items() if held is link]:
            del session.unsettled[delivery_id]
        session.send(pf.DetachFrame(handle=link.handle, closed=True, error=None))

    def _on_flow(self, session: Session, fields: list[Any]) -> None:
        next_incoming_id, incoming_window = fields[0], fields[1]
        base = next_incoming_id if next_incoming_id is not None else 0
        session.remote_incoming_window = base + (incoming_window or 0) - session.next_outgoing_id
        handle = fields[4]
        if handle is None:
            self._pump_session(session)
            return
        link = session.links.get(handle)
        if link is None:
            return
        if link.role == ROLE_SENDER:
            delivery_count, link_credit = fields[5], fields[6]
            if link_credit is not None:
                base_count = delivery_count if delivery_count is not None else link.delivery_count
                link.credit = max(0, base_count + link_credit - link.delivery_count)
            link.drain = bool(fields[8])
            if link.queue is not None and link.kind == "queue":
                link.queue.pump()
            if link.drain and link.credit > 0:
                # Nothing more to send: use up the credit, as drain requires.
                link.delivery_count += link.credit
                link.credit = 0
                session.send_flow(link)
            elif fields[9]:
                session.send_flow(link)
        elif fields[9]:
            session.send_flow(link)

    def _pump_session(self, session: Session) -> None:
        for link in list(session.links.values()):
            if link.kind == "queue" and link.role == ROLE_SENDER and link.queue is not None:
                link.queue.pump()

    # -- incoming transfers -------------------------------------------------

    def _on_transfer(self, session: Session, fields: list[Any]) -> None:
        session.next_incoming_id += 1
        session.incoming_window -= 1
        if session.incoming_window < SESSION_WINDOW // 2:
            session.incoming_window = SESSION_WINDOW
            session.send_flow()
        link = session.links.get(fields[0])
        if link is None or link.role != ROLE_RECEIVER:
            return
        more, payload = fields[5], fields[11]
        if fields[9]:  # aborted
            link.partial = link.partial_first = None
            return
        if link.partial is None:
            link.partial_first = fields
            link.partial = bytearray()
        link.partial += payload
        if more:
            return
        first, data = link.partial_first, bytes(link.partial)
        link.partial = link.partial_first = None
        link.received += 1
        if link.granted - link.received < LINK_CREDIT // 2:
            link.granted = link.received + LINK_CREDIT
            session.send_flow(link)
        self._on_delivery(session, link, first, data)

    def _on_delivery(self, session: Session, link: Link, first: list[Any], data: bytes) -> None:
        delivery_id, message_format, settled = first[1], first[3], first[4]
        if link.kind == "queue":
            state = self._accept_messages(link.queue, data, message_format)
        else:
            state = self._answer_request(session, link, data)
        if not settled:
            session.send(
                pf.DispositionFrame(
                    role=ROLE_RECEIVER,
                    first=delivery_id,
                    last=None,
                    settled=True,
                    state=state,
                    batchable=None,
                )
            )

    def _accept_messages(
        self, queue: Entity | None, data: bytes, message_format: int | None
    ) -> Any:
        assert queue is not None
        try:
            if message_format == BATCH_FORMAT:
                # A batch: every Data section is one complete message, accepted or refused together.
                parts = [
                    parse_message(section)
                    for section in decode_payload(memoryview(data)).data or []
                ]
            else:
                parts = [parse_message(data)]
        except Exception as exc:  # malformed input: refuse it, keep the connection
            _LOG.warning("rejected a malformed message on %s: %r", queue.path, exc)
            return Rejected(
                error=AMQPError(condition=b"amqp:decode-error", description=str(exc), info=None)
            )
        try:
            queue.accept_batch(parts, self.broker.clock())
        except BrokerError as exc:
            return Rejected(
                error=AMQPError(condition=exc.condition, description=exc.description, info=None)
            )
        return Accepted()

    def _answer_request(self, session: Session, link: Link, data: bytes) -> Any:
        """Answer a $cbs or $management request; return the outcome of its delivery."""
        try:
            request = decode_payload(memoryview(data))
            # The reply's correlation-id is the request's message-id with its own AMQP type.
            message_id = request_message_id_raw(data)
        except Exception as exc:  # a request no reply can match: refuse its delivery
            _LOG.warning("refused a request on %s: %s", link.address, exc)
            return Rejected(
                error=AMQPError(condition=b"amqp:decode-error", description=str(exc), info=None)
            )
        properties = request.properties
        reply_to = _text(properties.reply_to) if properties and properties.reply_to else None
        if link.kind == "cbs":
            status = {"status-code": 202, "status-description": "Accepted"}
            payload = encode_response(message_id, status)
        else:
            payload = management.handle(self, link.queue, request)  # type: ignore[arg-type]
            payload = encode_response(message_id, payload.status, payload.value)
        reply = session.reply_link(link.address) or session.reply_link(reply_to)
        if reply is None:
            _LOG.warning("no reply link for request on %s", link.address)
            return Accepted()
        reply.session.send_transfer(reply, payload, uuid.uuid4().bytes_le, settled=True)
        reply.delivery_count += 1
        reply.credit = max(0, reply.credit - 1)
        return Accepted()

    # -- settlement -------------------------------------------------------------

    def _on_disposition(self, session: Session, fields: list[Any]) -> None:
        role, first, last, settled, state = fields[0], fields[1], fields[2], fields[3], fields[4]
        if role != ROLE_RECEIVER or state is None:
            return
        last = first if last is None else last
        for delivery_id in range(first, last + 1):
            held = session.unsettled.pop(delivery_id, None)
            if held is None:
                if settled:
                    continue
                # Settled twice, or never locked: answer rather than let the SDK wait for an echo.
                echo = Rejected(
                    error=AMQPError(
                        condition=LockLost.condition,
                        description="The lock supplied is invalid.",
                        info=None,
                    )
                )
            else:
                echo = self._settle(held[0], state)
            if not settled:
                session.send(
                    pf.DispositionFrame(
                        role=ROLE_SENDER,
                        first=delivery_id,
                        last=None,
                        settled=True,
                        state=echo,
                        batchable=None,
                    )
                )

    def _settle(self, token: uuid.UUID, state: dict[str, Any]) -> Any:
        """Apply a disposition's outcome; return the outcome to echo to the client."""
        try:
            if "accepted" in state:
                self.broker.settle(token, "complete")
                return Accepted()
            if "modified" in state:
                values = [*list(state["modified"] or []), None, None, None]
                if values[1]:  # undeliverable-here: the SDK's defer
                    self.broker.settle(token, "defer")
                else:
                    self.broker.settle(token, "abandon")
                return Modified(
                    delivery_failed=values[0],
                    undeliverable_here=values[1],
                    message_annotations=None,
                )
            if "rejected" in state:
                error = (state["rejected"] or [None])[0] or []
                info = (error[2] if len(error) > 2 else None) or {}
                reason = _text(info.get(b"DeadLetterReason"))
                description = _text(info.get(b"DeadLetterErrorDescription"))
                self.broker.settle(token, "dead-letter", reason, description)
                return Rejected(error=None)  # an echoed rejection with an error means "failed"
            if "released" in state:
                self.broker.settle(token, "release")
                return Released()
        except BrokerError as exc:
            return Rejected(
                error=AMQPError(condition=exc.condition, description=exc.description, info=None)
            )
        return Accepted()
