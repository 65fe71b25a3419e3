"""Service Bus queue triggers: PEEK_LOCK through the real SDK, as the Functions host does.

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
per function is host.json maxConcurrentCalls; prefetch is prefetchCount.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable
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
from .invoke import call_function

log = logging.getLogger("devstack.host.servicebus")

SETTLE_TIMEOUT = 30.0

# How long an idle receiver's socket read lasts. The SDK's default (0.2 s) is what a
# settlement waited for before `split_transport_locks`; with the split it no longer matters
# for settlements, and this shorter value bounds the wait where the split cannot be applied.
# DEVSTACK_HOST_SB_SOCKET_TIMEOUT overrides it (seconds).
RECEIVE_SOCKET_TIMEOUT = 0.05


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
      as after a timeout.

    Returns whether the connection is (now) split; a transport of another kind, or an SDK
    whose internals moved, is left alone and settles within the short read timeout below.
    Checked before each receive: a reconnect makes a new connection.
    """
    try:
        from azure.servicebus._pyamqp._transport import _UNAVAIL, get_errno
        from azure.servicebus._pyamqp.aio._transport_async import AsyncTransport

        connection = receiver._handler._connection
        transport = connection._transport
        sdk_read_frame = connection._read_frame
    except (ImportError, AttributeError):
        return False
    if getattr(connection, "_devstack_split", False):
        return True
    if not isinstance(transport, AsyncTransport) or not hasattr(transport, "_write"):
        return False
    write_lock = asyncio.Lock()
    reading: list[asyncio.Future[None]] = []

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
            await asyncio.shield(reading[0])
            return False
        done = asyncio.get_running_loop().create_future()
        reading.append(done)
        try:
            return bool(await sdk_read_frame(wait=wait, **kwargs))
        finally:
            reading.remove(done)
            done.set_result(None)

    transport.write = write
    connection._read_frame = read_frame
    connection._devstack_split = True
    return True


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

    def set_session_state(self, session_id: str, session_state: bytes) -> None:
        raise NotImplementedError("devstack.host does not run session-enabled queues")

    def release_session(self, session_id: str) -> None:
        raise NotImplementedError("devstack.host does not run session-enabled queues")

    def renew_session_lock(self, session_id: str) -> Any:
        raise NotImplementedError("devstack.host does not run session-enabled queues")


def _is_sdk_message_param(annotation: Any) -> bool:
    from azurefunctions.extensions.bindings.servicebus import (
        ServiceBusReceivedMessage as ExtMessage,
    )

    if isinstance(annotation, str):  # an annotation the worker could not resolve either: go by name
        return annotation.rsplit(".", 1)[-1] == "ServiceBusReceivedMessage"
    return isinstance(annotation, type) and issubclass(
        annotation, (ExtMessage, ServiceBusReceivedMessage)
    )


def _is_actions_param(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return annotation.rsplit(".", 1)[-1] == "ServiceBusMessageActions"
    return isinstance(annotation, type) and issubclass(annotation, SdkMessageActions)


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


class QueueListener:
    """One Service Bus trigger function: a PEEK_LOCK receiver and its invocations."""

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
        if trig.get("topicName"):
            raise NotImplementedError(
                f"function {spec.name}: topic subscriptions are not supported by devstack.host"
            )
        if trig.get("isSessionsEnabled"):
            raise NotImplementedError(
                f"function {spec.name}: session-enabled queues are not supported by devstack.host"
            )
        if str(trig.get("cardinality", "one")).lower() == "many":
            raise NotImplementedError(
                f"function {spec.name}: batch (cardinality=many) triggers are not supported"
            )
        self.queue = resolve_binding_expression(
            trig["queueName"], purpose=f"queue name of function {spec.name}"
        )
        conn_name = trig.get("connection") or "AzureWebJobsServiceBus"
        self.connection_string = _connection_string(conn_name, spec.name)
        auto = trig.get("autoCompleteMessages")
        self.auto_complete = options.auto_complete_messages if auto is None else bool(auto)
        self.receiver: ServiceBusReceiver | None = None
        self._stopping = False
        self.sem = asyncio.Semaphore(max(1, options.max_concurrent_calls))
        self._tasks: set[asyncio.Task[Any]] = set()
        self._settled: set[str] = set()

    # -- runs on the Service Bus loop --

    async def run(self) -> None:
        backoff = 1.0
        while not self._stopping:
            try:
                async with ServiceBusClient.from_connection_string(
                    self.connection_string
                ) as client:
                    # On the receiver: the client's own socket_timeout does not reach the
                    # receivers it makes (they fall back to the SDK's 0.2 s).
                    receiver = client.get_queue_receiver(
                        self.queue,
                        receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                        prefetch_count=self.options.prefetch_count,
                        socket_timeout=receive_socket_timeout(),
                    )
                    async with receiver:
                        self.receiver = receiver
                        backoff = 1.0
                        await self._receive_loop(receiver)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    return
                log.warning(
                    "function %s: Service Bus queue %r unavailable (%s: %s); retrying in %.0fs",
                    self.spec.name,
                    self.queue,
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
            msg = batch[0]
            task = asyncio.create_task(self._handle(receiver, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _renew_lock(
        self, receiver: ServiceBusReceiver, msg: ServiceBusReceivedMessage
    ) -> None:
        """Keep the message locked while the function runs, as the .NET processor does: renew
        when min(half the remaining lock, 10 s) is left, up to maxAutoLockRenewalDuration."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.options.max_auto_lock_renewal_seconds
        while True:
            locked_until = msg.locked_until_utc
            if locked_until is None:
                return
            remaining = (locked_until - datetime.now(UTC)).total_seconds()
            delay = max(0.0, remaining - min(remaining / 2, 10.0))
            if loop.time() + delay > give_up:
                return
            await asyncio.sleep(delay)
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

    async def _handle(self, receiver: ServiceBusReceiver, msg: ServiceBusReceivedMessage) -> None:
        token = str(msg.lock_token)
        renewal = asyncio.create_task(self._renew_lock(receiver, msg))
        try:
            fut = asyncio.run_coroutine_threadsafe(self._invoke(msg), self.main_loop)
            try:
                await asyncio.wrap_future(fut)
                failed: BaseException | None = None
            except Exception as exc:
                failed = exc
            renewal.cancel()
            if token in self._settled:
                return
            try:
                if failed is not None:
                    log.warning(
                        "function %s failed on message %s (delivery %s): %s; abandoning",
                        self.spec.name,
                        msg.message_id,
                        msg.delivery_count,
                        failed,
                    )
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
            renewal.cancel()
            self._settled.discard(token)
            self.sem.release()

    async def _settle(self, method: str, msg: ServiceBusReceivedMessage, *args: Any) -> Any:
        receiver = self.receiver
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
            self._settled.add(str(msg.lock_token))
        return None

    # -- runs on the host's loop --

    def settle_from_function(self, method: str, message: Any, *args: Any) -> Any:
        if not getattr(message, "lock_token", None):
            raise ValueError("lockToken is required in ServiceBusReceivedMessage.")
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(
            self._settle(method, message, *args), self.sb_loop
        )
        return fut.result(SETTLE_TIMEOUT)

    async def _invoke(self, msg: ServiceBusReceivedMessage) -> None:
        kwargs: dict[str, Any] = {}
        trigger_param = self.spec.trigger["name"]
        annotation = self.spec.params.get(trigger_param)
        kwargs[trigger_param] = (
            msg if _is_sdk_message_param(annotation) else to_functions_message(msg)
        )
        for pname, ann in self.spec.params.items():
            if _is_actions_param(ann):
                kwargs[pname] = MessageActions(self)
        if self.spec.durable_client_param:
            kwargs[self.spec.durable_client_param] = self.client_binding()
        await call_function(self.spec, kwargs)

    def stop(self) -> None:
        self._stopping = True


def _connection_string(conn_name: str, function_name: str) -> str:
    value = setting(conn_name, purpose=f"Service Bus connection of function {function_name}")
    if "Endpoint=" not in value:
        # Identity-based connections (<name>__fullyQualifiedNamespace) need Entra ID, not a local emulator.
        raise_value = f"app setting {conn_name!r} is not a Service Bus connection string"
        from .errors import HostError

        raise HostError(raise_value)
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
        """Open each trigger's queue once so that a wrong address fails with one clear line."""
        from .errors import HostError

        async def probe(listener: QueueListener) -> None:
            async with ServiceBusClient.from_connection_string(
                listener.connection_string, retry_total=0
            ) as client:
                receiver = client.get_queue_receiver(listener.queue)
                async with receiver:
                    await receiver.peek_messages(max_message_count=1)

        for listener in self.listeners:
            assert self.loop is not None
            fut = asyncio.run_coroutine_threadsafe(asyncio.wait_for(probe(listener), 10), self.loop)
            try:
                await asyncio.wrap_future(fut)
            except Exception as exc:
                raise HostError(
                    f"function {listener.spec.name}: cannot open Service Bus queue {listener.queue!r} "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                ) from None

    async def stop(self) -> None:
        """Stop receiving; let in-flight invocations finish (up to 30 s) and settle, then close."""
        for listener in self.listeners:
            listener.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while any(listener._tasks for listener in self.listeners) and loop.time() < deadline:
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
