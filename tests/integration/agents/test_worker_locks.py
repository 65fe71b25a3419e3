"""agents.worker keeps a message's lock renewed while it handles it: with a
lock shorter than the remote call, the request is still handled once and
completed, not redelivered to a second handler halfway through."""

from __future__ import annotations

import pytest
from azure.servicebus.aio import ServiceBusClient

from domain.codec import encode
from domain.models import ReplyOutcome
from tests.integration.agents.test_worker_servicebus import (
    WorkerProcess,
    make_request,
    pending_requests,
    replies_until,
    send,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOCK_SECONDS = 5
QUEUE = {
    "LockDuration": f"PT{LOCK_SECONDS}S",
    "MaxDeliveryCount": 5,
    "RequiresDuplicateDetection": True,
    "DuplicateDetectionHistoryTimeWindow": "PT10M",
    "DefaultMessageTimeToLive": "PT1H",
}


@pytest.fixture(scope="module")
def short_lock_servicebus(servicebus_emulator):
    emulator = servicebus_emulator.start({"agent-requests": QUEUE, "agent-responses": QUEUE})
    yield emulator
    emulator.stop()


async def test_a_call_longer_than_the_lock_is_handled_once_and_completed(
    short_lock_servicebus, remote_service_process, remote_admin
):
    # Room for a second handler: without renewal the expired message would
    # be received again while the first call is still running.
    worker = WorkerProcess(
        short_lock_servicebus.connection_string,
        remote_service_process.url,
        AGENT_MAX_CONCURRENCY="2",
    )
    try:
        await remote_admin.fault(
            kind="latency", service="inventory", order_id="l-1", seconds=LOCK_SECONDS + 2
        )
        async with ServiceBusClient.from_connection_string(
            short_lock_servicebus.connection_string
        ) as client:
            await send(client, encode(make_request("l-1")), "l-1")
            [(_, reply)] = await replies_until(client, "l-1")
            left = await pending_requests(client)
    finally:
        exit_code = worker.stop()

    assert reply.Outcome is ReplyOutcome.OK, worker.log_tail()
    assert await remote_admin.requests("l-1") == 1
    assert left == []
    assert exit_code == 0
