"""Durable activity triggers of the Scheduler: each hands its input to the
root's SchedulerActivities.run, which decodes it, calls the use case and
returns plain JSON in a span continuing the attempt's trace."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import azure.durable_functions as df

from activities.scheduler_activities import ACTIVITY_NAMES
from adapters import telemetry
from bootstrap import App
from domain.ids import parse_attempt_instance_id


@contextmanager
def _span(name: str, data: Any) -> Iterator[None]:
    fields = data if isinstance(data, dict) else {}
    carrier = fields.get("Trace")
    if isinstance(carrier, str):  # a traceparent alone (contracts.Traced)
        carrier = {"traceparent": carrier}
    instance = fields.get("InstanceId")
    order_id = fields.get("OrderID")
    if order_id is None and isinstance(instance, str):
        with suppress(ValueError):
            order_id, _ = parse_attempt_instance_id(instance)
    attributes = {telemetry.ORDER_ID: order_id, telemetry.INSTANCE_ID: instance}
    with telemetry.continue_from(
        f"activity {name}", carrier if isinstance(carrier, dict) else None, **attributes
    ):
        yield


def _activity(bp: df.Blueprint, root: App, name: str) -> None:
    """Register the activity trigger `name`: its span around
    SchedulerActivities.run, which decodes, calls and encodes."""

    async def activity(data: dict) -> Any:
        with _span(name, data):
            acts = await root.scheduler_activities()
            return await acts.run(name, data)

    activity.__name__ = activity.__qualname__ = name
    bp.function_name(name)(bp.activity_trigger(input_name="data")(activity))


def blueprint(root: App) -> df.Blueprint:
    """The Scheduler's activities over `root` (activities.scheduler_activities.ACTIVITY_NAMES)."""
    bp = df.Blueprint()
    for name in ACTIVITY_NAMES:
        _activity(bp, root, name)
    return bp
