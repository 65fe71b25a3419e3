"""Instance management through the SDK client: suspend, resume, restart (and rewind, refused by name)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from .conftest import OFFICIAL_APP, HostProcess, wait_status

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture
def host(host_factory: Any) -> HostProcess:
    return host_factory(app_dir=OFFICIAL_APP, hub="OfficialHub", app="function_app:myApp")


async def test_a_suspended_instance_holds_its_events_until_resumed(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("approval_orchestrator", None, {"hours": 1})
    await wait_status(client, iid, "Running")
    await client.suspend(iid, "waiting for audit")
    await wait_status(client, iid, "Suspended")
    await client.raise_event(iid, "Approval", "yes")
    await asyncio.sleep(1.5)  # the event must not be processed while suspended
    assert (await client.get_status(iid)).runtime_status.value == "Suspended"
    await client.resume(iid, "audit done")
    status = await wait_status(client, iid, "Completed", "Failed")
    assert status.output == {
        "approved": '"yes"'
    }  # the SDK client double-encodes event data (see docs)
    types = [e["EventType"] for e in status.historyEvents]
    assert (
        types.index("ExecutionSuspended")
        < types.index("ExecutionResumed")
        < types.index("EventRaised")
    )
    await client.suspend(iid, "too late")  # 410 Gone: the client treats it as done
    with pytest.raises(Exception, match="No instance with ID 'nope' found"):
        await client.suspend("nope", "x")


async def test_terminating_a_suspended_instance(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("approval_orchestrator", None, {"hours": 1})
    await wait_status(client, iid, "Running")
    await client.suspend(iid, "hold")
    await wait_status(client, iid, "Suspended")
    await client.terminate(iid, "cancelled while held")
    status = await wait_status(client, iid, "Terminated")
    assert status.output == "cancelled while held"


async def test_restart_runs_the_orchestration_again_with_its_input(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("hello_orchestrator")
    first = await wait_status(client, iid, "Completed")
    # The SDK returns the extension's check-status payload here (its body), not a bare id.
    again = await client.restart(iid, restart_with_new_instance_id=False)
    assert again["id"] == iid
    second = await wait_status(client, iid, "Completed")
    assert second.output == first.output
    fresh = await client.restart(iid)
    assert fresh["id"] != iid
    assert (await wait_status(client, fresh["id"], "Completed")).output == first.output
    with pytest.raises(Exception, match="unexpected status code 400"):
        await client.restart("nope")


async def test_rewind_reruns_the_failed_activity_of_a_failed_instance(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("rewindable")
    failed = await wait_status(client, iid, "Completed", "Failed")
    assert failed.runtime_status.value == "Failed"
    assert "first attempt fails" in failed.output
    await client.rewind(iid, "the dependency is back")
    status = await wait_status(client, iid, "Completed", "Failed")
    assert status.runtime_status.value == "Completed", status.output
    assert status.output == ["Hello Oslo", "second attempt works"]
    types = [e["EventType"] for e in status.historyEvents]
    assert types.count("TaskFailed") == 0
    assert types.count("TaskCompleted") == 2
    with pytest.raises(Exception, match="only supported on failed orchestration instances"):
        await client.rewind(iid, "again")  # Completed: 410 Gone
    running = await client.start_new("approval_orchestrator", None, {"hours": 1})
    await wait_status(client, running, "Running")
    with pytest.raises(Exception, match="only supported on failed orchestration instances"):
        await client.rewind(running, "not failed")


async def test_call_http_returns_the_response_and_does_not_follow_202(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("http_caller", None, {"base": host.base})
    status = await wait_status(client, iid, "Completed", "Failed")
    assert status.runtime_status.value == "Completed", status.output
    item = status.output["item"]
    assert item["statusCode"] == 200
    assert json.loads(item["content"]) == {"id": 9, "q": "x"}
    assert item["headers"]["X-Item"] == "9"
    accepted = status.output["accepted"]
    # The Python SDK 1.x does not ask the extension to poll (azure-functions-durable-python#380):
    # the 202 itself is the result, with its Location for the orchestrator to follow.
    assert accepted["statusCode"] == 202
    assert accepted["headers"]["Location"].endswith("/api/items/1")
    assert json.loads(accepted["content"])["body"] == {"size": 3}
    assert json.loads(accepted["content"])["trace"] == "t1"
    functions = [
        e.get("FunctionName") for e in status.historyEvents if e["EventType"] == "TaskCompleted"
    ]
    assert functions == ["BuiltIn::HttpActivity", "BuiltIn::HttpActivity"]
