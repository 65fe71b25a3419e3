"""The real remote service as a process, started once per test module on a
free loopback port and reset before each test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from devstack.remote_service.process import RemoteServiceProcess, start_remote_service


@pytest.fixture(scope="module")
def remote_service_process() -> Iterator[RemoteServiceProcess]:
    # One per test module: a module's workers and hosts are pointed at it,
    # and a module cannot see another's effects.
    service = start_remote_service(seed=1)
    try:
        yield service
    finally:
        service.stop()


class RemoteAdmin:
    """The admin API of the running service, for arranging faults and
    reading what actually happened on its side."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def reset(self) -> None:
        async with self.session.post(f"{self.url}/_admin/reset") as response:
            assert response.status == 200

    async def fault(self, **rule: Any) -> int:
        async with self.session.post(f"{self.url}/_admin/faults", json=rule) as response:
            assert response.status == 201, await response.text()
            return (await response.json())["ids"][0]

    async def side_effects(self, order_id: str | None = None) -> dict[str, Any]:
        params = {"order_id": order_id} if order_id else {}
        async with self.session.get(f"{self.url}/_admin/side-effects", params=params) as response:
            return await response.json()

    async def effect_count(self, order_id: str, step: str, operation: str) -> int:
        for row in (await self.side_effects(order_id))["effects"]:
            if (row["step"], row["operation"]) == (step, operation):
                return row["count"]
        return 0

    async def wait_until_idle(self) -> None:
        """Until no call is being handled (a slow call the client gave up on
        is still running on the service); bounded."""
        for _ in range(200):
            async with self.session.get(f"{self.url}/_admin/requests") as response:
                if (await response.json())["in_flight"] == 0:
                    return
            await asyncio.sleep(0.05)
        pytest.fail("the remote service kept handling calls")

    async def requests(self, order_id: str) -> int:
        params = {"order_id": order_id}
        async with self.session.get(f"{self.url}/_admin/requests", params=params) as response:
            return (await response.json())["total"]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def remote_admin(remote_service_process, http) -> RemoteAdmin:
    if (code := remote_service_process.process.poll()) is not None:
        pytest.fail(
            f"the remote service process exited with {code}:\n" + remote_service_process.log_tail()
        )
    admin = RemoteAdmin(http, remote_service_process.url)
    await admin.reset()
    return admin
