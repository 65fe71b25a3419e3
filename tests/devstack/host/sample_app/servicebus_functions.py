"""Service Bus triggers of the sample app, in a module with postponed annotations (as the
product's are): the host must resolve `ServiceBusReceivedMessage` / `ServiceBusMessageActions`
from strings, as the worker does."""

from __future__ import annotations

import asyncio
import json

import azure.durable_functions as df
import azure.functions as func
from azurefunctions.extensions.bindings.servicebus import (
    ServiceBusMessageActions,
    ServiceBusReceivedMessage,
)

from function_app import record

servicebus_bp = df.Blueprint()


@servicebus_bp.service_bus_queue_trigger(
    arg_name="msg",
    queue_name="%SAMPLE_COMMANDS_QUEUE%",
    connection="ServiceBusConnection",
    auto_complete_messages=False,
)
@servicebus_bp.durable_client_input(client_name="client")
async def commands(
    msg: ServiceBusReceivedMessage,
    message_actions: ServiceBusMessageActions,
    client: df.DurableOrchestrationClient,
) -> None:
    """Manual settlement with the SDK-type binding; drives the durable client."""
    body = json.loads(b"".join(msg.body))
    cmd = body["cmd"]
    record("command", cmd=cmd, message_id=msg.message_id, delivery_count=msg.delivery_count)
    if cmd == "start":
        iid = await client.start_new("race", body["id"], body["input"])
        record("started", instance=iid)
    elif cmd == "deadletter":
        message_actions.deadletter(
            msg, deadletter_reason="Rejected", deadletter_error_description="asked to"
        )
        return
    elif cmd == "slow":
        await asyncio.sleep(body["sleep"])
        record("slow_done", message_id=msg.message_id, delivery_count=msg.delivery_count)
    elif cmd == "client":
        await exercise_client(client, body["id"])
    message_actions.complete(msg)


async def exercise_client(client: df.DurableOrchestrationClient, iid: str) -> None:
    """Every client call the product makes, from inside a function."""
    results = {}
    await client.start_new("race", iid, {"x": 1})
    try:
        await client.start_new("race", iid, {"x": 1})
        results["restart_running"] = "allowed"
    except Exception as exc:  # a Running id cannot be started again
        results["restart_running"] = str(exc)[:200]
    status = await client.get_status(iid)
    results["status"] = status.runtime_status.value if status.runtime_status else None
    listed = await client.get_status_by(
        runtime_status=[
            df.OrchestrationRuntimeStatus.Running,
            df.OrchestrationRuntimeStatus.Pending,
        ]
    )
    results["listed"] = iid in [s.instance_id for s in listed]
    await client.raise_event(iid, "go", "from-client")
    for _ in range(200):
        status = await client.get_status(iid)
        if status.runtime_status == df.OrchestrationRuntimeStatus.Completed:
            break
        await asyncio.sleep(0.05)
    results["output"] = status.output
    try:
        await client.raise_event(iid, "go", "late")
        results["late_event"] = "accepted"
    except Exception as exc:
        results["late_event"] = str(exc)
    other = iid + "-t"
    await client.start_new("race", other, {"x": 2})
    await client.terminate(other, "stop it")
    for _ in range(200):
        status = await client.get_status(other)
        if status.runtime_status == df.OrchestrationRuntimeStatus.Terminated:
            break
        await asyncio.sleep(0.05)
    results["terminated"] = status.runtime_status.value
    results["terminated_output"] = status.output
    purged = await client.purge_instance_history(other)
    results["purged"] = purged.instances_deleted
    results["after_purge"] = bool(await client.get_status(other))
    await client.start_new("race", iid, {"x": 5, "timeout": 1})  # a finished id can be reused
    results["reused"] = True
    record("client_results", instance=iid, results=results)


@servicebus_bp.service_bus_queue_trigger(
    arg_name="msg", queue_name="%SAMPLE_EVENTS_QUEUE%", connection="ServiceBusConnection"
)
@servicebus_bp.durable_client_input(client_name="client")
async def events(msg: func.ServiceBusMessage, client: df.DurableOrchestrationClient) -> None:
    """A plain trigger (auto-complete): raises events, or fails/sleeps when asked."""
    body = json.loads(msg.get_body())
    record("event_message", message_id=msg.message_id, delivery_count=msg.delivery_count)
    if body.get("fail"):
        raise RuntimeError("asked to fail")
    if body.get("sleep"):
        await asyncio.sleep(body["sleep"])
        record("slow_done", message_id=msg.message_id, delivery_count=msg.delivery_count)
        return
    await client.raise_event(body["id"], body["event"], body.get("data"))
