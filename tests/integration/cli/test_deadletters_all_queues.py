"""`python -m cli deadletters` without a queue, against the Service Bus
emulator: every queue's dead letters (ingress, agent queues, alerts, reply
queues), counted per queue, at 80 columns with nothing cut."""

from __future__ import annotations

import asyncio
import io
import sys

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from rich.console import Console

import cli.__main__ as tool

pytestmark = pytest.mark.integration

QUEUES = ["orders-webshop", "agent-requests", "agent-responses", "alerts", "replies-webshop"]
REASON = (
    "the message could not be processed after 10 deliveries: the state store answered "
    "503 ServiceUnavailable each time; nothing was changed"
)


async def _dead_letter(connection: str, queue: str, message_id: str) -> None:
    async with ServiceBusClient.from_connection_string(connection) as client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages(
                ServiceBusMessage(b'{"OrderID": "O-1"}', message_id=message_id)
            )
        async with client.get_queue_receiver(queue) as receiver:
            (m,) = await receiver.receive_messages(max_message_count=1, max_wait_time=5)
            await receiver.dead_letter_message(
                m, reason="ProcessingFailed", error_description=REASON
            )


def test_deadletters_without_a_queue_covers_every_queue(servicebus_emulator, monkeypatch, tmp_path):
    spec = {"MaxDeliveryCount": 3, "LockDuration": "PT5S"}
    emulator = servicebus_emulator.start({q: spec for q in QUEUES})
    asyncio.run(_dead_letter(emulator.connection_string, "orders-webshop", "submit/O-1"))
    asyncio.run(_dead_letter(emulator.connection_string, "agent-responses", "reply-1"))
    for name, value in {
        "LOCAL_SETTINGS": str(tmp_path / "absent.json"),
        "CosmosDbConnection": "AccountEndpoint=https://127.0.0.1:1/;AccountKey=a2V5",
        "ServiceBusConnection": emulator.connection_string,
        "REPLY_QUEUE_REGISTRY": '{"webshop": "replies-webshop"}',
        "ORDER_INGRESS_QUEUES": '{"webshop": "orders-webshop"}',
    }.items():
        monkeypatch.setenv(name, value)
    out = io.StringIO()
    monkeypatch.setattr(tool, "console", Console(file=out, width=80))
    monkeypatch.setattr(sys, "argv", ["cli", "deadletters"])
    try:
        code = tool.main()
    except SystemExit as done:
        code = done.code
    text = out.getvalue()
    assert code == 0, text
    assert "2 dead letters on 5 queues" in text
    counts = {
        line.split()[0]: line.split()[1]
        for line in text.splitlines()
        if line.startswith("  ") and len(line.split()) == 2 and line.split()[0] in QUEUES
    }
    assert counts == {
        "orders-webshop": "1",
        "agent-requests": "0",
        "agent-responses": "1",
        "alerts": "0",
        "replies-webshop": "0",
    }
    assert "submit/O-1" in text
    assert "reply-1" in text
    assert "".join(REASON.split()) in "".join(text.split())
    assert all(len(line) <= 80 for line in text.splitlines())
