"""agents.worker end to end: a real worker process between the Service Bus
emulator and the remote service process. Request in, reply out; a request
delivered twice applies one side effect and yields one reply; a malformed
request is dead-lettered. (Stopping: test_worker_shutdown.py.)"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from agents.agent import reply_event_id
from agents.worker import READY_LINE
from domain.codec import decode, encode
from domain.ids import (
    agent_request_message_id,
    attempt_instance_id,
    idempotency_key,
    reply_event_name,
)
from domain.models import AgentReply, AgentRequest, ReplyOutcome
from tests.builders import KEY_SETTINGS, sealed
from tests.fixtures.servicebus import PROJECT_CONFIG

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
READY_TIMEOUT_S = 60


class WorkerProcess:
    def __init__(self, connection_string: str, remote_url: str, **settings: str) -> None:
        fd, name = tempfile.mkstemp(prefix="agent-worker-", suffix=".log")
        self.log_path = Path(name)
        self._log = os.fdopen(fd, "w")
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "ServiceBusConnection": connection_string,
            "REMOTE_SERVICE_URL": remote_url,
            "AGENT_RETRY_INITIAL_SECONDS": "0.02",
            "AGENT_RETRY_MAX_SECONDS": "0.1",
            "AGENT_REPLY_MARGIN_SECONDS": "0.2",
            # One at a time, so replies come out in request order.
            "AGENT_MAX_CONCURRENCY": "1",
            "AGENT_SHUTDOWN_GRACE_SECONDS": "5",
            **KEY_SETTINGS,  # the agent keys (and the token keys, which a worker ignores)
            **settings,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agents.worker"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        line = ""
        while time.monotonic() < deadline and self.process.poll() is None:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.2)
            if ready:
                line = self.process.stdout.readline()
                break
        if line.strip() != READY_LINE:
            self.process.kill()
            self.process.wait(10)
            pytest.fail(f"agent worker did not start ({line!r}):\n{self.log_tail()}")

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        return self.process.returncode

    def log_tail(self) -> str:
        return self.log_path.read_text()[-3000:]


@pytest.fixture(scope="module")
def private_servicebus(servicebus_emulator):
    """An emulator of our own with the project's queues, so no other test's
    messages reach this worker (and none of ours reach theirs)."""
    emulator = servicebus_emulator.start(PROJECT_CONFIG)
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def worker(private_servicebus, remote_service_process) -> Iterator[WorkerProcess]:
    process = WorkerProcess(private_servicebus.connection_string, remote_service_process.url)
    yield process
    process.stop()


def make_request(order_id: str, step: str = "reserve-inventory", attempt: int = 1) -> AgentRequest:
    """A request as the Scheduler sends it: sealed with the test keys."""
    return sealed(
        AgentRequest(
            InstanceId=attempt_instance_id(order_id, attempt),
            OrderID=order_id,
            Step=step,
            Attempt=attempt,
            IdempotencyKey=idempotency_key(order_id, step),
            FencingToken=attempt,
            Deadline=datetime.now(UTC) + timedelta(seconds=20),
            ReplyEvent=reply_event_name(step, attempt),
            Payload={"Lines": 1},
            AppId="webshop",
        )
    )


async def send(client: ServiceBusClient, body: bytes, message_id: str) -> None:
    async with client.get_queue_sender("agent-requests") as sender:
        await sender.send_messages(ServiceBusMessage(body, message_id=message_id))


async def replies_until(client: ServiceBusClient, last_order: str) -> list[tuple[str, AgentReply]]:
    """Receive replies (completing them) until one for `last_order` arrives."""
    received: list[tuple[str, AgentReply]] = []
    deadline = time.monotonic() + 60
    async with client.get_queue_receiver("agent-responses") as receiver:
        while time.monotonic() < deadline:
            for message in await receiver.receive_messages(max_message_count=10, max_wait_time=2):
                reply = decode(AgentReply, b"".join(message.body))
                await receiver.complete_message(message)
                received.append((message.message_id, reply))
                if reply.OrderID == last_order:
                    return received
    pytest.fail(f"no reply for {last_order}; got {[r.OrderID for _, r in received]}")


async def pending_requests(client: ServiceBusClient, within: float = 10) -> list:
    """The messages still in agent-requests, locked or not (peek ignores
    locks), after giving the worker up to `within` seconds to settle."""
    deadline = time.monotonic() + within
    async with client.get_queue_receiver("agent-requests") as receiver:
        while True:
            # From the first sequence number every time: by default the SDK
            # peeks on from the last message it has seen.
            left = await receiver.peek_messages(max_message_count=10, sequence_number=1)
            if not left or time.monotonic() > deadline:
                return left
            await asyncio.sleep(0.2)


async def test_a_request_in_gives_a_reply_out_with_its_stable_id(
    worker, private_servicebus, remote_admin
):
    request = make_request("w-1")
    async with ServiceBusClient.from_connection_string(
        private_servicebus.connection_string
    ) as client:
        await send(
            client, encode(request), agent_request_message_id(request.InstanceId, request.Step)
        )
        replies = await replies_until(client, "w-1")
        left = await pending_requests(client)

    [(message_id, reply)] = replies
    assert reply.Outcome is ReplyOutcome.OK, worker.log_tail()
    assert left == []  # completed
    assert message_id == reply.EventId == reply_event_id(request)
    assert reply.EventName == request.ReplyEvent
    assert await remote_admin.effect_count("w-1", "reserve-inventory", "inventory/reserve") == 1


async def test_a_request_delivered_twice_makes_one_side_effect_and_one_reply(
    worker, private_servicebus, remote_admin
):
    request = make_request("w-2", step="charge-payment")
    marker = make_request("w-2-marker")
    async with ServiceBusClient.from_connection_string(
        private_servicebus.connection_string
    ) as client:
        # Two deliveries of one request: different message ids so the request
        # queue's duplicate detection lets both through (as after a redelivery).
        await send(client, encode(request), "first-delivery")
        await send(client, encode(request), "second-delivery")
        await send(client, encode(marker), "marker")
        replies = await replies_until(client, "w-2-marker")

    for_request = [reply for _, reply in replies if reply.OrderID == "w-2"]
    assert await remote_admin.requests("w-2") == 2  # both deliveries were handled
    assert await remote_admin.effect_count("w-2", "charge-payment", "payment/charge") == 1
    assert len(for_request) == 1  # the second reply had the same id: dropped as a duplicate
    assert for_request[0].Outcome is ReplyOutcome.OK


async def test_a_malformed_request_is_dead_lettered_as_invalid(
    worker, private_servicebus, remote_admin
):
    marker = make_request("w-3-marker")
    async with ServiceBusClient.from_connection_string(
        private_servicebus.connection_string
    ) as client:
        await send(client, b'{"OrderID": "w-3", "Step": 7}', "malformed")
        await send(client, encode(marker), "marker-3")
        await replies_until(client, "w-3-marker")
        async with client.get_queue_receiver(
            "agent-requests", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as dead_letters:
            [dead] = await dead_letters.receive_messages(max_message_count=5, max_wait_time=5)
            await dead_letters.complete_message(dead)

    assert dead.message_id == "malformed"
    assert dead.dead_letter_reason == "InvalidMessage"
    assert "AgentRequest" in dead.dead_letter_error_description
    assert await remote_admin.requests("w-3") == 0


async def test_a_forged_request_is_dead_lettered_and_calls_nothing(
    worker, private_servicebus, remote_admin
):
    """Unsigned, and signed then changed (FencingToken 999): the worker calls
    nothing and dead-letters both ForgedRequest (ADR 017e)."""
    unsigned = make_request("w-4").model_copy(update={"Signature": None})
    fenced = make_request("w-5", step="charge-payment").model_copy(update={"FencingToken": 999})
    marker = make_request("w-4-marker")
    async with ServiceBusClient.from_connection_string(
        private_servicebus.connection_string
    ) as client:
        await send(client, encode(unsigned), "forged-unsigned")
        await send(client, encode(fenced), "forged-fence")
        await send(client, encode(marker), "marker-4")
        replies = await replies_until(client, "w-4-marker")
        async with client.get_queue_receiver(
            "agent-requests", sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as dead_letters:
            dead = await dead_letters.receive_messages(max_message_count=5, max_wait_time=5)
            for message in dead:
                await dead_letters.complete_message(message)

    assert {(d.message_id, d.dead_letter_reason) for d in dead} == {
        ("forged-unsigned", "ForgedRequest"),
        ("forged-fence", "ForgedRequest"),
    }
    assert [r.OrderID for _, r in replies] == ["w-4-marker"]
    assert await remote_admin.requests("w-4") == 0
    assert await remote_admin.requests("w-5") == 0


def test_the_worker_refuses_to_start_without_its_keys(private_servicebus, remote_service_process):
    env = {
        k: v for k, v in os.environ.items() if k not in ("AGENT_SIGNING_KEYS", "REPLY_TOKEN_KEYS")
    }
    done = subprocess.run(
        [sys.executable, "-m", "agents.worker"],
        cwd=ROOT,
        env={
            **env,
            "ServiceBusConnection": private_servicebus.connection_string,
            "REMOTE_SERVICE_URL": remote_service_process.url,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "set AGENT_SIGNING_KEYS" in done.stderr
