"""The smoke test (deploy/smoke.py) against the local stack, started as
tests/e2e/conftest.py starts it, so the script `azd deploy` runs afterwards
cannot rot: it counts the host's functions against the app's own list, sends
one order as the client, and sees it Processed on the client's reply queue;
and it fails, saying so, when a function is missing or the order does not
come back Processed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.smoke import local_target, run
from devstack.stack import Stack
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


async def test_the_smoke_test_sees_an_order_processed_on_the_local_stack(stack):
    lines: list[str] = []
    result = await run(_target(stack), timeout=120, out=lines.append)
    print("\n".join(lines))
    assert result.ok, "\n".join(lines)
    ingress = json.loads(stack.settings["ORDER_INGRESS_QUEUES"])
    assert lines[0].endswith("functions indexed"), lines[0]
    indexed, _, expected = lines[0].split(": ")[-1].split()[:3]
    assert indexed == expected
    assert int(expected) >= 20 + len(ingress)
    assert result.order_id.startswith("SMOKE-")
    assert (
        lines[-1]
        == f"smoke: ok: {result.order_id} Processed {result.seconds:.1f} s after it was sent"
    )
    # The statuses were peeked, not consumed: the client still gets them.
    from azure.servicebus.aio import ServiceBusClient

    async with (
        ServiceBusClient.from_connection_string(stack.settings["ServiceBusConnection"]) as client,
        client.get_queue_receiver("replies-webshop") as receiver,
    ):
        peeked = await receiver.peek_messages(max_message_count=200)
    assert any(result.order_id.encode() in b"".join(m.body) for m in peeked)


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
    """The remote service declines every payment: the order compensates, and
    the smoke test says so and where to look."""
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
            result = await run(_target(stack), timeout=120, out=lines.append)
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
