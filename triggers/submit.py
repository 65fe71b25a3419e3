"""The Submit triggers: one per client application, on its ingress queue, each
running the root's SubmitHandler through the message gate. Why the queue,
not the body, names the application: docs/adr/010-ingress-queue-identity.md."""

# No `from __future__ import annotations`: the Functions worker reads the
# trigger's parameter annotations to decide what to bind.
import hashlib
import logging
import re

import azure.durable_functions as df
import azurefunctions.extensions.bindings.servicebus as servicebus

from adapters import telemetry
from adapters.settings import SettingsError, ingress_queues
from bootstrap import App
from triggers import queue_trigger

log = logging.getLogger(__name__)

# Function names the host accepts: a letter, then letters, digits, _ and -.
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def function_name(app_id: str) -> str:
    """The Submit function of `app_id`: stable across deploys (it names the
    logs and metrics) and unique per application; an id the host would not
    accept in a name is spelled safely and suffixed with its hash."""
    safe = _UNSAFE.sub("_", app_id)
    if safe != app_id or not app_id:
        safe = f"{safe}_{hashlib.sha256(app_id.encode()).hexdigest()[:8]}"
    return f"submit_order_{safe}"[:128]


def _submit_function(root: App, app_id: str, queue: str):
    async def submit_order(
        message: servicebus.ServiceBusReceivedMessage,
        message_actions: servicebus.ServiceBusMessageActions,
        client: df.DurableOrchestrationClient,
    ) -> None:
        handler = await root.submit_handler()
        gate = await root.message_gate(queue)
        # The order's trace: the client's when its traceparent is valid
        # (docs/client-guide.md), a new one otherwise.
        with telemetry.consume(
            "submit", message, **{"messaging.destination.name": queue, "app.id": app_id}
        ):
            outcome = await gate.run(
                message, message_actions, lambda body: handler.handle(body, app_id, client)
            )
            telemetry.annotate(
                **{telemetry.ORDER_ID: outcome.order_id, "settlement": outcome.kind.value}
            )

    name = function_name(app_id)
    submit_order.__name__ = submit_order.__qualname__ = name
    return name, submit_order


def register(blueprint: df.Blueprint, queues: dict[str, str], root: App) -> dict[str, str]:
    """Register one Submit function per application on `blueprint`, over
    `root`'s handler and gates; function name -> queue."""
    registered: dict[str, str] = {}
    for app_id, queue in sorted(queues.items()):
        name, function = _submit_function(root, app_id, queue)
        if name in registered:
            raise SettingsError(f"ORDER_INGRESS_QUEUES: two applications map to function {name}")
        blueprint.function_name(name)(
            queue_trigger(blueprint, queue)(
                blueprint.durable_client_input(client_name="client")(function)
            )
        )
        registered[name] = queue
    return registered


def blueprint(root: App, queues: dict[str, str] | None = None) -> df.Blueprint:
    """Submit's blueprint: a function per client application of `queues`
    (default: the registry the environment names, ORDER_INGRESS_QUEUES /
    REPLY_QUEUE_REGISTRY, read when the app is indexed)."""
    bp = df.Blueprint()
    if not register(bp, ingress_queues() if queues is None else queues, root):
        log.warning(
            "no client applications configured (ORDER_INGRESS_QUEUES, REPLY_QUEUE_REGISTRY): no Submit trigger"
        )
    return bp
