"""The remote service serves the operations of its step catalog: the shipped
one by default, another (with a step added by data alone) when told."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from devstack.remote_service import create_app
from devstack.remote_service.ledger import done_status
from tests.added_step import with_warehouse_step
from tests.devstack.remote_service.helpers import call, effect_count


async def _serve(app: web.Application) -> AsyncIterator[aiohttp.ClientSession]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession(base_url=f"http://{host}:{port}") as session:
            yield session
    finally:
        await runner.cleanup()


@pytest.fixture
async def warehouse_client() -> AsyncIterator[aiohttp.ClientSession]:
    async for session in _serve(create_app(seed=7, steps=with_warehouse_step())):
        yield session


async def test_the_shipped_catalog_has_no_warehouse(client):
    response = await call(client, "/warehouse/reserve", key="o1/reserve-warehouse-slot")
    assert response.status == 404
    assert (await response.json())["code"] == "UnknownOperation"
    response = await client.post("/_admin/faults", json={"kind": "crash", "service": "warehouse"})
    assert response.status == 400
    assert "unknown service 'warehouse'" in (await response.json())["error"]


async def test_a_catalog_with_an_added_step_serves_its_operations(warehouse_client):
    key = "o1/reserve-warehouse-slot"
    response = await call(warehouse_client, "/warehouse/reserve", key=key)
    assert response.status == 200
    body = await response.json()
    assert (body["Status"], body["Operation"]) == ("reserved", "warehouse/reserve")
    assert (
        await effect_count(warehouse_client, "o1", "reserve-warehouse-slot", "warehouse/reserve")
        == 1
    )
    # Its undo undoes it; the undo of what never happened changes nothing.
    assert (await call(warehouse_client, "/warehouse/release", key=key)).status == 200
    assert (
        await effect_count(warehouse_client, "o1", "reserve-warehouse-slot", "warehouse/release")
        == 1
    )
    nothing = await call(warehouse_client, "/warehouse/release", key="o2/reserve-warehouse-slot")
    assert (await nothing.json())["Status"] == "nothing-to-undo"
    # Faults are checked against the same catalog, and survive a reset of it.
    rule = {"kind": "permanent", "service": "warehouse", "operation": "reserve"}
    assert (await warehouse_client.post("/_admin/faults", json=rule)).status == 201
    assert (await warehouse_client.post("/_admin/reset")).status == 200
    assert (await call(warehouse_client, "/warehouse/reserve", key="o3/x")).status == 200
    # The old steps are served as before.
    assert (await call(warehouse_client, "/payment/charge", key="o1/charge-payment")).status == 200


def test_an_applied_operation_answers_its_past_tense():
    assert [
        done_status(o) for o in ("reserve", "release", "charge", "refund", "arrange", "cancel")
    ] == [
        "reserved",
        "released",
        "charged",
        "refunded",
        "arranged",
        "cancelled",
    ]
