"""A step on a service of its own at another base URL: the Agent, its HTTP
client and two real remote service processes (devstack.remote_service), the
catalog with a fourth step added by data alone (tests/added_step.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from adapters.clock import SystemClock
from agents.agent import Agent, AgentPolicy
from agents.remote_client import HttpRemoteService
from devstack.remote_service.process import start_remote_service
from domain.models import ReplyOutcome
from tests.added_step import with_warehouse_step, write_catalog
from tests.builders import agent_request

pytestmark = pytest.mark.integration

FAST = AgentPolicy(call_timeout=2.0, initial_backoff=0.02, max_backoff=0.1, reply_margin=0.2)
PAYLOAD = {"CustomerId": "C-1", "Lines": [{"Sku": "S-1"}], "Total": "10.00", "Currency": "EUR"}


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """The remote service every step calls by default, and a second one for the
    warehouse; both serve the catalog with the added step."""
    path = write_catalog(tmp_path_factory.mktemp("catalog") / "steps.json")
    main = start_remote_service(seed=1, catalog=path)
    try:
        warehouse = start_remote_service(seed=2, catalog=path)
        try:
            yield main, warehouse
        finally:
            warehouse.stop()
    finally:
        main.stop()


async def effects(http: aiohttp.ClientSession, url: str, order_id: str) -> list[tuple[str, str]]:
    async with http.get(f"{url}/_admin/side-effects", params={"order_id": order_id}) as response:
        return [(r["step"], r["operation"]) for r in (await response.json())["effects"]]


async def test_each_call_goes_to_its_services_base_url(services):
    main, warehouse = services
    steps = with_warehouse_step()
    async with aiohttp.ClientSession() as http:
        remote = HttpRemoteService(http, main.url, {"warehouse": warehouse.url})
        agent = Agent(remote, SystemClock(), FAST, rng=random.Random(1), steps=steps)
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        for step, action in [
            ("reserve-warehouse-slot", "do"),
            ("charge-payment", "do"),
            ("reserve-warehouse-slot", "undo"),
        ]:
            reply = await agent.handle(agent_request("o-urls", step, 1, action, deadline, PAYLOAD))
            assert reply.Outcome is ReplyOutcome.OK, reply.Error

        assert await effects(http, warehouse.url, "o-urls") == [
            ("reserve-warehouse-slot", "warehouse/release"),
            ("reserve-warehouse-slot", "warehouse/reserve"),
        ]
        assert await effects(http, main.url, "o-urls") == [("charge-payment", "payment/charge")]


async def test_the_shipped_catalog_does_not_know_the_added_step(services):
    main, _ = services
    async with aiohttp.ClientSession() as http:
        agent = Agent(HttpRemoteService(http, main.url), SystemClock(), FAST)
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        request = agent_request("o-unknown", "reserve-warehouse-slot", 1, "do", deadline, PAYLOAD)
        reply = await agent.handle(request)
        assert reply.Outcome is ReplyOutcome.PERMANENT
        assert "unknown step 'reserve-warehouse-slot'" in (reply.Error or "")
        assert await effects(http, main.url, "o-unknown") == []
