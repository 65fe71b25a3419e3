"""triggers.agents as registered, run by devstack.host (our stand-in for the
Functions host) against the Service Bus emulator and the remote service:
request in, reply out, settled by hand; a malformed request dead-lettered as
InvalidMessage."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from agents.agent import reply_event_id
from domain.codec import encode
from domain.ids import agent_request_message_id
from domain.models import ReplyOutcome
from tests.builders import KEY_SETTINGS
from tests.fixtures.servicebus import PROJECT_CONFIG
from tests.integration.agents.test_worker_servicebus import (
    make_request,
    pending_requests,
    replies_until,
    send,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
APP_DIR = Path(__file__).resolve().parent / "agent_app"
READY = re.compile(r"devstack\.host ready:")
STARTUP_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def private_servicebus(servicebus_emulator):
    emulator = servicebus_emulator.start(PROJECT_CONFIG)
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def agent_host(private_servicebus, remote_service_process, tmp_path_factory) -> Iterator[Path]:
    """`python -m devstack.host` on the agents-only app; yields its log path."""
    base = tmp_path_factory.mktemp("agent-host")
    log_path = base / "host.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "ServiceBusConnection": private_servicebus.connection_string,
        "REMOTE_SERVICE_URL": remote_service_process.url,
        "AGENT_RETRY_INITIAL_SECONDS": "0.02",
        "AGENT_RETRY_MAX_SECONDS": "0.1",
        "AGENT_REPLY_MARGIN_SECONDS": "0.2",
        **KEY_SETTINGS,
    }
    command = [
        sys.executable, "-m", "devstack.host",
        "--app", "function_app:app", "--app-dir", str(APP_DIR),
        "--data-dir", str(base / "data"), "--clock", "real",
    ]  # fmt: skip
    with open(log_path, "a", encoding="utf-8") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
    assert process.stdout is not None
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    ready = False
    while not ready and time.monotonic() < deadline and process.poll() is None:
        if select.select([process.stdout], [], [], 0.2)[0]:
            ready = bool(READY.search(process.stdout.readline()))
    if not ready:
        process.kill()
        process.wait(10)
        pytest.fail(f"devstack.host did not start:\n{log_path.read_text()[-3000:]}")
    yield log_path
    process.send_signal(signal.SIGINT)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    process.stdout.close()


async def test_the_trigger_replies_and_completes_the_request(
    agent_host, private_servicebus, remote_admin
):
    request = make_request("fn-1", step="arrange-shipment")
    async with ServiceBusClient.from_connection_string(
        private_servicebus.connection_string
    ) as client:
        await send(
            client, encode(request), agent_request_message_id(request.InstanceId, request.Step)
        )
        [(message_id, reply)] = await replies_until(client, "fn-1")
        left = await pending_requests(client)

    assert reply.Outcome is ReplyOutcome.OK, agent_host.read_text()[-3000:]
    assert message_id == reply_event_id(request)
    assert left == []  # completed by the function (autoComplete is off)
    assert await remote_admin.effect_count("fn-1", "arrange-shipment", "shipping/arrange") == 1


async def test_the_trigger_dead_letters_a_malformed_request(
    agent_host, private_servicebus, remote_admin
):
    async with ServiceBusClient.from_connection_string(
        private_servicebus.connection_string
    ) as client:
        await send(client, b"not an agent request", "fn-malformed")
        async with client.get_queue_receiver(
            "agent-requests", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as dead_letters:
            received = await dead_letters.receive_messages(max_message_count=5, max_wait_time=20)
            for message in received:
                await dead_letters.complete_message(message)

    assert [m.message_id for m in received] == ["fn-malformed"], agent_host.read_text()[-3000:]
    assert received[0].dead_letter_reason == "InvalidMessage"
    assert received[0].delivery_count <= 1  # at once, not after MaxDeliveryCount tries
