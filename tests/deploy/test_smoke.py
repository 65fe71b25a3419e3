"""The smoke test (deploy/smoke.py) against the local stack, started as
tests/e2e/conftest.py starts it, so the script `azd deploy` runs afterwards
cannot rot: it counts the host's functions against the app's own list, sends
one order of the smoke application, and receives it Processed from the smoke
application's own reply queue, with the remote service's ledger untouched
(the agents answer a smoke order from their built-in no-op); and it fails,
saying so, when a function is missing or the order does not come back
Processed. A send or receive that Service Bus refuses (a role assignment
still propagating) is retried and said, until the propagation time runs out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.smoke import _Refused, _Waiter, local_target, run
from devstack.stack import Stack
from domain.ids import SMOKE_APP_ID
from tests.e2e.conftest import E2E_SETTINGS
from tests.infra.bicep_model import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("stack")
    with Stack(Path(run_dir), overrides=E2E_SETTINGS) as stack:
        yield stack


def _target(stack: Stack):
    host = f"http://127.0.0.1:{stack.ports.host}"
    return local_target(stack.settings, host, str(stack.run_dir / "logs" / "host.log"))


async def _remote_ledger(remote: str) -> tuple[dict, dict]:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"{remote}/_admin/side-effects") as response:
            effects = await response.json()
        async with http.get(f"{remote}/_admin/requests") as response:
            requests = await response.json()
    requests.pop("in_flight", None)
    return effects, requests


async def _peek_all(stack: Stack, queue: str) -> list:
    from azure.servicebus.aio import ServiceBusClient

    async with (
        ServiceBusClient.from_connection_string(stack.settings["ServiceBusConnection"]) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        return await receiver.peek_messages(max_message_count=200)


async def test_a_smoke_order_is_processed_and_touches_no_remote_service(stack):
    remote = stack.settings["REMOTE_SERVICE_URL"]
    before = await _remote_ledger(remote)
    lines: list[str] = []
    result = await run(_target(stack), timeout=120, out=lines.append)
    print("\n".join(lines))
    assert result.ok, "\n".join(lines)
    ingress = json.loads(stack.settings["ORDER_INGRESS_QUEUES"])
    assert ingress[SMOKE_APP_ID] == "orders-smoke"
    assert lines[0].endswith("functions indexed"), lines[0]
    indexed, _, expected = lines[0].split(": ")[-1].split()[:3]
    assert indexed == expected
    assert int(expected) >= 20 + len(ingress)
    assert result.order_id.startswith("SMOKE-")
    assert (
        f"smoke: posted {result.order_id} to orders-smoke; waiting for its status on replies-smoke"
        in lines
    )
    assert (
        lines[-1]
        == f"smoke: ok: {result.order_id} Processed {result.seconds:.1f} s after it was sent"
    )
    # The remote service's ledger is untouched: no effect, not even a request.
    assert await _remote_ledger(remote) == before
    # The statuses were received from the smoke application's own queue, and
    # no client's reply queue got anything.
    assert not any(
        result.order_id.encode() in b"".join(m.body)
        for m in await _peek_all(stack, "replies-smoke")
    )
    assert await _peek_all(stack, "replies-webshop") == []


async def test_a_missing_function_fails_the_smoke_test_naming_it(stack):
    target = _target(stack)
    real = target.indexed

    async def one_less():
        return [name for name in await real() if name != "reply_bridge"]

    target.indexed = one_less
    lines: list[str] = []
    result = await run(target, timeout=5, out=lines.append)
    assert not result.ok
    assert "smoke: FAIL not indexed: reply_bridge" in lines
    assert any("host's indexing errors" in line for line in lines)


async def test_an_order_that_is_not_processed_fails_with_where_to_look(stack):
    """The remote service declines every payment: a webshop order (the smoke
    application's never reaches it) compensates, and the smoke test says so
    and where to look."""
    import aiohttp

    remote = stack.settings["REMOTE_SERVICE_URL"]
    async with aiohttp.ClientSession() as http:
        rule = {
            "kind": "permanent",
            "service": "payment",
            "operation": "charge",
            "message": "card declined",
        }
        async with http.post(f"{remote}/_admin/faults", json=rule) as response:
            assert response.status < 300, await response.text()
        try:
            lines: list[str] = []
            target = _target(stack)
            target.app_id = "webshop"
            result = await run(target, timeout=120, out=lines.append)
        finally:
            async with http.delete(f"{remote}/_admin/faults"):
                pass
    assert not result.ok
    fails = [line for line in lines if line.startswith("smoke: FAIL")]
    assert len(fails) == 1, lines
    assert "ended Compensated" in fails[0], lines
    assert any(line.startswith("smoke: look at the host's log") for line in lines)
    assert any(f"python -m cli show {result.order_id}" in line for line in lines)


def test_the_command_needs_a_running_stack_or_says_so(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "deploy.smoke", "--local", "--runs", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert f"smoke: no local stack is running under {tmp_path} (make up)" in done.stderr


def test_skipping_is_said_out_loud():
    done = subprocess.run(
        [sys.executable, "-m", "deploy.smoke", "--azure"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "SMOKE_TEST": "skip"},
    )
    assert done.returncode == 0
    assert "skipped (SMOKE_TEST=skip)" in done.stdout


async def test_a_refused_send_is_retried_and_said_while_roles_propagate():
    from azure.servicebus.exceptions import ServiceBusAuthorizationError

    said: list[str] = []
    tries = []

    async def send():
        tries.append(1)
        if len(tries) < 3:
            raise ServiceBusAuthorizationError(
                message="Unauthorized access. 'Send' claim(s) are required"
            )
        return "sent"

    waiter = _Waiter(said.append, propagation=60, pause=0.01)
    assert (
        await waiter.until_allowed("sending to orders-smoke", "Sender on orders-smoke", send)
        == "sent"
    )
    assert len(tries) == 3
    assert len(said) == 2
    assert all(
        line.startswith("waiting for the role assignment Sender on orders-smoke to propagate")
        for line in said
    )


async def test_a_send_refused_past_the_propagation_time_fails_naming_it():
    from azure.servicebus.exceptions import ServiceBusAuthorizationError

    async def send():
        raise ServiceBusAuthorizationError(
            message="Unauthorized access. 'Send' claim(s) are required"
        )

    waiter = _Waiter(lambda line: None, propagation=0.05, pause=0.01)
    with pytest.raises(_Refused, match="sending to orders-smoke still refused after"):
        await waiter.until_allowed("sending to orders-smoke", "Sender on orders-smoke", send)
