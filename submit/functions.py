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

from submit.handler import Settle, SettleKind

ORDERS_QUEUE = "orders"

bp = func.Blueprint()
log = logging.getLogger(__name__)


def settle(message, actions, outcome: Settle) -> None:
    if outcome.kind is SettleKind.COMPLETE:
        actions.complete(message)
    elif outcome.kind is SettleKind.DEADLETTER:
        actions.deadletter(
            message,
            deadletter_reason=outcome.reason,
            deadletter_error_description=outcome.description,
        )
    else:
        actions.abandon(message)


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
    body = b"".join(message.body) if not isinstance(message.body, bytes) else message.body
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
