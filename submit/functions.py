"""The Submit trigger: Service Bus queue `orders`, PeekLock, manual settlement.

Thin on purpose: read the body, ask the handler what to do, settle. The
message-actions object is the SDK-type binding's `ServiceBusMessageActions`
under the real host, and the local host's implementation of the same methods
under devstack.host."""

from __future__ import annotations

import logging

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

import bootstrap
from adapters.settlement import message_body, settle

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
    body = message_body(message)
    handler = await bootstrap.submit_handler()
    outcome = await handler.handle(body)
    log.info(
        "orders message %s (delivery %s): %s %s",
        message.message_id,
        message.delivery_count,
        outcome.kind.value,
        outcome.reason or "",
        extra={"order_id": outcome.order_id},
    )
    settle(message, message_actions, outcome)
