"""Durable activity triggers of the Scheduler. Each hands its input to
SchedulerActivities.run (built once per process by bootstrap), which decodes
the input contract, calls the use case and returns plain JSON, inside a span
that continues the attempt's trace (the input's `Trace`, copied there by the
orchestration: adapters.telemetry)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import azure.durable_functions as df

import bootstrap
from adapters import telemetry
from domain.ids import parse_attempt_instance_id

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


async def _run(name: str, data: dict):
    with _span(name, data):
        acts = await bootstrap.scheduler_activities()
        return await acts.run(name, data)


@bp.function_name("load_plan")
@bp.activity_trigger(input_name="data")
async def load_plan(data: dict) -> dict:
    return await _run("load_plan", data)


@bp.function_name("write_state")
@bp.activity_trigger(input_name="data")
async def write_state(data: dict) -> dict:
    return await _run("write_state", data)


@bp.function_name("send_agent_request")
@bp.activity_trigger(input_name="data")
async def send_agent_request(data: dict) -> str:
    return await _run("send_agent_request", data)


@bp.function_name("run_inline_step")
@bp.activity_trigger(input_name="data")
async def run_inline_step(data: dict) -> dict:
    return await _run("run_inline_step", data)


@bp.function_name("report_status")
@bp.activity_trigger(input_name="data")
async def report_status(data: dict) -> None:
    await _run("report_status", data)


@bp.function_name("raise_alert")
@bp.activity_trigger(input_name="data")
async def raise_alert(data: dict) -> None:
    await _run("raise_alert", data)


# --- workflow 2.0 ------------------------------------------------------------------------


@bp.function_name("begin_attempt")
@bp.activity_trigger(input_name="data")
async def begin_attempt(data: dict) -> dict:
    return await _run("begin_attempt", data)


@bp.function_name("advance_attempt")
@bp.activity_trigger(input_name="data")
async def advance_attempt(data: dict) -> dict:
    return await _run("advance_attempt", data)
