"""Durable activity triggers of the Scheduler. Each decodes its input contract,
calls SchedulerActivities (built once per process by bootstrap) and returns
plain JSON, inside a span that continues the attempt's trace (the input's
`Trace`, copied there by the orchestration: adapters.telemetry)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import azure.durable_functions as df

import bootstrap
from adapters import telemetry
from domain.ids import parse_attempt_instance_id
from orchestrators.contracts import (
    Advance,
    AlertNote,
    LoadPlanInput,
    SendRequest,
    StateWrite,
    StatusNote,
)

bp = df.Blueprint()


@contextmanager
def _span(name: str, data: dict) -> Iterator[None]:
    carrier = data.get("Trace") if isinstance(data, dict) else None
    instance = data.get("InstanceId") if isinstance(data, dict) else None
    order_id = data.get("OrderID") if isinstance(data, dict) else None
    if order_id is None and isinstance(instance, str):
        with suppress(ValueError):
            order_id, _ = parse_attempt_instance_id(instance)
    attributes: dict[str, Any] = {telemetry.ORDER_ID: order_id, telemetry.INSTANCE_ID: instance}
    with telemetry.continue_from(
        f"activity {name}",
        carrier if isinstance(carrier, dict) else None,
        **attributes,
    ):
        yield


@bp.function_name("load_plan")
@bp.activity_trigger(input_name="data")
async def load_plan(data: dict) -> dict:
    with _span("load_plan", data):
        acts = await bootstrap.scheduler_activities()
        return (await acts.load_plan(LoadPlanInput.model_validate(data))).dump()


@bp.function_name("write_state")
@bp.activity_trigger(input_name="data")
async def write_state(data: dict) -> dict:
    with _span("write_state", data):
        acts = await bootstrap.scheduler_activities()
        return (await acts.write_state(StateWrite.model_validate(data))).dump()


@bp.function_name("send_agent_request")
@bp.activity_trigger(input_name="data")
async def send_agent_request(data: dict) -> str:
    with _span("send_agent_request", data):
        acts = await bootstrap.scheduler_activities()
        return await acts.send_agent_request(SendRequest.model_validate(data))


@bp.function_name("run_inline_step")
@bp.activity_trigger(input_name="data")
async def run_inline_step(data: dict) -> dict:
    with _span("run_inline_step", data):
        acts = await bootstrap.scheduler_activities()
        return (await acts.run_inline_step(SendRequest.model_validate(data))).model_dump(
            mode="json"
        )


@bp.function_name("report_status")
@bp.activity_trigger(input_name="data")
async def report_status(data: dict) -> None:
    with _span("report_status", data):
        acts = await bootstrap.scheduler_activities()
        await acts.report_status(StatusNote.model_validate(data))


@bp.function_name("raise_alert")
@bp.activity_trigger(input_name="data")
async def raise_alert(data: dict) -> None:
    with _span("raise_alert", data):
        acts = await bootstrap.scheduler_activities()
        await acts.raise_alert(AlertNote.model_validate(data))


# --- workflow 2.0 ------------------------------------------------------------------------


@bp.function_name("begin_attempt")
@bp.activity_trigger(input_name="data")
async def begin_attempt(data: dict) -> dict:
    with _span("begin_attempt", data):
        acts = await bootstrap.scheduler_activities()
        return (await acts.begin(Advance.model_validate(data))).dump()


@bp.function_name("advance_attempt")
@bp.activity_trigger(input_name="data")
async def advance_attempt(data: dict) -> dict:
    with _span("advance_attempt", data):
        acts = await bootstrap.scheduler_activities()
        return (await acts.advance(Advance.model_validate(data))).dump()
