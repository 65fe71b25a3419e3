"""Orchestrations on a real host process, driven through the real DurableOrchestrationClient."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import pytest
from azure.durable_functions import OrchestrationRuntimeStatus

from .conftest import HostProcess, wait_for, wait_status

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def history_types(status: Any) -> list[str]:
    return [e["EventType"] for e in getattr(status, "historyEvents", [])]


@pytest.fixture
def host(host_factory: Any) -> HostProcess:
    return host_factory(clock="controllable")


async def wait_stage(host: HostProcess, iid: str, stage: str) -> None:
    async def check() -> bool:
        s = await host.client.get_status(iid)
        return bool(s) and (s.custom_status or {}).get("stage") == stage

    await wait_for(check, what=f"{iid} at stage {stage}")


async def test_the_event_wins_the_race(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("race", "event-wins", {"x": 21})
    assert iid == "event-wins"
    await wait_stage(host, iid, "waiting")
    await client.raise_event(iid, "go", {"ok": True})
    status = await wait_status(client, iid, "Completed", "Failed")
    # The SDK client JSON-encodes event data twice; the real host hands the orchestrator the
    # JSON text (azure-functions-durable-python#295), and so does this one.
    assert status.output == {
        "doubled": 42,
        "event": '{"ok": true}',
        "effect": "effect:event-wins",
        "version": "2.0",
    }
    assert status.custom_status == {"stage": "done"}
    assert history_types(status).count("ExecutionCompleted") == 1
    assert len(host.events("effect", instance=iid)) == 1


async def test_the_timer_wins_the_race_when_the_clock_passes_the_deadline(
    host: HostProcess,
) -> None:
    client = host.client
    iid = await client.start_new("race", "timer-wins", {"x": 1, "timeout": 600})
    await wait_stage(host, iid, "waiting")
    host.advance(599)
    with pytest.raises(AssertionError):
        await wait_status(client, iid, "Completed", timeout=1)
    host.advance(2)
    status = await wait_status(client, iid, "Completed", "Failed")
    assert status.output == {"doubled": 2, "timeout": True, "version": "2.0"}
    # A late event to a finished instance is refused with 410, as the real API does.
    with pytest.raises(Exception, match="is gone"):
        await client.raise_event(iid, "go", "late")


async def test_an_event_raised_before_the_orchestrator_waits_is_buffered(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("race", "early-event", {"x": 3, "sleep": 1.5})
    await wait_for(
        lambda: host.events("double_started", instance=iid), what="the activity to start"
    )
    await client.raise_event(iid, "go", "early")
    status = await wait_status(client, iid, "Completed", "Failed")
    assert status.output["event"] == '"early"'


async def test_running_ids_cannot_be_started_again_but_finished_ids_can(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("race", "reuse", {"x": 1, "timeout": 10})
    with pytest.raises(
        Exception,
        match=r"An Orchestration instance with the status (Running|Pending) already exists",
    ):
        await client.start_new("race", iid, {"x": 1})
    await wait_stage(host, iid, "waiting")
    host.advance(11)
    first = await wait_status(client, iid, "Completed")
    assert first.output["doubled"] == 2
    await client.start_new("race", iid, {"x": 50})
    await client.raise_event(iid, "go", 1)
    second = await wait_for(lambda: _completed_with(client, iid, 100), what="the second run")
    assert second.output["event"] == "1"
    assert (
        history_types(second).count("ExecutionStarted") == 1
    )  # the old execution's history is gone


async def _completed_with(client: Any, iid: str, doubled: int) -> Any:
    s = await client.get_status(iid, show_history=True)
    return (
        s
        if s.runtime_status
        and s.runtime_status.value == "Completed"
        and s.output["doubled"] == doubled
        else None
    )


async def test_terminate_then_purge(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("race", "doomed", {"x": 1})
    await wait_stage(host, iid, "waiting")
    await client.terminate(iid, "operator said so")
    status = await wait_status(client, iid, "Terminated")
    assert status.output == "operator said so"
    await client.terminate(iid, "again")  # 410 Gone: the client treats it as done
    with pytest.raises(Exception, match="No instance"):
        await client.raise_event("never-started", "go", 1)
    assert (await client.purge_instance_history(iid)).instances_deleted == 1
    assert not await client.get_status(iid)
    assert (await client.purge_instance_history(iid)).instances_deleted == 0


async def test_start_with_an_unknown_orchestrator_is_a_clean_error(host: HostProcess) -> None:
    with pytest.raises(Exception, match="The function 'nope' doesn't exist"):
        await host.client.start_new("nope")


async def test_version_comes_from_host_json_unless_the_client_gives_one(host: HostProcess) -> None:
    client = host.client
    await client.start_new("race", "v-default", {"x": 1, "timeout": 5})
    await client.start_new("race", "v-explicit", {"x": 1, "timeout": 5}, version="1.1")
    await wait_stage(host, "v-default", "waiting")
    await wait_stage(host, "v-explicit", "waiting")
    host.advance(6)
    assert (await wait_status(client, "v-default", "Completed")).output["version"] == "2.0"
    assert (await wait_status(client, "v-explicit", "Completed")).output["version"] == "1.1"


async def test_activity_retries_wait_on_durable_timers(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("retrying", "retry-1")

    async def advanced_until_done() -> Any:
        host.advance(1)
        s = await client.get_status(iid)
        return s if s.runtime_status and s.runtime_status.value in ("Completed", "Failed") else None

    status = await wait_for(advanced_until_done, what="the retried activity")
    assert status.runtime_status.value == "Completed"
    assert status.output == "third time lucky"
    assert len(host.events("fails_twice", instance=iid)) == 3


async def test_a_replay_reads_its_past_as_played_and_its_new_events_as_new(
    host: HostProcess,
) -> None:
    # Three episodes; the last replays the two before it (from the host's copy of the
    # history) before it meets the new result.
    status = await wait_status(
        host.client, await host.client.start_new("replay_flags", "flags-1"), "Completed", "Failed"
    )
    assert status.output == [True, True, False]


async def test_a_non_deterministic_orchestrator_fails_with_a_report(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("unstable", "unstable-1")
    status = await wait_status(client, iid, "Completed", "Failed")
    assert status.runtime_status.value == "Failed"
    assert "Non-Deterministic workflow detected" in status.output
    assert "record_effect" in status.output


async def test_sub_orchestrations_and_queries(host: HostProcess) -> None:
    client = host.client
    await client.start_new("parent", "fam")
    status = await wait_status(client, "fam", "Completed", "Failed")
    assert status.output == 2
    children = await client.get_status_by(instance_id_prefix="fam-child-")
    assert sorted(c.instance_id for c in children) == ["fam-child-0", "fam-child-1"]
    completed = await client.get_status_by(runtime_status=[s.runtime_status for s in children][:1])
    assert {"fam", "fam-child-0", "fam-child-1"} <= {c.instance_id for c in completed}
    purged = await client.purge_instance_history_by(
        created_time_from=datetime(2000, 1, 1),
        runtime_status=[OrchestrationRuntimeStatus.Completed],
    )
    assert purged.instances_deleted >= 3
    assert not await client.get_status("fam-child-0")


async def test_an_unnamed_child_is_named_as_durable_task_core_names_it(host: HostProcess) -> None:
    """Named "{the parent's ExecutionId}:{the child's task id}" (TaskOrchestrationContext.
    CreateSubOrchestrationInstanceCore): the activity before it took task id 0."""
    client = host.client
    await client.start_new("unnamed_parent", "unnamed")
    status = await wait_status(client, "unnamed", "Completed", "Failed")
    assert status.output == 4
    children = [s for s in await client.get_status_all() if s.name == "child"]
    assert [c.output for c in children] == [4]
    assert re.fullmatch(r"[0-9a-f]{32}:1", children[0].instance_id), children[0].instance_id


async def test_continue_as_new_starts_a_fresh_history(host: HostProcess) -> None:
    client = host.client
    await client.start_new("counter", "counter-1", 0)
    status = await wait_status(client, "counter-1", "Completed", "Failed")
    assert status.output == 3
    assert len(host.events("double_started", instance="counter-1")) == 3
    assert history_types(status).count("TaskCompleted") == 0  # the last execution ran nothing


@pytest.mark.parametrize("failure", ["Fail", "Reject", None])
async def test_version_match_strategy_refuses_newer_orchestrations(
    host_factory: Any, tmp_path: Any, failure: str | None
) -> None:
    """None: host.json names no strategy, so the documented defaults apply (CurrentOrOlder, Reject)."""
    durable = {"hubName": "SampleHub", "defaultVersion": "2.0"}
    if failure is not None:
        durable.update(versionMatchStrategy="CurrentOrOlder", versionFailureStrategy=failure)
    host_json = tmp_path / "host.json"
    host_json.write_text(json.dumps({"version": "2.0", "extensions": {"durableTask": durable}}))
    host = host_factory(clock="controllable", args=["--host-json", str(host_json)])
    client = host.client
    await client.start_new("race", "older", {"x": 1, "timeout": 1}, version="1.5")
    await client.start_new("race", "newer", {"x": 1, "timeout": 1}, version="10.0")
    await wait_stage(host, "older", "waiting")
    host.advance(2)
    assert (await wait_status(client, "older", "Completed")).output["version"] == "1.5"
    if failure == "Fail":
        status = await wait_status(client, "newer", "Failed")
        assert "newer than the worker version '2.0'" in status.output
    else:
        await wait_for(
            lambda: "orchestration newer rejected" in host.log_tail(50), what="the rejection"
        )
        assert (await client.get_status("newer")).runtime_status.value == "Pending"
