"""How agents.worker stops: a request in flight at SIGTERM is finished and
replied to within the grace period, or given back to the queue (abandoned)
when the grace period runs out; either way the process exits 0."""

from __future__ import annotations

import asyncio

import pytest
from azure.servicebus.aio import ServiceBusClient

from domain.codec import decode, encode
from domain.models import AgentRequest, ReplyOutcome
from tests.fixtures.servicebus import PROJECT_CONFIG
from tests.integration.agents.test_worker_servicebus import (
    WorkerProcess,
    make_request,
    pending_requests,
    replies_until,
    send,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def private_servicebus(servicebus_emulator):
    emulator = servicebus_emulator.start(PROJECT_CONFIG)
    yield emulator
    emulator.stop()


async def wait_until_called(remote_admin, order_id: str) -> None:
    for _ in range(300):  # bounded: the worker picks the request up within seconds
        if await remote_admin.requests(order_id) >= 1:
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"the worker never called the remote service for {order_id}")


async def test_a_request_in_flight_at_sigterm_is_finished_and_replied_to(
    private_servicebus, remote_service_process, remote_admin
):
    worker = WorkerProcess(private_servicebus.connection_string, remote_service_process.url)
    await remote_admin.fault(kind="latency", service="inventory", order_id="d-1", seconds=1.5)
    async with ServiceBusClient.from_connection_string(
        private_servicebus.connection_string
    ) as client:
        await send(client, encode(make_request("d-1")), "d-1")
        await wait_until_called(remote_admin, "d-1")

        exit_code = worker.stop()
        [(_, reply)] = await replies_until(client, "d-1")
        left = await pending_requests(client)

    assert exit_code == 0, worker.log_tail()
    assert reply.Outcome is ReplyOutcome.OK
    assert left == []  # completed, not given back


async def test_a_request_still_running_when_the_grace_ends_is_abandoned_for_redelivery(
    private_servicebus, remote_service_process, remote_admin
):
    worker = WorkerProcess(
        private_servicebus.connection_string,
        remote_service_process.url,
        AGENT_SHUTDOWN_GRACE_SECONDS="0.2",
    )
    await remote_admin.fault(kind="latency", service="inventory", order_id="d-2", seconds=5)
    async with ServiceBusClient.from_connection_string(
        private_servicebus.connection_string
    ) as client:
        await send(client, encode(make_request("d-2")), "d-2")
        await wait_until_called(remote_admin, "d-2")

        exit_code = worker.stop()
        async with client.get_queue_receiver("agent-requests") as receiver:
            # Abandoned: back at once, not after the lock's minute.
            [message] = await receiver.receive_messages(max_message_count=5, max_wait_time=10)
            await receiver.complete_message(message)

    assert exit_code == 0, worker.log_tail()
    assert decode(AgentRequest, b"".join(message.body)).OrderID == "d-2"
    assert message.delivery_count >= 1
