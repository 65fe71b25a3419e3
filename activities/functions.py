"""Durable activity triggers of the Scheduler. Each decodes its input contract,
calls SchedulerActivities (built once per process by bootstrap) and returns
plain JSON."""

from __future__ import annotations

import azure.durable_functions as df

import bootstrap
from orchestrators.contracts import (
    Advance,
    AlertNote,
    LoadPlanInput,
    SendRequest,
    StateWrite,
    StatusNote,
)

bp = df.Blueprint()


@bp.function_name("load_plan")
@bp.activity_trigger(input_name="data")
async def load_plan(data: dict) -> dict:
    acts = await bootstrap.scheduler_activities()
    return (await acts.load_plan(LoadPlanInput.model_validate(data))).dump()


@bp.function_name("write_state")
@bp.activity_trigger(input_name="data")
async def write_state(data: dict) -> dict:
    acts = await bootstrap.scheduler_activities()
    return (await acts.write_state(StateWrite.model_validate(data))).dump()


@bp.function_name("send_agent_request")
@bp.activity_trigger(input_name="data")
async def send_agent_request(data: dict) -> str:
    acts = await bootstrap.scheduler_activities()
    return await acts.send_agent_request(SendRequest.model_validate(data))


@bp.function_name("run_inline_step")
@bp.activity_trigger(input_name="data")
async def run_inline_step(data: dict) -> dict:
    acts = await bootstrap.scheduler_activities()
    return (await acts.run_inline_step(SendRequest.model_validate(data))).model_dump(mode="json")


@bp.function_name("report_status")
@bp.activity_trigger(input_name="data")
async def report_status(data: dict) -> None:
    acts = await bootstrap.scheduler_activities()
    await acts.report_status(StatusNote.model_validate(data))


@bp.function_name("raise_alert")
@bp.activity_trigger(input_name="data")
async def raise_alert(data: dict) -> None:
    acts = await bootstrap.scheduler_activities()
    await acts.raise_alert(AlertNote.model_validate(data))


# --- workflow 2.0 ------------------------------------------------------------------------


@bp.function_name("begin_attempt")
@bp.activity_trigger(input_name="data")
async def begin_attempt(data: dict) -> dict:
    acts = await bootstrap.scheduler_activities()
    return (await acts.begin(Advance.model_validate(data))).dump()


@bp.function_name("advance_attempt")
@bp.activity_trigger(input_name="data")
async def advance_attempt(data: dict) -> dict:
    acts = await bootstrap.scheduler_activities()
    return (await acts.advance(Advance.model_validate(data))).dump()
