"""A flood of forged replies through the reply bridge's gate and the
product's Alerts, on the Service Bus emulator (issue 43, "Alerts that stay
readable"): 1,000 forgeries give a handful of alert messages whose counts
sum to 1,000, an alert of another kind in the middle of them is a message
of its own, and the logs hold a bounded number of WARNING/ERROR lines."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode

from adapters.servicebus import ServiceBusPublisher
from adapters.settlement import BackoffPolicy, MessageGate
from domain.ids import reply_event_name
from orchestrators.reply_bridge import on_reply_message
from reporting import Alerts
from tests.builders import KEYS
from tests.integration.app_env import Bus, RecordingActions

pytestmark = pytest.mark.timeout(600)

QUEUE = "agent-responses"
FORGERIES = 1000


def _forged_reply(n: int) -> bytes:
    """A well-formed reply to a plausible request, with no proof (no token,
    no signature): what anyone with Sender on the queue can write."""
    order_id = f"webshop:FLOOD-{n}"
    event = reply_event_name("charge-payment", 1)
    return json.dumps(
        {
            "SchemaVersion": 1,
            "InstanceId": f"{order_id}:1",
            "OrderID": order_id,
            "Step": "charge-payment",
            "Action": "do",
            "Attempt": 1,
            "AppId": "webshop",
            "ReplyToken": None,
            "Signature": None,
            "EventName": event,
            "EventId": f"{order_id}:1/{event}/reply",
            "Outcome": "ok",
            "Result": {"Reference": "forged"},
            "Error": None,
        }
    ).encode()


async def _settle(receiver, message, actions: RecordingActions) -> None:
    call = actions.calls[-1]
    if call[0] == "complete":
        await receiver.complete_message(message)
    elif call[0] == "deadletter":
        await receiver.dead_letter_message(message, reason=call[1], error_description=call[2])
    else:
        await receiver.abandon_message(message)


async def test_a_thousand_forgeries_give_a_handful_of_alerts_and_another_kind_its_own(
    servicebus_emulator, caplog
):
    bus = Bus(servicebus_emulator.connection_string)
    publisher = ServiceBusPublisher(bus.client)
    try:
        await bus.drain("alerts", wait=0.5)
        await bus.drain(QUEUE, wait=0.5)
        await bus.drain(f"{QUEUE}/$deadletterqueue", wait=0.5)
        run = uuid.uuid4().hex[:8]
        async with bus.client.get_queue_sender(QUEUE) as sender:
            for start in range(0, FORGERIES, 100):
                await sender.send_messages(
                    [
                        ServiceBusMessage(_forged_reply(n), message_id=f"forged/{run}/{n}")
                        for n in range(start, start + 100)
                    ]
                )
        # The process's one Alerts and the reply bridge's gate, as the root builds them.
        alerts = Alerts(publisher)
        gate = MessageGate(QUEUE, alerts, publisher, BackoffPolicy())
        handled = 0
        with caplog.at_level(logging.INFO):
            async with bus.client.get_queue_receiver(
                QUEUE, receive_mode=ServiceBusReceiveMode.PEEK_LOCK
            ) as receiver:
                while handled < FORGERIES:
                    batch = await receiver.receive_messages(max_message_count=50, max_wait_time=5)
                    assert batch, f"only {handled} of {FORGERIES} forgeries arrived"
                    for message in batch:
                        actions = RecordingActions()
                        await on_reply_message(message, actions, None, gate=gate, keys=KEYS)
                        assert actions.calls[-1][:2] == ("deadletter", "ForgedReply")
                        await _settle(receiver, message, actions)
                        handled += 1
                        if handled == FORGERIES // 2:
                            # A genuine alert of another kind, amid the flood.
                            await alerts.raise_alert(
                                "OrderError",
                                "payment declined",
                                datetime.now(UTC),
                                "webshop:REAL-1",
                            )
            await alerts.close()  # the process stops: its open window's aggregate goes

        sent = await bus.drain("alerts", wait=1)
        forged = [a for a in sent if a["Kind"] == "ForgedReply"]
        others = [a for a in sent if a["Kind"] != "ForgedReply"]
        print(  # the figures, for the report (pytest -s)
            "alert messages:",
            [(a["Kind"], a.get("Count", 1)) for a in sent],
            "warning/error lines:",
            sum(r.levelno >= logging.WARNING for r in caplog.records),
        )
        assert sum(a.get("Count", 1) for a in forged) == FORGERIES
        assert 2 <= len(forged) <= 6, [(a["_message_id"], a.get("Count", 1)) for a in forged]
        assert [(a["Kind"], a["OrderID"], a.get("Count")) for a in others] == [
            ("OrderError", "webshop:REAL-1", None)
        ]
        aggregates = [a for a in forged if a.get("Count", 1) > 1]
        assert aggregates
        assert all(a["Last"]["MessageId"].startswith(f"forged/{run}/") for a in aggregates)
        dead = await bus.drain(f"{QUEUE}/$deadletterqueue", wait=1)
        assert len(dead) == FORGERIES
        assert {d["_dead_letter_reason"] for d in dead} == {"ForgedReply"}
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(loud) <= 2 * len(forged) + 1, [r.getMessage()[:120] for r in loud[:10]]
    finally:
        await publisher.close()
        await bus.close()
