"""The Functions app: wiring only. The composition root (bootstrap) builds the
process's App; each part of the pattern registers its blueprint over it from
the entry layer (triggers/); the code the triggers call lives in the folders
named after the part (docs/adr/020a-entry-layer.md).

- submit/         Submit: each application's `orders-<appId>` queue into the orders DB and state store
- orchestrators/  the Scheduler: starter, order workflow, reply bridge
- activities/     the Scheduler's side effects (guarded state writes, messages)
- agents/         the Agents: the `agent-requests` queue to the remote services
- supervisor/     the Supervisor: recovers expired attempts
- console/        the operator console: HTTP pages under /api/console
"""

import azure.durable_functions as df
import azure.functions as func

import bootstrap
from triggers import activities, agents, console, scheduler, submit, supervisor


def create_app(root: bootstrap.App) -> df.DFApp:
    """The Functions app over `root`: every part's blueprint, registered in this order."""
    app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)
    for part in (submit, scheduler, activities, agents, supervisor, console):
        app.register_functions(part.blueprint(root))
    return app


# The process's root: settings are read from the environment on first use.
root = bootstrap.build()
app = create_app(root)
