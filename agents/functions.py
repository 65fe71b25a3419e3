"""The Agent as a Service Bus triggered function in the Functions app.

Thin on purpose: take the message, hand it to the same RequestProcessor the
standalone worker uses, settle it by hand (auto_complete_messages=False) so a
malformed request (any AMQP body kind) is dead-lettered with reason
InvalidMessage and alerted instead of being retried to exhaustion, an
unexpected failure is dead-lettered ProcessingFailed, and a reply that could
not be sent is abandoned (dead-lettered RetriesExhausted on the last delivery).

The host renews the message lock while the function runs (host.json
`extensions.serviceBus.maxAutoLockRenewalDuration` must cover the step
timeout), and bounds concurrency (`maxConcurrentCalls`)."""

# No `from __future__ import annotations` here: the Functions worker reads the
# trigger's parameter annotations to decide what to bind (SDK types and the
# message actions), and must see classes, not strings.
import asyncio
from typing import Any

import aiohttp
import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

import bootstrap
from adapters.servicebus import AGENT_REQUESTS_QUEUE, servicebus_client
from adapters.settings import SERVICEBUS_CONNECTION
from adapters.settlement import defuse_trace_headers
from agents.config import load_agent_settings, require_servicebus
from agents.messaging import RequestProcessor

bp = func.Blueprint()


class FunctionsSettlement:
    """Settlement through the host's ServiceBusMessageActions (sync gRPC
    calls: run off the event loop so other invocations keep going)."""

    def __init__(self, actions: Any, message: Any) -> None:
        self._actions = actions
        self._message = message
        defuse_trace_headers(message)  # else settling raises with SDK tracing on

    async def complete(self) -> None:
        await asyncio.to_thread(self._actions.complete, self._message)

    async def abandon(self) -> None:
        await asyncio.to_thread(self._actions.abandon, self._message)

    async def dead_letter(self, reason: str, description: str) -> None:
        await asyncio.to_thread(
            self._actions.deadletter,
            self._message,
            deadletter_reason=reason,
            deadletter_error_description=description,
        )


class _Runtime:
    """The process's clients, made on first use inside the worker's event
    loop (an aiohttp session or an aio Service Bus client must not be created
    outside it) and reused by every invocation."""

    def __init__(self) -> None:
        self._processor: RequestProcessor | None = None
        self._lock = asyncio.Lock()

    async def processor(self) -> RequestProcessor:
        async with self._lock:
            if self._processor is None:
                settings = load_agent_settings()
                client = servicebus_client(require_servicebus(settings))
                self._processor, _replies = bootstrap.request_processor(
                    client, aiohttp.ClientSession(), settings
                )
            return self._processor


_runtime = _Runtime()


@bp.function_name("agent_requests")
@bp.service_bus_queue_trigger(
    arg_name="message",
    queue_name=AGENT_REQUESTS_QUEUE,
    connection=SERVICEBUS_CONNECTION,
    auto_complete_messages=False,
)
async def agent_requests(
    message: servicebus.ServiceBusReceivedMessage,
    message_actions: servicebus.ServiceBusMessageActions,
) -> None:
    processor = await _runtime.processor()
    await processor.process_message(message, FunctionsSettlement(message_actions, message))
