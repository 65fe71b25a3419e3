"""Storage queue triggers, against Azurite or any Storage account, as the Storage extension runs them.

Per function: poll the queue (at once while it has messages, then with a doubling
interval up to `maxPollingInterval`), take up to `batchSize` messages with a 10-minute
visibility timeout, renewed while the function runs, and run them concurrently (a new
batch is fetched when fewer than `newBatchThreshold` are running). Success deletes the
message. A failure makes it visible again after `visibilityTimeout`; once its dequeue
count has reached `maxDequeueCount` it is copied to `<queue>-poison` and deleted.
Message text is base64-decoded unless host.json says `messageEncoding: none`; a message
that does not decode fails like a function error and ends in the poison queue.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.functions.queue import QueueMessage
from azure.storage.queue.aio import QueueClient, QueueServiceClient

from .app import FunctionSpec
from .config import QueueOptions, resolve_binding_expression, setting
from .errors import HostError
from .invoke import call_function

log = logging.getLogger("devstack.host.queues")

VISIBILITY_SECONDS = 600  # what the Storage extension asks for when it dequeues
MIN_POLL_SECONDS = 0.1


class QueueListener:
    """One queue-triggered function."""

    def __init__(
        self, spec: FunctionSpec, options: QueueOptions, client_binding: Callable[[], str]
    ) -> None:
        self.spec = spec
        self.options = options
        self.client_binding = client_binding
        self.queue_name = resolve_binding_expression(
            str(spec.trigger["queueName"]), purpose=f"queue name of function {spec.name}"
        ).lower()
        connection = spec.trigger.get("connection") or "AzureWebJobsStorage"
        if not _has_setting(connection) and _has_setting(f"{connection}__queueServiceUri"):
            raise HostError(
                f"function {spec.name}: identity-based Storage connections ({connection}__queueServiceUri) "
                "are not supported by devstack.host; set a connection string in the setting"
            )
        self.connection_string = setting(
            connection, purpose=f"Storage connection of function {spec.name}"
        )
        self.service = QueueServiceClient.from_connection_string(self.connection_string)
        self.queue: QueueClient = self.service.get_queue_client(self.queue_name)
        self.poison: QueueClient = self.service.get_queue_client(self.queue_name + "-poison")
        self._stopping = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None

    async def check_reachable(self) -> None:
        try:
            await asyncio.wait_for(self.service.get_service_properties(), timeout=10)
        except Exception as exc:
            raise HostError(
                f"function {self.spec.name}: Storage queue service unreachable "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            ) from None

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._poll(), name=f"queue:{self.spec.name}")

    async def stop(self, timeout: float) -> None:
        self._stopping.set()
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self._running:
            await asyncio.wait(self._running, timeout=timeout)
        await self.queue.close()
        await self.poison.close()
        await self.service.close()

    @property
    def threshold(self) -> int:
        if self.options.new_batch_threshold is not None:
            return self.options.new_batch_threshold
        return self.options.batch_size // 2

    async def _poll(self) -> None:
        delay = MIN_POLL_SECONDS
        while not self._stopping.is_set():
            got = 0
            if len(self._running) <= self.threshold:
                try:
                    got = await self._fetch()
                except ResourceNotFoundError:
                    got = 0  # the queue does not exist yet: as empty
                except Exception as exc:
                    log.warning(
                        "queue %s (function %s): receive failed: %s",
                        self.queue_name,
                        self.spec.name,
                        exc,
                    )
            if got:
                delay = MIN_POLL_SECONDS
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
            delay = min(delay * 2, max(self.options.max_polling_seconds, MIN_POLL_SECONDS))

    async def _fetch(self) -> int:
        n = 0
        pager = self.queue.receive_messages(
            messages_per_page=self.options.batch_size,
            max_messages=self.options.batch_size,
            visibility_timeout=VISIBILITY_SECONDS,
        )
        async for message in pager:
            n += 1
            task = asyncio.create_task(self._process(message))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return n

    async def _process(self, message: Any) -> None:
        state = {"pop_receipt": message.pop_receipt}
        renewer = asyncio.create_task(self._keep_invisible(message, state))
        ok = False
        try:
            body = self._decode(message.content)
            arg = QueueMessage(  # the worker's concrete class: func.QueueMessage is its interface
                id=message.id,
                body=body,
                dequeue_count=message.dequeue_count,
                expiration_time=message.expires_on,
                insertion_time=message.inserted_on,
                time_next_visible=message.next_visible_on,
                pop_receipt=message.pop_receipt,
            )
            kwargs: dict[str, Any] = {self.spec.trigger["name"]: arg}
            if self.spec.durable_client_param:
                kwargs[self.spec.durable_client_param] = self.client_binding()
            await call_function(self.spec, kwargs)
            ok = True
        except Exception as exc:
            log.warning(
                "queue function %s failed on message %s (dequeue count %s): %s",
                self.spec.name,
                message.id,
                message.dequeue_count,
                exc,
            )
        finally:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
        try:
            if ok:
                await self.queue.delete_message(message.id, state["pop_receipt"])
            elif message.dequeue_count >= self.options.max_dequeue_count:
                await self._to_poison(message, state["pop_receipt"])
            else:
                await self.queue.update_message(
                    message.id,
                    state["pop_receipt"],
                    visibility_timeout=int(self.options.visibility_timeout_seconds),
                )
        except Exception as exc:  # the message reappears when its visibility timeout ends
            log.warning(
                "queue %s: settling message %s failed: %s", self.queue_name, message.id, exc
            )

    async def _keep_invisible(self, message: Any, state: dict[str, Any]) -> None:
        """Extend the message's invisibility while the function runs, at half the timeout."""
        while True:
            await asyncio.sleep(VISIBILITY_SECONDS / 2)
            receipt = await self.queue.update_message(
                message.id, state["pop_receipt"], visibility_timeout=VISIBILITY_SECONDS
            )
            state["pop_receipt"] = receipt.pop_receipt

    async def _to_poison(self, message: Any, pop_receipt: str) -> None:
        with contextlib.suppress(ResourceExistsError):
            await self.poison.create_queue()
        await self.poison.send_message(message.content)
        await self.queue.delete_message(message.id, pop_receipt)
        log.warning(
            "queue %s: message %s moved to %s-poison after %s attempts",
            self.queue_name,
            message.id,
            self.queue_name,
            message.dequeue_count,
        )

    def _decode(self, content: Any) -> bytes:
        raw = content if isinstance(content, bytes) else str(content or "").encode()
        if self.options.message_encoding == "none":
            return raw
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(
                f"message is not base64 (host.json queues.messageEncoding is base64): {exc}"
            ) from None


def _has_setting(name: str) -> bool:
    return bool(os.environ.get(name))


class QueueTriggers:
    def __init__(
        self, specs: list[FunctionSpec], options: QueueOptions, client_binding: Callable[[], str]
    ) -> None:
        self.listeners = [QueueListener(s, options, client_binding) for s in specs]

    async def start(self) -> None:
        for listener in self.listeners:
            await listener.check_reachable()
        for listener in self.listeners:
            listener.start()

    async def stop(self, timeout: float = 30) -> None:
        await asyncio.gather(
            *(listener.stop(timeout) for listener in self.listeners), return_exceptions=True
        )
