"""Durable entities on a real host process: the samples' counter, used from an orchestration,
from the SDK client, and from an HTTP function through the client binding."""

from __future__ import annotations

from typing import Any

import aiohttp
import azure.durable_functions as df
import pytest

from .conftest import OFFICIAL_APP, HostProcess, wait_for, wait_status

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture
def host(host_factory: Any) -> HostProcess:
    return host_factory(app_dir=OFFICIAL_APP, hub="OfficialHub", app="function_app:myApp")


async def test_an_orchestration_signals_and_calls_a_counter(host: HostProcess) -> None:
    client = host.client
    iid = await client.start_new("counter_orchestrator", None, {"key": "orch"})
    status = await wait_status(client, iid, "Completed", "Failed")
    assert status.runtime_status.value == "Completed", status.output
    # The signal is delivered before the call (one queue per entity, in order): 1 + 5.
    assert status.output["after_add"] == 6
    assert "counter cannot fail at 6" in status.output["error"]
    assert status.output["get"] == 6  # the failed operation changed nothing
    state = await client.read_entity_state(df.EntityId("Counter", "orch"))
    assert state.entity_exists
    assert state.entity_state == 6
    events = [e["EventType"] for e in status.historyEvents]
    assert events.count("EventSent") == 4
    assert events.count("EventRaised") == 3


async def test_the_client_signals_and_reads_a_counter(host: HostProcess) -> None:
    client = host.client
    entity = df.EntityId("Counter", "client")
    assert not (await client.read_entity_state(entity)).entity_exists
    for amount in (10, 20, 12):
        await client.signal_entity(entity, "add", amount)

    async def total() -> Any:
        s = await client.read_entity_state(entity)
        return s.entity_state if s.entity_exists and s.entity_state == 42 else None

    assert await wait_for(total, what="the three signals") == 42
    await client.signal_entity(entity, "reset")
    await wait_for(lambda: _state_is(client, entity, 0), what="the reset")
    await client.signal_entity(entity, "delete")  # destruct_on_exit: the entity no longer exists

    async def gone() -> bool:
        return not (await client.read_entity_state(entity)).entity_exists

    await wait_for(gone, what="the deletion")
    await client.signal_entity(entity, "add", 2)  # and starts afresh
    await wait_for(lambda: _state_is(client, entity, 2), what="a new counter")


async def _state_is(client: Any, entity: Any, value: int) -> bool:
    s = await client.read_entity_state(entity)
    return s.entity_exists and s.entity_state == value


async def test_an_http_function_uses_the_entity_through_its_client_binding(
    host: HostProcess,
) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{host.base}/api/counters/web") as r:
            assert r.status == 404
        async with s.post(f"{host.base}/api/counters/web", json=7) as r:
            assert r.status == 202

        async def seven() -> bool:
            async with s.get(f"{host.base}/api/counters/web") as r:
                return r.status == 200 and await r.json() == 7

        await wait_for(seven, what="the signalled counter")


async def test_signalling_an_unknown_entity_is_refused(host: HostProcess) -> None:
    with pytest.raises(Exception, match="unexpected status code 400"):
        await host.client.signal_entity(df.EntityId("Nope", "k"), "add", 1)
