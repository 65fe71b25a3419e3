"""Dead letters to act on, against the Service Bus emulator: counts per
queue, the link to the order and to the dead letter's alert, resend (a copy
to the queue, marked with who resent it) and discard, each acting once."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from console import views
from console.peek import QueuePeeker
from domain import state_machine as sm
from tests.console.conftest import STEPS, order, settings


async def test_counts_links_resend_and_discard(servicebus_emulator):
    queue = f"orders-dl-{uuid.uuid4().hex[:6]}"
    spec = {"MaxDeliveryCount": 3, "LockDuration": "PT5S"}
    emulator = servicebus_emulator.start({queue: spec, **{q: spec for q in views.WORK_QUEUES}})
    async with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages(
                [
                    ServiceBusMessage(
                        json.dumps({"OrderID": f"O-{i}"}),
                        message_id=f"submit/O-{i}",
                        application_properties={"x-retry-count": 3},
                    )
                    for i in range(3)
                ]
            )
        reasons = {
            "submit/O-0": "RetriesExhausted",
            "submit/O-1": "InvalidMessage",
            "submit/O-2": "InvalidMessage",
        }
        async with client.get_queue_receiver(queue) as receiver:
            got = []
            while len(got) < 3:
                got += await receiver.receive_messages(max_message_count=3, max_wait_time=3)
            for m in got:
                await receiver.dead_letter_message(
                    m, reason=reasons[m.message_id], error_description="x"
                )
        async with client.get_queue_sender("alerts") as sender:
            await sender.send_messages(
                ServiceBusMessage(
                    json.dumps(
                        {
                            "Kind": "RetriesExhausted",
                            "OrderID": "O-0",
                            "Reason": "x",
                            "MessageId": "submit/O-0",
                            "Queue": queue,
                        }
                    )
                )
            )
        peeker = QueuePeeker(client)
        cfg = replace(settings(), ingress_queues={"webshop": queue})
        deps = views.Deps(
            settings=cfg, store=None, reads=None, orders=None, servicebus=peeker, azure=True
        )
        try:
            summary = await views.dead_letters(deps, None, None)
            assert summary["counts"][queue] == {"count": 3, "more": False, "error": None}
            assert summary["total"] == 3
            assert "agent-requests" in summary["empty"]  # empty queues collapsed
            shown = {m["id"]: m for m in summary["per_queue"][queue]["messages"]}
            # a bare OrderID on webshop's ingress queue is webshop's order
            assert shown["submit/O-0"]["order_id"] == "webshop:O-0"
            assert shown["submit/O-0"]["alert"] is not None
            assert shown["submit/O-0"]["can_resend"]
            assert not shown["submit/O-1"]["can_resend"]  # InvalidMessage: discard only

            with pytest.raises(views.BadRequest):
                await views.act_on_dead_letter(
                    deps, queue, shown["submit/O-1"]["sequence"], "resend", "ada", "provider fixed"
                )
            await views.act_on_dead_letter(
                deps, queue, shown["submit/O-0"]["sequence"], "resend", "ada", "provider fixed"
            )
            await views.act_on_dead_letter(
                deps, queue, shown["submit/O-1"]["sequence"], "discard", "ada", "duplicate"
            )
            # acting again on a settled dead letter: it is gone
            with pytest.raises(views.NotFound):
                await views.act_on_dead_letter(
                    deps, queue, shown["submit/O-1"]["sequence"], "discard", "ada", "duplicate"
                )
            after = await views.dead_letters(deps, queue, None)
            assert [m["id"] for m in after["peeked"]["messages"]] == ["submit/O-2"]
            assert after["counts"][queue]["count"] == 1
        finally:
            await peeker.close()
        async with client.get_queue_receiver(queue) as receiver:
            (resent,) = await receiver.receive_messages(max_message_count=5, max_wait_time=5)
            props = {
                (k.decode() if isinstance(k, bytes) else k): v
                for k, v in resent.application_properties.items()
            }
            assert json.loads(b"".join(resent.body)) == {"OrderID": "O-0"}
            assert props["ResentBy"] in ("operator:ada", b"operator:ada")
            assert "x-retry-count" not in props  # a fresh budget
            assert resent.message_id.startswith("submit/O-0/resent-")
            await receiver.complete_message(resent)


def test_the_order_a_message_links_to_is_its_applications():
    apps = views.queue_apps(
        replace(
            settings(),
            ingress_queues={"webshop": "orders-webshop", "pos": "orders-pos"},
            reply_queues={"webshop": "replies-webshop", "pos": "shared", "kiosk": "shared"},
        )
    )
    link = views._order_of
    assert link({"OrderID": "A-1"}, {}, "orders-webshop", apps) == "webshop:A-1"
    assert link({"OrderID": "A-1"}, {}, "replies-webshop", apps) == "webshop:A-1"
    assert link({}, {"OrderID": "A-1"}, "orders-pos", apps) == "pos:A-1"
    # a key is taken as it is, wherever it is
    assert link({"OrderID": "pos:A-1"}, {}, "agent-requests", apps) == "pos:A-1"
    # a bare OrderID on a queue of no one application: a record from before keys
    assert link({"OrderID": "A-1"}, {}, "agent-requests", apps) == "A-1"
    assert link({"OrderID": "A-1"}, {}, "shared", apps) == "A-1"
    # an alert names the queue of its dead letter; nothing else's body does
    alert = {"OrderID": "A-1", "Queue": "orders-pos"}
    assert link(alert, {}, "alerts", apps) == "pos:A-1"
    assert link(alert, {}, "orders-webshop", apps) == "webshop:A-1"
    assert link({"OrderID": "a/b"}, {}, "orders-webshop", apps) is None
    assert link({"OrderID": 7}, {"OrderID": "A-2"}, "orders-webshop", apps) == "webshop:A-2"


async def test_only_stored_orders_are_linked(servicebus_emulator, deps, now):
    """Issue 45: a dead letter or alert naming an order Submit refused (never
    stored) linked to a 404; now only a stored order is linked, and the
    refused one is shown as never stored, on the page and in its alert."""
    queue = f"orders-st-{uuid.uuid4().hex[:6]}"
    spec = {"MaxDeliveryCount": 3, "LockDuration": "PT5S"}
    emulator = servicebus_emulator.start({queue: spec, **{q: spec for q in views.WORK_QUEUES}})
    await deps.store.create_if_absent(
        sm.new_record(order("STORED-1"), now, STEPS, key="webshop:STORED-1")
    )
    async with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages(
                [
                    ServiceBusMessage(json.dumps({"OrderID": oid}), message_id=f"submit/{oid}")
                    for oid in ("STORED-1", "REFUSED-1")
                ]
            )
        async with client.get_queue_receiver(queue) as receiver:
            got: list = []
            while len(got) < 2:
                got += await receiver.receive_messages(max_message_count=2, max_wait_time=3)
            for m in got:
                await receiver.dead_letter_message(m, reason="InvalidMessage")
        async with client.get_queue_sender("alerts") as sender:
            await sender.send_messages(
                ServiceBusMessage(
                    json.dumps({"Kind": "InvalidMessage", "OrderID": "REFUSED-1", "Queue": queue})
                )
            )
        deps.servicebus = QueuePeeker(client)
        deps.settings = replace(settings(), ingress_queues={"webshop": queue})
        try:
            page = await views.dead_letters(deps, queue, None)
            shown = {m["id"]: m for m in page["peeked"]["messages"]}
            assert shown["submit/STORED-1"]["order_id"] == "webshop:STORED-1"
            assert shown["submit/REFUSED-1"]["order_id"] is None
            assert shown["submit/REFUSED-1"]["unstored_order"] == "webshop:REFUSED-1"
            summary = await views.dead_letters(deps, None, None)
            linked = [m["order_id"] for m in summary["per_queue"][queue]["messages"]]
            assert set(linked) == {"webshop:STORED-1", None}
            alerts = await views.alerts(deps, None)
            (alert,) = [m for m in alerts["messages"] if (m["parsed"] or {}).get("OrderID")]
            assert alert["order_id"] is None
            assert alert["unstored_order"] == "webshop:REFUSED-1"
        finally:
            await deps.servicebus.close()
