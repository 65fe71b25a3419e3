"""Durable and trigger wiring of the Scheduler: the orchestration, the starter
timer and the reply bridge. Each function is thin: decode, call, settle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import azure.durable_functions as df
import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

from adapters.servicebus import AGENT_RESPONSES_QUEUE
from bootstrap import App
from orchestrators.order_workflow import WORKFLOW_NAME, orchestrator
from triggers import queue_trigger


def blueprint(root: App) -> df.Blueprint:
    """The Scheduler's blueprint over `root` (its Starter, the reply bridge's gate)."""
    bp = df.Blueprint()
    # Built at the first episode, over the app's step catalog (read once; a
    # bad STEP_CATALOG_FILE fails the episode, naming the setting).
    workflow: list[Callable[..., Any]] = []

    @bp.function_name(WORKFLOW_NAME)
    @bp.orchestration_trigger(context_name="context")
    def order_workflow_orchestrator(context: df.DurableOrchestrationContext):
        if not workflow:
            workflow.append(orchestrator(steps=root.steps))
        return (yield from workflow[0](context))

    @bp.function_name("starter")
    @bp.timer_trigger(arg_name="timer", schedule="%STARTER_SCHEDULE%", run_on_startup=False)
    @bp.durable_client_input(client_name="client")
    async def starter(
        timer: func.TimerRequest,  # noqa: ARG001 - the binding's arg_name must be a parameter
        client: df.DurableOrchestrationClient,
    ) -> None:
        start = await root.starter()
        await start.run(client)

    @bp.function_name("reply_bridge")
    @queue_trigger(bp, AGENT_RESPONSES_QUEUE)
    @bp.durable_client_input(client_name="client")
    async def reply_bridge(
        message: servicebus.ServiceBusReceivedMessage,
        message_actions: servicebus.ServiceBusMessageActions,
        client: df.DurableOrchestrationClient,
    ) -> None:
        await root.on_reply(message, message_actions, client)

    return bp
