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

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

from adapters.servicebus import AGENT_REQUESTS_QUEUE
from adapters.settlement import RunSync, defuse_trace_headers
from bootstrap import App
from triggers import queue_trigger


class FunctionsSettlement:
    """Settlement through the host's ServiceBusMessageActions (sync gRPC
    calls: run off the event loop so other invocations keep going; `run_sync`
    is how, a worker thread unless told)."""

    def __init__(self, actions: Any, message: Any, run_sync: RunSync = asyncio.to_thread) -> None:
        self._actions = actions
        self._message = message
        self._run_sync = run_sync
        defuse_trace_headers(message)  # else settling raises with SDK tracing on

    async def complete(self) -> None:
        await self._run_sync(self._actions.complete, self._message)

    async def abandon(self) -> None:
        await self._run_sync(self._actions.abandon, self._message)

    async def dead_letter(self, reason: str, description: str) -> None:
        await self._run_sync(
            self._actions.deadletter,
            self._message,
            deadletter_reason=reason,
            deadletter_error_description=description,
        )


def blueprint(root: App) -> func.Blueprint:
    """The Agents' blueprint over `root` (its RequestProcessor, built on first
    use inside the worker's event loop and reused by every invocation)."""
    bp = func.Blueprint()

    @bp.function_name("agent_requests")
    @queue_trigger(bp, AGENT_REQUESTS_QUEUE)
    async def agent_requests(
        message: servicebus.ServiceBusReceivedMessage,
        message_actions: servicebus.ServiceBusMessageActions,
    ) -> None:
        processor = await root.agent_processor()
        await processor.process_message(
            message, FunctionsSettlement(message_actions, message, root.seams.run_sync)
        )

    return bp
