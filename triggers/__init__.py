"""The entry layer: every Functions trigger of the app, one module per part
of the pattern, each a `blueprint(root)` over the composition root's App.
Only function_app.py imports this package, and the parts it calls import
neither it nor the root (docs/adr/020a-entry-layer.md)."""

from typing import Any

from adapters.settings import SERVICEBUS_CONNECTION


def queue_trigger(bp: Any, queue: str) -> Any:
    """A Service Bus trigger on `queue`, its message bound to the parameter
    `message` and settled by hand."""
    return bp.service_bus_queue_trigger(
        arg_name="message",
        queue_name=queue,
        connection=SERVICEBUS_CONNECTION,
        auto_complete_messages=False,
    )
