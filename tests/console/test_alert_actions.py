"""Acknowledging and closing alerts (issue 45), through the console's routes
against the Service Bus emulator: acknowledge replaces an alert by a copy
naming the operator, the reason and when; close removes it; each is a
confirmation page and a POST with a form token, acts once, and needs a
reason."""

from __future__ import annotations

import html
import json
import uuid
from dataclasses import replace
from urllib.parse import urlencode

from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from console import views
from console.peek import QueuePeeker
from tests.console.conftest import settings
from tests.console.test_hostile_input import HOST, _call, _request
from tests.console.test_hostile_input import local as local_mode

local = local_mode  # the fixture: local mode over the real stores


async def _page(name: str, path: str, route: dict | None = None, params: dict | None = None):
    response = await _call(name, _request("GET", path, params, route))
    return response.status_code, html.unescape(response.get_body().decode())


async def _act(sequence: int, action: str, reason: str | None):
    route = {"sequence": str(sequence), "action": action}
    status, page = await _page("console_alert_action", f"/alerts/{sequence}/{action}", route)
    assert status == 200, page
    token = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    form = {"csrf": token, **({"reason": reason} if reason is not None else {})}
    return await _call(
        "console_alert_action",
        _request(
            "POST",
            f"/alerts/{sequence}/{action}",
            route=route,
            headers={"Origin": HOST, "Sec-Fetch-Site": "same-origin"},
            body=urlencode(form).encode(),
        ),
    )


async def test_acknowledge_then_close_an_alert(servicebus_emulator, local):
    spec = {"MaxDeliveryCount": 3, "LockDuration": "PT5S"}
    queue = f"orders-al-{uuid.uuid4().hex[:6]}"
    emulator = servicebus_emulator.start({queue: spec, **{q: spec for q in views.WORK_QUEUES}})
    async with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        async with client.get_queue_sender("alerts") as sender:
            await sender.send_messages(
                [
                    ServiceBusMessage(
                        json.dumps(
                            {"Kind": "CompensationFailed", "OrderID": f"A-{i}", "Reason": "r"}
                        ),
                        message_id=f"alert-{i}",
                    )
                    for i in range(2)
                ]
            )
        local.servicebus = QueuePeeker(client)
        local.settings = replace(settings(), ingress_queues={"webshop": queue})
        try:
            status, page = await _page("console_alerts", "/alerts")
            assert status == 200, page
            first, second = (m["sequence"] for m in (await views.alerts(local, None))["messages"])
            assert f"/alerts/{first}/acknowledge" in page

            refused = await _act(first, "acknowledge", None)  # no reason: nothing done
            assert refused.status_code == 400, refused.get_body().decode()
            done = await _act(first, "acknowledge", "refund by hand today")
            assert done.status_code == 303, done.get_body().decode()
            assert done.headers["Location"] == f"/api/console/alerts?done=acknowledge&seq={first}"
            shown = (await views.alerts(local, None))["messages"]
            assert first not in [m["sequence"] for m in shown]  # the copy replaced it
            (copy,) = [m for m in shown if m["properties"].get("AcknowledgedBy")]
            assert copy["properties"]["AcknowledgedBy"] == "operator:local"
            assert copy["properties"]["AcknowledgedReason"] == "refund by hand today"
            assert copy["parsed"]["OrderID"] == "A-0"  # the same alert
            status, page = await _page("console_alerts", "/alerts", params={"done": "acknowledge"})
            assert 'acknowledged">acknowledged</span> by local: refund by hand today' in page
            assert f"/alerts/{copy['sequence']}/acknowledge" not in page  # already

            closed = await _act(second, "close", "resolved with the provider")
            assert closed.status_code == 303, closed.get_body().decode()
            left = [m["parsed"]["OrderID"] for m in (await views.alerts(local, None))["messages"]]
            assert left == ["A-0"]
            # acting again on a settled alert: it is gone
            status, _ = await _page(
                "console_alert_action",
                f"/alerts/{second}/close",
                {"sequence": str(second), "action": "close"},
            )
            assert status == 404
        finally:
            await local.servicebus.close()
