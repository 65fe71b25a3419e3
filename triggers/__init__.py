"""The entry layer: every Functions trigger of the app, one module per part
of the pattern, each a `blueprint(root)` over the composition root's App
(bootstrap.build). Only function_app.py imports this package; the parts'
own folders (submit/, orchestrators/, activities/, agents/, supervisor/,
console/) hold the use cases, workflows and agents the triggers call, and
import neither this package nor the root (docs/adr/020a-entry-layer.md).

- submit.py      one Service Bus trigger per client application's `orders-<appId>` queue
- scheduler.py   the order workflow's orchestration, the starter timer, the reply bridge
- activities.py  the Scheduler's activities (guarded state writes, messages)
- agents.py      the queue-triggered Agent on `agent-requests`
- supervisor.py  the Supervisor's timer
- console.py     the operator console's HTTP pages under /api/console
"""

from typing import Any

from adapters.settings import SERVICEBUS_CONNECTION


def queue_trigger(bp: Any, queue: str) -> Any:
    """A Service Bus trigger on `queue`, its message bound to the parameter
    `message` and settled by hand (the function completes, abandons or
    dead-letters it)."""
    return bp.service_bus_queue_trigger(
        arg_name="message",
        queue_name=queue,
        connection=SERVICEBUS_CONNECTION,
        auto_complete_messages=False,
    )
