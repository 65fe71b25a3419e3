"""The Agent as a Service Bus triggered function: the standalone worker's
RequestProcessor, settling by hand (docs/adr/014-message-settlement.md).
The host renews the lock while it runs: host.json's
`maxAutoLockRenewalDuration` must cover the step timeout."""

# No `from __future__ import annotations`: the Functions worker reads the
# trigger's parameter annotations to decide what to bind.
import asyncio
from typing import Any

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

from adapters.servicebus import AGENT_REQUESTS_QUEUE
from adapters.settlement import RunSync, defuse_trace_headers
from bootstrap import App
from triggers import queue_trigger


class FunctionsSettlement:
    """Settlement through the host's ServiceBusMessageActions, whose sync gRPC
    calls `run_sync` runs off the event loop (a worker thread unless told)."""

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
