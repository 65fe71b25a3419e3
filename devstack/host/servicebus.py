"""Service Bus triggers (queues and topic subscriptions; single messages, batches and
sessions): PEEK_LOCK through the real SDK, as the Functions host does.

Receiving, lock renewal and settlement run on a loop of their own (a thread): the
SDK-type binding's `ServiceBusMessageActions` has *synchronous* methods that the
function calls from the host's loop, and a real host answers them over gRPC while the
worker waits. Here `complete()` and friends hand the settlement to the Service Bus
loop and wait for its answer, so a lost lock raises in the function as it would there.

Per message: the lock is renewed (as the .NET processor schedules it, up to host.json
maxAutoLockRenewalDuration) while the function runs; on success the message is
completed unless the trigger says ``autoCompleteMessages: false``; on an exception it
is abandoned if the function has not settled it (the SDK processor's rule), so the
queue's MaxDeliveryCount moves it to the dead-letter queue in the end. Concurrency
per function is host.json maxConcurrentCalls; prefetch is prefetchCount. Batches and
sessions: see `QueueListener`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import CancelledError as FutureCancelledError
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

from azure.functions.servicebus import ServiceBusMessage as FunctionsServiceBusMessage
from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azurefunctions.extensions.bindings.servicebus import (
    ServiceBusMessageActions as SdkMessageActions,
)
from azurefunctions.extensions.bindings.servicebus.serviceBusMessageActions import SettlementError

from .app import FunctionSpec
from .config import ServiceBusOptions, resolve_binding_expression, setting
from .errors import HostError
from .invoke import call_function

log = logging.getLogger("devstack.host.servicebus")

SETTLE_TIMEOUT = 30.0

# How long an idle receiver's socket read lasts. The SDK's default (0.2 s) is what a
# settlement waited for before `split_transport_locks`; with the split it no longer matters
# for settlements, and this shorter value bounds the wait where the split cannot be applied.
# DEVSTACK_HOST_SB_SOCKET_TIMEOUT overrides it (seconds).
RECEIVE_SOCKET_TIMEOUT = 0.05

# How long an idle read lasts once the split holds (`split_transport_locks`): nothing waits
# for it to end any more (a settlement's or a lock renewal's answer ends it as it arrives),
# so it can be long; each read that ends empty costs the SDK a frame read and the loop a
# wake-up, 20 a second for each idle receiver at 0.05 s (with it, the host's CPU per order
# in bench/pipeline_bench.py under a profiler fell 13 %, docs/local-host.md). A receive
# still ends after its max_wait_time plus at most this.
SPLIT_READ_WAIT = 1.0


def split_transport_locks(receiver: Any) -> bool:
    """Let the receiver's settlements go out while its receive loop waits to read.

    The SDK's async AMQP transport serializes reads and writes with one lock, so a
    disposition frame waits for the idle read in progress to time out; the settlement then
    reads itself until the service's outcome arrives (PEEK_LOCK settles in rcv-settle-mode
    Second). Two changes to this receiver's connection, no other:

    * the plain-TCP transport gets a lock of its own for writes (asyncio's stream reader
      and writer need no exclusion between one reader and one writer; writes stay
      serialized among themselves);
    * a frame read asked for while another coroutine is already reading (the receive loop)
      waits for that read *and its dispatch* to end and reports no frame, instead of reading
      for a whole socket timeout itself: the outcome the settlement waits for is dispatched
      by the read in progress, and every caller re-checks its condition after an empty read,
      as after a timeout;
    * so a timed read lasts at least `SPLIT_READ_WAIT`: an idle receiver wakes once a
      second, not twenty times.

    Returns whether the connection is (now) split; a transport of another kind, or an SDK
    whose internals moved, is left alone and settles within the short read timeout below.
    Checked before each receive: a reconnect makes a new connection.
    """
    connection = getattr(getattr(receiver, "_handler", None), "_connection", None)
    if getattr(connection, "_devstack_split", False):
        return True  # the usual case: asked before every receive
    try:
        from azure.servicebus._pyamqp._transport import _UNAVAIL, get_errno
        from azure.servicebus._pyamqp.aio._transport_async import AsyncTransport

        transport = connection._transport  # type: ignore[union-attr]
        sdk_read_frame = connection._read_frame  # type: ignore[union-attr]
    except (ImportError, AttributeError):
        return False
    if not isinstance(transport, AsyncTransport) or not hasattr(transport, "_write"):
        return False
    write_lock = asyncio.Lock()
    # The read in progress, if any; and the future that its end sets, made only when a
    # second caller comes to wait for it (most reads have no one waiting).
    reading: list[asyncio.Future[None] | None] = []

    async def write(data: bytes) -> None:  # AsyncTransportMixin.write, with its own lock
        async with write_lock:
            try:
                await transport._write(data)
            except TimeoutError:
                raise
            except OSError as exc:
                if get_errno(exc) not in _UNAVAIL:
                    transport.connected = False
                raise

    async def read_frame(wait: Any = True, **kwargs: Any) -> bool:
        if reading:
            done = reading[0]
            if done is None:
                done = reading[0] = asyncio.get_running_loop().create_future()
            await asyncio.shield(done)
            return False
        if wait is not True and wait is not False and wait < SPLIT_READ_WAIT:
            wait = SPLIT_READ_WAIT  # a timed read: see SPLIT_READ_WAIT
        reading.append(None)
        try:
            return bool(await sdk_read_frame(wait=wait, **kwargs))
        finally:
            done = reading.pop()
            if done is not None:
                done.set_result(None)

    transport.write = write
    connection._read_frame = read_frame
    connection._devstack_split = True
    return True


def _wait_on(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], timeout: float
) -> Any:
    """Run `coro` on `loop` (another thread's) and block this thread until it ends: what
    `asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)` does, waiting on a bare
    lock instead of a concurrent future's condition (every settlement a function makes
    waits here; the condition's Python-level locking was most of the wait's CPU)."""
    done = threading.Lock()
    done.acquire()
    started: list[asyncio.Task[Any]] = []

    def start() -> None:
        task = loop.create_task(coro)
        started.append(task)
        task.add_done_callback(lambda _: done.release())

    loop.call_soon_threadsafe(start)
    if not done.acquire(timeout=timeout):
        raise TimeoutError(f"no answer from the Service Bus loop in {timeout:g} s")
    task = started[0]
    if task.cancelled():
        raise FutureCancelledError()
    return task.result()


def receive_socket_timeout() -> float:
    raw = os.environ.get("DEVSTACK_HOST_SB_SOCKET_TIMEOUT")
    try:
        return max(0.001, float(raw)) if raw else RECEIVE_SOCKET_TIMEOUT
    except ValueError:
        return RECEIVE_SOCKET_TIMEOUT


class MessageActions(SdkMessageActions):
    """`ServiceBusMessageActions` for this host: same methods, settled through the SDK receiver.

    Subclasses the extension's class so that annotations and isinstance checks hold;
    its gRPC constructor is not called.
    """

    def __init__(self, listener: QueueListener) -> None:  # noqa: D107 - no gRPC channel here
        self._listener = listener

    def _settle(self, method: str, message: Any, *args: Any) -> Any:
        try:
            return self._listener.settle_from_function(method, message, *args)
        except SettlementError:
            raise
        except Exception as exc:
            token = getattr(message, "lock_token", None)
            raise SettlementError(method, f"Failed to {method} message {token}", exc) from exc

    def complete(self, message: Any) -> None:
        self._settle("complete", message)

    def abandon(self, message: Any) -> None:
        self._settle("abandon", message)

    def deadletter(
        self,
        message: Any,
        deadletter_reason: str | None = None,
        deadletter_error_description: str | None = None,
    ) -> None:
        self._settle("deadletter", message, deadletter_reason, deadletter_error_description)

    def defer(self, message: Any) -> None:
        self._settle("defer", message)

    def renew_message_lock(self, message: Any) -> None:
        self._settle("renew_message_lock", message)

    def _session(self, method: str, session_id: str, *args: Any) -> Any:
        try:
            return self._listener.session_from_function(method, session_id, *args)
        except Exception as exc:
            what = {
                "set_session_state": "set state for",
                "release_session": "release",
                "renew_session_lock": "renew lock for",
            }[method]
            raise SettlementError(method, f"Failed to {what} session {session_id}", exc) from exc

    def set_session_state(self, session_id: str, session_state: bytes) -> None:
        self._session("set_session_state", session_id, session_state)

    def release_session(self, session_id: str) -> None:
        self._session("release_session", session_id)

    def renew_session_lock(self, session_id: str) -> Any:
        """The new lock expiry, as the extension answers it: a protobuf Timestamp."""
        from google.protobuf.timestamp_pb2 import Timestamp

        locked_until = self._session("renew_session_lock", session_id)
        ts = Timestamp()
        ts.FromDatetime(locked_until.astimezone(UTC).replace(tzinfo=None))
        return ts


def _is_sdk_message_param(annotation: Any) -> bool:
    from azurefunctions.extensions.bindings.servicebus import (
        ServiceBusReceivedMessage as ExtMessage,
    )

    if isinstance(annotation, str):  # an annotation the worker could not resolve either: go by name
        return annotation.rsplit(".", 1)[-1] == "ServiceBusReceivedMessage"
    return isinstance(annotation, type) and issubclass(
        annotation, (ExtMessage, ServiceBusReceivedMessage)
    )


def _is_sdk_message_list_param(annotation: Any) -> bool:
    """``list[ServiceBusReceivedMessage]`` (the SDK-type batch binding)."""
    from azurefunctions.extensions.bindings.servicebus import (
        ServiceBusReceivedMessage as ExtMessage,
    )

    from .indexing import is_iterable_of

    if isinstance(annotation, str):
        return "ServiceBusReceivedMessage" in annotation
    return is_iterable_of(annotation, ExtMessage) or is_iterable_of(
        annotation, ServiceBusReceivedMessage
    )


def _is_actions_param(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return annotation.rsplit(".", 1)[-1] == "ServiceBusMessageActions"
    return isinstance(annotation, type) and issubclass(annotation, SdkMessageActions)


def count_from_one(msg: ServiceBusReceivedMessage) -> ServiceBusReceivedMessage:
    """`msg` as the Functions host hands it to a function, delivery count first.

    On the wire (and to a standalone azure-servicebus receiver) the count is the AMQP
    header's number of earlier attempts: 0 on a first delivery. The host reads messages
    through the .NET SDK, whose received messages count from 1 (AmqpMessageConverter adds
    1 to the header), and passes that count on to both trigger kinds: as `DeliveryCount`
    in the trigger metadata of an `azure.functions.ServiceBusMessage`, and inside the
    AMQP bytes (`GetRawAmqpMessage().ToBytes()`) an SDK-type `ServiceBusReceivedMessage`
    is decoded from. So a function sees 1 on a first delivery, and MaxDeliveryCount on
    the last. Called once per delivery, on the message the host then settles (the header
    plays no part in settlement)."""
    header = msg.raw_amqp_message.header
    if header is not None and header.delivery_count is not None:
        header.delivery_count += 1
    return msg


def to_functions_message(msg: ServiceBusReceivedMessage) -> FunctionsServiceBusMessage:
    """The `azure.functions.ServiceBusMessage` a plain trigger parameter receives."""
    body = b"".join(msg.body) if not isinstance(msg.body, (bytes, bytearray)) else bytes(msg.body)
    props = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in (msg.application_properties or {}).items()
    }

    def _utc(dt: Any) -> Any:
        return dt.astimezone(UTC) if dt is not None else None

    return FunctionsServiceBusMessage(
        body=body,
        application_properties=props,
        user_properties=props,
        content_type=msg.content_type,
        correlation_id=msg.correlation_id,
        dead_letter_error_description=msg.dead_letter_error_description,
        dead_letter_reason=msg.dead_letter_reason,
        dead_letter_source=msg.dead_letter_source,
        delivery_count=msg.delivery_count,
        enqueued_sequence_number=msg.enqueued_sequence_number,
        enqueued_time_utc=_utc(msg.enqueued_time_utc),
        expires_at_utc=_utc(msg.expires_at_utc),
        label=msg.subject,
        subject=msg.subject,
        locked_until=_utc(msg.locked_until_utc),
        lock_token=str(msg.lock_token) if msg.lock_token else None,
        message_id=msg.message_id,
        partition_key=msg.partition_key,
        reply_to=msg.reply_to,
        reply_to_session_id=msg.reply_to_session_id,
        scheduled_enqueue_time_utc=_utc(msg.scheduled_enqueue_time_utc),
        sequence_number=msg.sequence_number,
        session_id=msg.session_id,
        time_to_live=msg.time_to_live,
        to=msg.to,
        trigger_metadata={},
    )


class Entity:
    """What a trigger listens on: a queue, or a topic's subscription."""

    def __init__(self, spec: FunctionSpec) -> None:
        trig = spec.trigger
        purpose = f"entity name of function {spec.name}"
        self.topic: str | None = None
        self.subscription: str | None = None
        self.queue: str | None = None
        if trig.get("topicName"):
            self.topic = resolve_binding_expression(trig["topicName"], purpose=purpose)
            if not trig.get("subscriptionName"):
                raise HostError(f"function {spec.name}: a topic trigger needs a subscriptionName")
            self.subscription = resolve_binding_expression(
                trig["subscriptionName"], purpose=purpose
            )
        elif trig.get("queueName"):
            self.queue = resolve_binding_expression(trig["queueName"], purpose=purpose)
        else:
            raise HostError(
                f"function {spec.name}: a Service Bus trigger needs a queueName or topicName"
            )

    def __str__(self) -> str:
        if self.topic is not None:
            return f"subscription {self.subscription!r} of topic {self.topic!r}"
        return f"queue {self.queue!r}"

    def receiver(self, client: ServiceBusClient, **kwargs: Any) -> ServiceBusReceiver:
        if self.topic is not None:
            assert self.subscription is not None
            return client.get_subscription_receiver(self.topic, self.subscription, **kwargs)
        assert self.queue is not None
        return client.get_queue_receiver(self.queue, **kwargs)


class QueueListener:
    """One Service Bus trigger function (a queue or a topic subscription; single messages or
    batches; with or without sessions): PEEK_LOCK receivers and the invocations they feed.

    As the extension's listener:
    * single messages: up to maxConcurrentCalls invocations at once, each message's lock
      renewed while its function runs (up to maxAutoLockRenewalDuration);
    * ``cardinality="many"``: one batch at a time of up to maxMessageBatchSize messages,
      waiting up to maxBatchWaitTime for minMessageBatchSize of them; the batch's locks are
      not renewed (the host.json reference: lock renewal applies to functions that receive
      one message at a time), the function can renew them through the message actions;
    * sessions: up to maxConcurrentSessions sessions at once, each session's messages one at a
      time and in order; the session lock is renewed from acceptance up to
      maxAutoLockRenewalDuration; a session is closed after sessionIdleTimeout without a
      message, or after the invocation that called ``release_session``.
    Success completes what the function did not settle (unless autoCompleteMessages is
    false); an exception abandons it.
    """

    def __init__(
        self,
        spec: FunctionSpec,
        options: ServiceBusOptions,
        sb_loop: asyncio.AbstractEventLoop,
        main_loop: asyncio.AbstractEventLoop,
        client_binding: Callable[[], str],
    ) -> None:
        self.spec = spec
        self.options = options
        self.sb_loop = sb_loop
        self.main_loop = main_loop
        self.client_binding = client_binding
        trig = spec.trigger
        self.entity = Entity(spec)
        self.sessions = bool(trig.get("isSessionsEnabled"))
        self.batch = str(trig.get("cardinality") or "one").lower() == "many"
        conn_name = trig.get("connection") or "AzureWebJobsServiceBus"
        self.connection_string = _connection_string(conn_name, spec.name)
        auto = trig.get("autoCompleteMessages")
        self.auto_complete = options.auto_complete_messages if auto is None else bool(auto)
        self.receiver: ServiceBusReceiver | None = None
        self._stopping = False
        self.sem = asyncio.Semaphore(max(1, options.max_concurrent_calls))
        self._tasks: set[asyncio.Task[Any]] = set()
        self._settled: set[str] = set()
        # lock token -> the receiver that holds the message; session id -> its receiver
        self._holders: dict[str, ServiceBusReceiver] = {}
        self._session_receivers: dict[str, ServiceBusReceiver] = {}
        self._released: set[str] = set()
        # lock token -> the pending lock renewal (a timer, or the renewal's task)
        self._renewals: dict[str, asyncio.TimerHandle | asyncio.Task[None]] = {}
        self.inflight = 0  # invocations (single, batch or session) not yet settled
        # What each invocation binds, read once from the function's signature: the trigger
        # parameter, whether it takes the SDK's message type (one or a list), and the
        # parameters that take the message actions.
        trigger_param = trig["name"]
        annotation = spec.params.get(trigger_param)
        self._params = (
            trigger_param,
            _is_sdk_message_param(annotation),
            _is_sdk_message_list_param(annotation),
            [p for p, ann in spec.params.items() if _is_actions_param(ann)],
        )

    @property
    def queue(self) -> str:
        """The entity, as messages name it (kept for the one-line errors)."""
        return self.entity.queue or f"{self.entity.topic}/{self.entity.subscription}"

    def _receiver_kwargs(self) -> dict[str, Any]:
        return {
            "receive_mode": ServiceBusReceiveMode.PEEK_LOCK,
            "prefetch_count": self.options.prefetch_count,
            # On the receiver: the client's own socket_timeout does not reach the
            # receivers it makes (they fall back to the SDK's 0.2 s).
            "socket_timeout": receive_socket_timeout(),
        }

    # -- runs on the Service Bus loop --

    async def run(self) -> None:
        backoff = 1.0
        while not self._stopping:
            try:
                async with ServiceBusClient.from_connection_string(
                    self.connection_string
                ) as client:
                    if self.sessions:
                        workers = [
                            asyncio.create_task(self._session_worker(client))
                            for _ in range(max(1, self.options.max_concurrent_sessions))
                        ]
                        try:
                            await asyncio.gather(*workers)
                        finally:
                            for w in workers:
                                w.cancel()
                            await asyncio.gather(*workers, return_exceptions=True)
                    else:
                        receiver = self.entity.receiver(client, **self._receiver_kwargs())
                        async with receiver:
                            self.receiver = receiver
                            backoff = 1.0
                            if self.batch:
                                await self._batch_loop(receiver)
                            else:
                                await self._receive_loop(receiver)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    return
                log.warning(
                    "function %s: Service Bus %s unavailable (%s: %s); retrying in %.0fs",
                    self.spec.name,
                    self.entity,
                    type(exc).__name__,
                    exc,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                for t in list(self._tasks):
                    if not t.done():
                        with contextlib.suppress(Exception):
                            await t
                self.receiver = None

    async def _receive_loop(self, receiver: ServiceBusReceiver) -> None:
        while not self._stopping:
            await self.sem.acquire()
            try:
                split_transport_locks(receiver)
                batch = await receiver.receive_messages(max_message_count=1, max_wait_time=1)
            except BaseException:
                self.sem.release()
                raise
            if not batch:
                self.sem.release()
                continue
            task = asyncio.create_task(
                self._handle_batch(receiver, batch, single=True, permit=True)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _collect_batch(self, receiver: ServiceBusReceiver) -> list[ServiceBusReceivedMessage]:
        """Up to maxMessageBatchSize messages; with minMessageBatchSize > 1, wait up to
        maxBatchWaitTime for that many (then take what there is)."""
        loop = asyncio.get_running_loop()
        most = max(1, self.options.max_message_batch_size)
        least = min(most, max(1, self.options.min_message_batch_size))
        deadline = loop.time() + self.options.max_batch_wait_seconds
        got: list[ServiceBusReceivedMessage] = []
        while not self._stopping and len(got) < most:
            split_transport_locks(receiver)
            more = await receiver.receive_messages(
                max_message_count=most - len(got), max_wait_time=1
            )
            got.extend(more)
            if got and (len(got) >= least or loop.time() >= deadline):
                break
            if not got:
                deadline = loop.time() + self.options.max_batch_wait_seconds
        return got

    async def _batch_loop(self, receiver: ServiceBusReceiver) -> None:
        while not self._stopping:
            batch = await self._collect_batch(receiver)
            if batch:
                await self._handle_batch(receiver, batch)

    async def _session_worker(self, client: ServiceBusClient) -> None:
        """Accept the next free session, run its messages in order, close it when idle."""
        from azure.servicebus import NEXT_AVAILABLE_SESSION
        from azure.servicebus.exceptions import OperationTimeoutError

        while not self._stopping:
            receiver = self.entity.receiver(
                client,
                session_id=NEXT_AVAILABLE_SESSION,
                max_wait_time=1,
                **self._receiver_kwargs(),
            )
            try:
                await receiver.__aenter__()
            except OperationTimeoutError:
                await receiver.close()
                continue  # no session with messages: ask again
            session = receiver.session
            assert session is not None
            sid = session.session_id
            self._session_receivers[sid] = receiver
            renewal = asyncio.create_task(self._renew_session_lock(receiver))
            try:
                await self._run_session(receiver, sid)
            finally:
                renewal.cancel()
                with contextlib.suppress(BaseException):
                    await renewal
                self._session_receivers.pop(sid, None)
                self._released.discard(sid)
                with contextlib.suppress(Exception):
                    await receiver.close()

    async def _run_session(self, receiver: ServiceBusReceiver, sid: str) -> None:
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        while not self._stopping and sid not in self._released:
            split_transport_locks(receiver)
            most = self.options.max_message_batch_size if self.batch else 1
            got = await receiver.receive_messages(max_message_count=max(1, most), max_wait_time=1)
            if not got:
                if loop.time() - idle_since >= self.options.session_idle_timeout_seconds:
                    return
                continue
            idle_since = loop.time()
            if self.batch:
                await self._handle_batch(receiver, got)
            else:
                for msg in got:
                    await self._handle_batch(receiver, [msg], single=True)

    async def _renew_session_lock(self, receiver: ServiceBusReceiver) -> None:
        """Keep the session locked while it is open, as the session processor does: renew
        when min(half the remaining lock, 10 s) is left, up to maxAutoLockRenewalDuration."""
        session = receiver.session
        assert session is not None
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.options.max_auto_lock_renewal_seconds
        while True:
            locked_until = session.locked_until_utc
            if locked_until is None:
                return
            remaining = (locked_until - datetime.now(UTC)).total_seconds()
            delay = max(0.0, remaining - min(remaining / 2, 10.0))
            if loop.time() + delay > give_up:
                return
            await asyncio.sleep(delay)
            try:
                await session.renew_lock()
            except Exception as exc:
                log.warning(
                    "function %s: lock renewal of session %s failed: %s",
                    self.spec.name,
                    session.session_id,
                    exc,
                )
                return

    def _renew_later(
        self,
        receiver: ServiceBusReceiver,
        msg: ServiceBusReceivedMessage,
        token: str,
        give_up: float,
    ) -> None:
        """Keep the message locked while the function runs, as the .NET processor does: renew
        when min(half the remaining lock, 10 s) is left, up to maxAutoLockRenewalDuration
        (`give_up`, in loop time). A timer until a renewal is due, a task only for the renewal
        itself (most functions end long before); `_renewals[token]` holds whichever is
        pending, for the end of the invocation to cancel."""
        locked_until = msg.locked_until_utc
        if locked_until is None:
            return
        remaining = (locked_until - datetime.now(UTC)).total_seconds()
        delay = max(0.0, remaining - min(remaining / 2, 10.0))
        if self.sb_loop.time() + delay > give_up:
            return
        self._renewals[token] = self.sb_loop.call_later(
            delay, self._renew, receiver, msg, token, give_up
        )

    def _renew(
        self,
        receiver: ServiceBusReceiver,
        msg: ServiceBusReceivedMessage,
        token: str,
        give_up: float,
    ) -> None:
        self._renewals[token] = self.sb_loop.create_task(
            self._renew_once(receiver, msg, token, give_up)
        )

    async def _renew_once(
        self,
        receiver: ServiceBusReceiver,
        msg: ServiceBusReceivedMessage,
        token: str,
        give_up: float,
    ) -> None:
        # Cancelled (by the invocation's end) only while it waits: the next timer is set in
        # the same step as the answer arrives, so it never outlives the invocation.
        try:
            await receiver.renew_message_lock(msg)
        except Exception as exc:
            log.warning(
                "function %s: lock renewal of message %s failed: %s",
                self.spec.name,
                msg.message_id,
                exc,
            )
            return
        self._renew_later(receiver, msg, token, give_up)

    async def _handle_batch(
        self,
        receiver: ServiceBusReceiver,
        messages: list[ServiceBusReceivedMessage],
        *,
        single: bool = False,
        permit: bool = False,
    ) -> None:
        """One invocation: a batch, or with `single` one message (whose lock is renewed while
        the function runs, unless a session's lock covers it). `permit`: the invocation holds
        one of maxConcurrentCalls, released at the end."""
        renewing = single and not self.sessions
        tokens: list[str] = []
        self.inflight += 1
        try:
            for m in messages:
                count_from_one(m)
            tokens = [str(m.lock_token) for m in messages]
            for token in tokens:
                self._holders[token] = receiver
            if renewing:
                give_up = self.sb_loop.time() + self.options.max_auto_lock_renewal_seconds
                self._renew_later(receiver, messages[0], tokens[0], give_up)
            try:
                fut = asyncio.run_coroutine_threadsafe(
                    self._invocation(messages[0] if single else messages), self.main_loop
                )
                await asyncio.wrap_future(fut)
                failed: BaseException | None = None
            except Exception as exc:
                failed = exc
            if failed is not None:
                log.warning(
                    "function %s failed on %s: %s; abandoning",
                    self.spec.name,
                    ", ".join(
                        f"message {m.message_id} (delivery {m.delivery_count})" for m in messages
                    ),
                    failed,
                )
            for msg, token in zip(messages, tokens, strict=True):
                if token in self._settled:
                    continue
                try:
                    if failed is not None:
                        await receiver.abandon_message(msg)
                    elif self.auto_complete:
                        await receiver.complete_message(msg)
                except Exception as exc:
                    log.warning(
                        "function %s: settling message %s failed: %s",
                        self.spec.name,
                        msg.message_id,
                        exc,
                    )
        finally:
            self.inflight -= 1
            if renewing and tokens and (pending := self._renewals.pop(tokens[0], None)):
                pending.cancel()
            for token in tokens:
                self._settled.discard(token)
                self._holders.pop(token, None)
            if permit:
                self.sem.release()

    async def _settle(self, method: str, msg: Any, *args: Any) -> Any:
        token = str(msg.lock_token)
        receiver = self._holders.get(token) or self.receiver
        if receiver is None:
            raise RuntimeError("the receiver is closed")
        if method == "complete":
            await receiver.complete_message(msg)
        elif method == "abandon":
            await receiver.abandon_message(msg)
        elif method == "deadletter":
            await receiver.dead_letter_message(msg, reason=args[0], error_description=args[1])
        elif method == "defer":
            await receiver.defer_message(msg)
        elif method == "renew_message_lock":
            return await receiver.renew_message_lock(msg)
        if method != "renew_message_lock":
            self._settled.add(token)
        return None

    async def _session_call(self, method: str, session_id: str, *args: Any) -> Any:
        receiver = self._session_receivers.get(session_id)
        if receiver is None or receiver.session is None:
            raise RuntimeError(f"session {session_id!r} is not held by function {self.spec.name}")
        if method == "set_session_state":
            await receiver.session.set_state(args[0])
            return None
        if method == "renew_session_lock":
            return await receiver.session.renew_lock()
        if method == "release_session":
            # As ReleaseSession: no new receive for it; closed once the invocation ends.
            self._released.add(session_id)
            return None
        raise ValueError(method)

    # -- runs on the host's loop --

    def settle_from_function(self, method: str, message: Any, *args: Any) -> Any:
        if not getattr(message, "lock_token", None):
            raise ValueError("lockToken is required in ServiceBusReceivedMessage.")
        return _wait_on(self.sb_loop, self._settle(method, message, *args), SETTLE_TIMEOUT)

    def session_from_function(self, method: str, session_id: str, *args: Any) -> Any:
        return _wait_on(self.sb_loop, self._session_call(method, session_id, *args), SETTLE_TIMEOUT)

    def _invocation(
        self, msg: ServiceBusReceivedMessage | list[ServiceBusReceivedMessage]
    ) -> Coroutine[Any, Any, Any]:
        """The function's coroutine for a delivery, to run on the host's loop. Built here, on
        the receivers' loop, so that the host's loop runs the function's own coroutine with no
        frame of the host's around it (`call_function`). The parameters are plain objects."""
        kwargs: dict[str, Any] = {}
        trigger_param, sdk_message, sdk_list, actions_params = self._params
        if isinstance(msg, list):
            kwargs[trigger_param] = [m if sdk_list else to_functions_message(m) for m in msg]
        else:
            kwargs[trigger_param] = msg if sdk_message else to_functions_message(msg)
        for pname in actions_params:
            kwargs[pname] = MessageActions(self)
        if self.spec.durable_client_param:
            kwargs[self.spec.durable_client_param] = self.client_binding()
        return call_function(self.spec, kwargs)

    def stop(self) -> None:
        self._stopping = True


def _connection_string(conn_name: str, function_name: str) -> str:
    value = setting(conn_name, purpose=f"Service Bus connection of function {function_name}")
    if "Endpoint=" not in value:
        # Identity-based connections (<name>__fullyQualifiedNamespace) need Entra ID, not a local emulator.
        raise HostError(f"app setting {conn_name!r} is not a Service Bus connection string")
    return value


class ServiceBusTriggers:
    """All Service Bus trigger functions, on one background loop."""

    def __init__(
        self,
        specs: list[FunctionSpec],
        options: ServiceBusOptions,
        client_binding: Callable[[], str],
    ) -> None:
        self.specs = specs
        self.options = options
        self.client_binding = client_binding
        self.listeners: list[QueueListener] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self._futures: list[Future[Any]] = []

    def start(self, main_loop: asyncio.AbstractEventLoop) -> None:
        if not self.specs:
            return
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="servicebus-io", daemon=True
        )
        self.thread.start()
        for spec in self.specs:
            listener = _create_listener(
                spec, self.options, self.loop, main_loop, self.client_binding
            )
            self.listeners.append(listener)
        for listener in self.listeners:
            self._futures.append(asyncio.run_coroutine_threadsafe(listener.run(), self.loop))

    async def check_reachable(self) -> None:
        """Open each trigger's entity once so that a wrong address, a missing entity or a
        session setting the entity does not have fails with one clear line."""
        from azure.servicebus import NEXT_AVAILABLE_SESSION
        from azure.servicebus.exceptions import OperationTimeoutError

        async def probe(listener: QueueListener) -> None:
            async with ServiceBusClient.from_connection_string(
                listener.connection_string, retry_total=0
            ) as client:
                if listener.sessions:
                    receiver = listener.entity.receiver(
                        client, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
                    )
                    try:
                        async with receiver:
                            pass  # a session was free: released again at once
                    except OperationTimeoutError:
                        pass  # reachable, and no session has messages yet
                    return
                receiver = listener.entity.receiver(client)
                async with receiver:
                    await receiver.peek_messages(max_message_count=1)

        for listener in self.listeners:
            assert self.loop is not None
            fut = asyncio.run_coroutine_threadsafe(asyncio.wait_for(probe(listener), 10), self.loop)
            try:
                await asyncio.wrap_future(fut)
            except Exception as exc:
                kind = "Service Bus queue" if listener.entity.queue is not None else "Service Bus"
                target = (
                    repr(listener.entity.queue)
                    if listener.entity.queue is not None
                    else str(listener.entity)
                )
                raise HostError(
                    f"function {listener.spec.name}: cannot open {kind} {target}"
                    + (" with sessions" if listener.sessions else "")
                    + f" ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                ) from None

    async def stop(self) -> None:
        """Stop receiving; let in-flight invocations finish (up to 30 s) and settle, then close."""
        for listener in self.listeners:
            listener.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while (
            any(listener._tasks or listener.inflight for listener in self.listeners)
            and loop.time() < deadline
        ):
            await asyncio.sleep(0.05)
        if self.loop is None:
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(
                asyncio.wrap_future(asyncio.run_coroutine_threadsafe(cancel_all(), self.loop)), 10
            )
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread is not None:
            self.thread.join(5)


def _create_listener(
    spec: FunctionSpec,
    options: ServiceBusOptions,
    sb_loop: asyncio.AbstractEventLoop,
    main_loop: asyncio.AbstractEventLoop,
    client_binding: Callable[[], str],
) -> QueueListener:
    # The listener's semaphore must belong to the Service Bus loop.
    holder: dict[str, QueueListener] = {}

    async def make() -> None:
        holder["l"] = QueueListener(spec, options, sb_loop, main_loop, client_binding)

    asyncio.run_coroutine_threadsafe(make(), sb_loop).result(10)
    return holder["l"]
