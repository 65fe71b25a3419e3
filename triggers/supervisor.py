"""The Supervisor's timer trigger (a singleton across hosts, like every timer)."""

from __future__ import annotations

import azure.functions as func

from bootstrap import App


def blueprint(root: App) -> func.Blueprint:
    """The Supervisor's blueprint over `root` (a Supervisor per run)."""
    bp = func.Blueprint()

    @bp.function_name("supervisor")
    @bp.timer_trigger(arg_name="timer", schedule="%SUPERVISOR_SCHEDULE%", run_on_startup=False)
    async def supervisor(
        timer: func.TimerRequest,  # noqa: ARG001 - the binding's arg_name must be a parameter
    ) -> None:
        run = await root.supervisor()
        await run.run()

    return bp
