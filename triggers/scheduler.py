"""Durable and trigger wiring of the Scheduler: the orchestration, the starter
timer and the reply bridge. Each function is thin: decode, call, settle."""

from __future__ import annotations

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

    @bp.function_name(WORKFLOW_NAME)
    @bp.orchestration_trigger(context_name="context")
    def order_workflow_orchestrator(context: df.DurableOrchestrationContext):
        # Over the app's step catalog (App.steps reads it once; a bad
        # STEP_CATALOG_FILE fails the episode, naming the setting).
        return (yield from orchestrator(steps=root.steps)(context))

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
