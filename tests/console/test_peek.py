"""Peeking for the console against the Service Bus emulator: a kept-open
receiver still starts each peek where it is asked to, dead letters are read
with their reason, and nothing is consumed."""

from __future__ import annotations

import json
import uuid

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from console import views
from console.peek import QueuePeeker
from tests.console.conftest import settings


async def test_peeks_repeat_from_the_start_and_consume_nothing(servicebus_emulator):
    queue = f"console-{uuid.uuid4().hex[:8]}"
    emulator = servicebus_emulator.start({queue: {"MaxDeliveryCount": 3, "LockDuration": "PT5S"}})
    async with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages(
                [ServiceBusMessage(json.dumps({"n": i}), message_id=f"m{i}") for i in range(5)]
            )
            await sender.send_messages(
                ServiceBusMessage(
                    json.dumps(
                        {
                            "OrderID": "<b>x</b>",
                            "PaymentReference": "pay-9",
                            "Note": "4111 1111 1111 1111",
                        }
                    ),
                    message_id="bad",
                )
            )
        async with client.get_queue_receiver(queue) as receiver:
            (bad,) = [
                m
                for m in await receiver.receive_messages(max_message_count=6, max_wait_time=5)
                if m.message_id == "bad"
            ] or [None]
            assert bad is not None
            await receiver.dead_letter_message(
                bad, reason="InvalidMessage", error_description="OrderID <b>x</b>"
            )
            for m in await receiver.receive_messages(max_message_count=6, max_wait_time=1):
                await receiver.abandon_message(m)

        peeker = QueuePeeker(client)
        deps = views.Deps(
            settings=settings(), store=None, reads=None, orders=None, servicebus=peeker
        )
        try:
            first = await views.peek(deps, queue, limit=3)
            again = await views.peek(deps, queue, limit=3)
            assert (
                [m["id"] for m in first["messages"]]
                == [m["id"] for m in again["messages"]]
                == ["m0", "m1", "m2"]
            )
            rest = await views.peek(deps, queue, limit=3, from_sequence=first["next"])
            assert [m["id"] for m in rest["messages"]] == ["m3", "m4"]
            assert rest["next"] is None

            dead = await views.peek(deps, queue, dead_letter=True)
            (message,) = dead["messages"]
            assert (message["id"], message["reason"], message["description"]) == (
                "bad",
                "InvalidMessage",
                "OrderID <b>x</b>",
            )
            assert "pay-9" not in message["body"]
            assert "PaymentReference" not in message["body"]
            assert "4111" not in message["body"]
            assert "[redacted]" in message["body"]
            # peeking consumed nothing, and the open peek links hold nothing:
            # all five are there for another receiver
            async with client.get_queue_receiver(queue) as receiver:
                left = []
                for _ in range(5):
                    left += await receiver.receive_messages(max_message_count=10, max_wait_time=2)
                    if len(left) >= 5:
                        break
                assert sorted(m.message_id for m in left) == ["m0", "m1", "m2", "m3", "m4"]
        finally:
            await peeker.close()
