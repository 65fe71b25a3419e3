"""HTTP triggers on a real host process, driven with plain HTTP as a user's curl or browser would.

The app (`official_app/`) is written the way the official Durable samples are: an HTTP
starter returns `client.create_check_status_response(req, instance_id)` and the caller
follows the URLs in it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import pytest
from yarl import URL

from .conftest import OFFICIAL_APP, HostProcess

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture
def host(host_factory: Any) -> HostProcess:
    return host_factory(app_dir=OFFICIAL_APP, hub="OfficialHub", app="function_app:myApp")


async def poll_until_done(
    session: aiohttp.ClientSession, url: str, timeout: float = 30
) -> dict[str, Any]:
    """What a sample's caller does: GET statusQueryGetUri until the status is final."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        async with session.get(url) as r:
            body = await r.json()
            if body["runtimeStatus"] in ("Completed", "Failed", "Terminated"):
                assert r.status == 200
                return body
            assert r.status == 202
            # HttpApiHandler.HandleGetStatusRequestAsync: a 202 names itself to poll again.
            assert r.headers["Location"] == url
            assert r.headers["Retry-After"] == "5"
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} still {body.get('runtimeStatus')} after {timeout}s")


async def start(
    session: aiohttp.ClientSession, host: HostProcess, name: str, payload: Any = None
) -> dict[str, Any]:
    async with session.post(
        f"{host.base}/api/orchestrators/{name}",
        data=json.dumps(payload) if payload is not None else None,
    ) as r:
        assert r.status == 202, await r.text()
        body = await r.json()
        assert r.headers["Location"] == body["statusQueryGetUri"]
        return body


async def test_the_quickstart_starter_answers_with_working_status_urls(host: HostProcess) -> None:
    async with aiohttp.ClientSession() as session:
        links = await start(session, host, "hello_orchestrator")
        assert set(links) >= {
            "id",
            "statusQueryGetUri",
            "sendEventPostUri",
            "terminatePostUri",
            "purgeHistoryDeleteUri",
            "rewindPostUri",
            "suspendPostUri",
            "resumePostUri",
        }
        for key in (
            "statusQueryGetUri",
            "sendEventPostUri",
            "terminatePostUri",
            "purgeHistoryDeleteUri",
        ):
            url = urlparse(links[key])
            assert f"{url.scheme}://{url.netloc}" == host.base, key  # the host's own origin
            assert links["id"] in url.path
        status = await poll_until_done(session, links["statusQueryGetUri"])
        assert status["runtimeStatus"] == "Completed"
        assert status["output"] == ["Hello Seattle", "Hello Tokyo", "Hello London"]
        assert status["instanceId"] == links["id"]
        await check_history_shape(session, links["statusQueryGetUri"])
        async with session.delete(links["purgeHistoryDeleteUri"]) as r:
            assert r.status == 200
            assert (await r.json())["instancesDeleted"] == 1
        async with session.get(links["statusQueryGetUri"]) as r:
            assert r.status == 404


async def test_a_starter_that_waits_for_completion(host: HostProcess) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{host.base}/api/orchestrators-wait/hello_orchestrator") as r:
            assert r.status == 200
            assert await r.json() == ["Hello Seattle", "Hello Tokyo", "Hello London"]
        # Too short a wait: the check-status payload instead, with working URLs.
        async with session.post(
            f"{host.base}/api/orchestrators-wait/approval_orchestrator?timeout=1500"
        ) as r:
            assert r.status == 202
            links = await r.json()
        async with session.get(links["statusQueryGetUri"]) as r:
            assert (await r.json())["runtimeStatus"] in ("Pending", "Running")


async def check_history_shape(session: aiohttp.ClientSession, status_url: str) -> None:
    """showHistory gives the shape the extension documents and builds (DurableClient.cs)."""
    async with session.get(status_url + "&showHistory=true&showHistoryOutput=true") as r:
        events = (await r.json())["historyEvents"]
    assert [e["EventType"] for e in events] == [
        "ExecutionStarted",
        "TaskCompleted",
        "TaskCompleted",
        "TaskCompleted",
        "ExecutionCompleted",
    ]
    assert events[0]["FunctionName"] == "hello_orchestrator"
    tasks = events[1:4]
    assert [t["FunctionName"] for t in tasks] == ["hello"] * 3
    assert [t["Result"] for t in tasks] == ["Hello Seattle", "Hello Tokyo", "Hello London"]
    assert [t["Input"] for t in tasks] == ['"Seattle"', '"Tokyo"', '"London"']
    assert all(t["ScheduledTime"] <= t["Timestamp"] for t in tasks)
    assert events[-1]["OrchestrationStatus"] == "Completed"
    assert events[-1]["Result"] == ["Hello Seattle", "Hello Tokyo", "Hello London"]
    assert not any("EventId" in e or "IsPlayed" in e or "TaskScheduledId" in e for e in events)
    async with session.get(status_url + "&showHistory=true&showInput=false") as r:
        events = (await r.json())["historyEvents"]
    assert not any("Result" in e or "Input" in e for e in events)


JSON_TYPE = {"Content-Type": "application/json"}


async def test_send_event_and_terminate_urls_reach_the_instance(host: HostProcess) -> None:
    async with aiohttp.ClientSession() as session:
        approved = await start(session, host, "approval_orchestrator", {"hours": 1})
        url = approved["sendEventPostUri"].replace("{eventName}", "Approval")
        async with session.post(url, json={"by": "alice"}) as r:
            assert r.status == 202
        status = await poll_until_done(session, approved["statusQueryGetUri"])
        assert status["output"] == {"approved": {"by": "alice"}}
        # Refusals in the extension's order: the instance first (410 once it has ended,
        # 404 without one), then the body.
        async with session.post(url, json={"by": "bob"}) as r:
            assert r.status == 410
        async with session.post(url, data="not json", headers=JSON_TYPE) as r:
            assert r.status == 410
        missing = url.replace(approved["id"], "no-such-instance")
        for body in ({"json": 1}, {"data": "not json", "headers": JSON_TYPE}, {"data": "x"}):
            async with session.post(missing, **body) as r:  # type: ignore[arg-type]
                assert r.status == 404, body
        waiting = await start(session, host, "approval_orchestrator", {"hours": 1})
        url = waiting["sendEventPostUri"].replace("{eventName}", "Approval")
        async with session.post(url, data="not json", headers=JSON_TYPE) as r:
            assert (r.status, (await r.json())["Message"]) == (400, "Invalid JSON content")
        async with session.post(url, data="plain") as r:
            assert r.status == 400
            assert "Only application/json" in (await r.json())["Message"]

        doomed = await start(session, host, "approval_orchestrator", {"hours": 1})
        async with session.post(
            doomed["terminatePostUri"].replace("{text}", "no longer needed")
        ) as r:
            assert r.status == 202
        status = await poll_until_done(session, doomed["statusQueryGetUri"])
        assert status["runtimeStatus"] == "Terminated"
        assert status["output"] == "no longer needed"


async def test_management_urls_answer_as_the_extension_does(host: HostProcess) -> None:
    async with aiohttp.ClientSession() as session:
        links = await start(session, host, "approval_orchestrator", {"hours": 1})
        async with session.post(links["rewindPostUri"].replace("{text}", "x")) as r:  # not Failed
            assert r.status == 500
            assert "only supported on failed" in await r.json()
        async with session.post(links["suspendPostUri"].replace("{text}", "hold")) as r:
            assert r.status == 202
        async with session.get(links["statusQueryGetUri"]) as r:
            assert r.status == 202
            assert r.headers["Location"] == links["statusQueryGetUri"]  # Suspended polls on
        async with session.post(links["resumePostUri"].replace("{text}", "go")) as r:
            assert r.status == 202
        # The instance list shows inputs unless asked not to (the extension's
        # OrchestrationStatusQueryCondition.ShowInput defaults to true): the SDK's
        # get_status_all and get_status_by send no showInput.
        instances = f"{host.base}/runtime/webhooks/durabletask/instances"
        async with session.get(instances) as r:
            listed = {i["instanceId"]: i for i in await r.json()}
        async with session.get(links["statusQueryGetUri"]) as r:
            own = await r.json()
        # The Python SDK's client posts its input encoded (so it is the JSON text here).
        assert listed[links["id"]]["input"] == own["input"] == '{"hours": 1}'
        async with session.get(instances + "?showInput=false") as r:
            listed = {i["instanceId"]: i for i in await r.json()}
        assert listed[links["id"]]["input"] is None


async def test_routes_parameters_methods_and_results(host: HostProcess) -> None:
    base = host.base + "/api"
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/items/42?q=red") as r:
            assert r.status == 200
            assert r.headers["X-Item"] == "42"
            assert r.headers["Content-Type"].startswith("application/json")
            assert await r.json() == {"id": 42, "q": "red"}
        async with s.get(
            f"{base}/ITEMS/7"
        ) as r:  # literals match case-insensitively, as in ASP.NET routing
            assert (await r.json())["id"] == 7
        async with s.get(
            f"{base}/items/lamp"
        ) as r:  # fails the :int constraint, so the next route takes it
            assert await r.json() == {"name": "lamp", "method": "GET", "body": None}
        async with s.put(f"{base}/items/lamp", json={"colour": "blue"}) as r:
            assert r.status == 201
            assert (await r.json())["body"] == {"colour": "blue"}
        async with s.post(f"{base}/items/lamp") as r:  # no route takes POST here
            assert r.status == 404
        async with s.get(f"{base}/files/a/b/c.txt") as r:
            assert r.status == 200
            assert await r.text() == "path=a/b/c.txt"
        async with s.get(f"{base}/files") as r:
            assert await r.text() == "path="
        async with s.get(f"{base}/broken") as r:
            assert r.status == 500
        async with s.get(
            f"{base}/nothing"
        ) as r:  # the worker cannot encode None for an http output
            assert r.status == 500
        async with s.get(f"{base}/cookies") as r:
            assert sorted(r.headers.getall("Set-Cookie")) == ["a=1; Path=/", "b=2; Path=/"]
            assert await r.text() == "two cookies"
        async with s.get(f"{base}/no-such-route") as r:
            assert r.status == 404
        async with s.get(f"{host.base}/items/42") as r:  # outside the route prefix
            assert r.status == 404


async def test_an_encoded_slash_stays_inside_its_segment(host: HostProcess) -> None:
    """As on Core Tools (Kestrel): routes match the path with `%2F` left encoded, other
    escapes decoded, and the route value keeps the `%2F` (see routing_path)."""
    base = host.base + "/api"

    async def get(path: str) -> tuple[int, str]:
        async with s.get(URL(base + path, encoded=True)) as r:
            return r.status, await r.text()

    async with aiohttp.ClientSession() as s:
        assert await get("/orders/a%2Fb") == (200, "order a%2Fb")
        assert await get("/orders/a%2fb") == (200, "order a%2fb")
        assert await get("/orders/a/b") == (200, "order a part b")
        assert await get("/orders/caf%C3%A9%20x%252F") == (200, "order café x%2F")
        assert await get("/files/a%2Fb/c") == (200, "path=a%2Fb/c")
        status, body = await get("/items/a%2Fb")
        assert (status, json.loads(body)["name"]) == (200, "a%2Fb")


async def test_keys_are_not_checked_locally_as_core_tools_does_not(host: HostProcess) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{host.base}/api/admin-only") as r:  # authLevel ADMIN, no key
            assert r.status == 200
            assert await r.text() == "admin ok"
        async with s.get(f"{host.base}/api/items/1?code=anything") as r:
            assert r.status == 200


async def test_route_prefix_comes_from_host_json(host_factory: Any, tmp_path: Path) -> None:
    host_json = tmp_path / "host.json"
    host_json.write_text(
        json.dumps(
            {
                "version": "2.0",
                "extensions": {
                    "http": {"routePrefix": ""},
                    "durableTask": {"hubName": "OfficialHub"},
                },
            }
        )
    )
    host = host_factory(
        app_dir=OFFICIAL_APP,
        hub="OfficialHub",
        app="function_app:myApp",
        args=["--host-json", str(host_json)],
    )
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{host.base}/items/5") as r:
            assert (await r.json())["id"] == 5
        async with s.get(f"{host.base}/api/items/5") as r:
            assert r.status == 404
        async with s.post(f"{host.base}/orchestrators/hello_orchestrator") as r:
            links = await r.json()
        assert (await poll_until_done(s, links["statusQueryGetUri"]))[
            "runtimeStatus"
        ] == "Completed"


@pytest.mark.parametrize(
    ("child", "expected"),
    [
        ("child_returns_at_once", {"value": 21}),
        ("child_returns_before_yield", {"value": 40}),
    ],
)
async def test_a_child_that_returns_in_its_first_episode_reports_to_its_parent(
    host: HostProcess, child: str, expected: dict[str, Any]
) -> None:
    async with aiohttp.ClientSession() as session:
        links = await start(session, host, "family", {"child": child})
        status = await poll_until_done(session, links["statusQueryGetUri"])
    assert status["runtimeStatus"] == "Completed"
    assert status["output"] == expected
    kid = await host.client.get_status(f"{links['id']}-kid")
    assert kid.runtime_status.value == "Completed"


async def test_a_child_that_raises_before_yielding_fails_its_parents_task(
    host: HostProcess,
) -> None:
    async with aiohttp.ClientSession() as session:
        links = await start(session, host, "family", {"child": "child_raises_at_once"})
        status = await poll_until_done(session, links["statusQueryGetUri"])
    assert status["runtimeStatus"] == "Completed"
    assert "child refused 20" in status["output"]["failed"]
    kid = await host.client.get_status(f"{links['id']}-kid")
    assert kid.runtime_status.value == "Failed"
