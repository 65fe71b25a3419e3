"""The remote services below the product's HTTP adapter (issue 21): an
aiohttp.ClientSession as `agents.remote_client.HttpRemoteService` uses it
(`session.post(url, json=, headers=, timeout=)` as an async context manager
whose response has `status`, `headers` and `text()`), answering with the
simulation's remote services (`sim.system.SimRemote.answer`). So the adapter's
own code (headers, timeout, status mapping, its handling of a timeout) runs.

Its own fault (the fallible world's `slow_answers`): the answer comes after
the client's timeout, with the effect applied or not; the client sees
`asyncio.TimeoutError` after the timeout's worth of world time, as aiohttp
raises it for `ClientTimeout(total=...)`."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from agents.ports import RemoteCall
from agents.remote_client import FENCING_TOKEN_HEADER, IDEMPOTENCY_KEY_HEADER

BASE_URL = "http://remote.sim.invalid"


class _Response:
    def __init__(self, status: int, text: str) -> None:
        self.status = status
        self._text = text
        self.headers: dict[str, str] = {}

    async def text(self) -> str:
        return self._text


class _Request:
    """The async context manager `session.post(...)` returns."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer

    async def __aenter__(self) -> _Response:
        return await self._answer()

    async def __aexit__(self, *exc: object) -> None:
        return None


class SimSession:
    """What HttpRemoteService needs of aiohttp.ClientSession."""

    def __init__(self, remote: Any) -> None:
        self.remote = remote

    def post(self, url: str, *, json: Any = None, headers: dict | None = None, timeout: Any = None):
        remote, sent = self.remote, dict(headers or {})

        # Defined here so that the fault surface finds `post` on the stack.
        async def answer() -> _Response:
            world = remote.world
            service, _, operation = urlsplit(url).path.strip("/").partition("/")
            call = RemoteCall(
                service,
                operation,
                sent[IDEMPOTENCY_KEY_HEADER],
                int(sent[FENCING_TOKEN_HEADER]),
                json if isinstance(json, dict) else {},
            )
            total = float(getattr(timeout, "total", None) or 10.0)
            slow = world.faults.slow_answer(f"{service}/{operation} {call.idempotency_key}")
            if slow == "lost":
                # The request never reached the service (a dropped connection, a
                # stalled proxy): nothing applied; the client gives up at its timeout.
                if remote.on_call is not None:
                    remote.on_call(call)
                await world.point(f"remote.{service}.{operation} no answer", delay=total)
                world.log(
                    f"remote {service}/{operation} {call.idempotency_key}: no answer in {total}s"
                )
                raise TimeoutError()
            status, text = await remote.answer(call, timeout=total)
            if slow == "applied":
                # The service did it; its answer comes after the client stopped waiting.
                await world.point(f"remote.{service}.{operation} slow", delay=total)
                world.log(
                    f"remote {service}/{operation} {call.idempotency_key}: answered {status} "
                    f"after the client's {total}s timeout"
                )
                raise TimeoutError()
            return _Response(status, text)

        return _Request(answer)

    async def close(self) -> None:
        return None


def http_remote(remote: Any):
    """The product's HttpRemoteService over the simulated remote services."""
    from agents.remote_client import HttpRemoteService

    return HttpRemoteService(SimSession(remote), BASE_URL)  # type: ignore[arg-type]
