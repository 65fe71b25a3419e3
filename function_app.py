"""The Functions app: wiring only. Each part of the pattern registers its own
blueprint; the code lives in the folders named after the part.

- submit/         Submit: each application's `orders-<appId>` queue into the orders DB and state store
- orchestrators/  the Scheduler: starter, order workflow, reply bridge
- activities/     the Scheduler's side effects (guarded state writes, messages)
- agents/         the Agents: the `agent-requests` queue to the remote services
- supervisor/     the Supervisor: recovers expired attempts
- console/        the operator console: HTTP pages under /api/console
"""

import azure.durable_functions as df
import azure.functions as func

from activities.functions import bp as activities
from agents.functions import bp as agents
from console.functions import bp as console
from orchestrators.functions import bp as scheduler
from submit.functions import bp as submit
from supervisor.functions import bp as supervisor

app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)

for blueprint in (submit, scheduler, activities, agents, supervisor, console):
    app.register_functions(blueprint)
