"""The remote service in-process on a real loopback socket (127.0.0.1, a free
port), served the way `python -m devstack.remote_service` serves it: handlers
are not cancelled when a client disconnects (aiohttp's TestServer would)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from devstack.remote_service import create_app


class ExitCalls(list):
    """Stands in for os._exit so a `crash` rule in mode `exit` is observable."""

    def __call__(self, code: int) -> None:
        self.append(code)


@pytest.fixture
def exits() -> ExitCalls:
    return ExitCalls()


@pytest.fixture
async def client(exits: ExitCalls) -> AsyncIterator[aiohttp.ClientSession]:
    runner = web.AppRunner(create_app(seed=7, exit=exits), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession(base_url=f"http://{host}:{port}") as session:
            yield session
    finally:
        await runner.cleanup()
