"""The real remote service as a process, started once per session on a free
loopback port and reset before each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from devstack.remote_service.process import RemoteServiceProcess, start_remote_service


@pytest.fixture(scope="session")
def remote_service_process() -> Iterator[RemoteServiceProcess]:
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
    if remote_service_process.process.poll() is not None:
        pytest.fail("the remote service process died:\n" + remote_service_process.log_tail())
    admin = RemoteAdmin(http, remote_service_process.url)
    await admin.reset()
    return admin
