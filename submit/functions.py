"""The Submit trigger: Service Bus queue `orders`, PeekLock, manual settlement.

Thin on purpose: the gate (adapters.settlement.MessageGate) reads the body of
any AMQP kind, runs the handler, turns transient failures into delayed
retries and anything unexpected into a `ProcessingFailed` dead letter, alerts
on every dead letter, and settles off the event loop. The message-actions
object is the SDK-type binding's `ServiceBusMessageActions` under the real
host, and the local host's implementation of the same methods under
devstack.host."""

# No `from __future__ import annotations`: the Functions worker reads the
# trigger's parameter annotations to decide what to bind.
import logging

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

import bootstrap

ORDERS_QUEUE = "orders"

bp = func.Blueprint()
log = logging.getLogger(__name__)


@bp.function_name("submit_order")
@bp.service_bus_queue_trigger(
    arg_name="message",
    queue_name=ORDERS_QUEUE,
    connection="ServiceBusConnection",
    auto_complete_messages=False,
)
async def submit_order(
    message: servicebus.ServiceBusReceivedMessage,
    message_actions: servicebus.ServiceBusMessageActions,
) -> None:
    handler = await bootstrap.submit_handler()
    gate = await bootstrap.message_gate(ORDERS_QUEUE)
    await gate.run(message, message_actions, handler.handle)
