"""Terminal statuses their reply queue refused, parked in the order's
outbox (issue 43, item 2, the operator's side), against the real Cosmos
server and the Service Bus emulator: listed per reply queue and on the
order's page, and resent on demand with a reason, through the console's
confirm-then-POST route, as the Starter sends them (the entry's own message
id, cleared once the queue takes it; a refusal counted as a try)."""

from __future__ import annotations

import html
import json
import uuid
from datetime import datetime, timedelta
from urllib.parse import urlencode

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from adapters.servicebus import ServiceBusPublisher
from console import views
from console.peek import QueuePeeker
from domain.models import OrderState, StatusKind
from tests.console.conftest import errored_by_supervisor, processed
from tests.console.test_hostile_input import HOST, _call, _request, local  # noqa: F401 - a fixture

SPEC = {"MaxDeliveryCount": 3, "LockDuration": "PT5S"}


def _parked(record: OrderState, reply_to: str, since: datetime, tries: int = 0) -> OrderState:
    """`record` with its terminal status still in the outbox since `since`."""
    assert record.PendingStatus is not None
    pending = record.PendingStatus.model_copy(update={"At": since, "Tries": tries})
    return record.model_copy(update={"ReplyTo": reply_to, "PendingStatus": pending})


@pytest.fixture
async def bus(servicebus_emulator, local):  # noqa: F811 - the fixture imported above
    """A reply queue that takes sends (and `alerts`); `gone` is never created,
    so every send to it is refused. `local`'s deps send and peek on them."""
    ok, gone = f"replies-ok-{uuid.uuid4().hex[:6]}", f"replies-gone-{uuid.uuid4().hex[:6]}"
    emulator = servicebus_emulator.start({ok: SPEC, "alerts": SPEC})
    async with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        local.publisher = ServiceBusPublisher(client, send_timeout=10)
        local.servicebus = QueuePeeker(client)
        try:
            yield client, ok, gone
        finally:
            await local.publisher.close()
            await local.servicebus.close()


async def test_parked_statuses_are_listed_and_resent_by_an_operator(local, bus, now):  # noqa: F811
    client, ok, gone = bus
    minutes = lambda n: now - timedelta(minutes=n)  # noqa: E731
    sent_later = _parked(processed("PS-OK", now), ok, minutes(5), tries=3)
    refused = _parked(errored_by_supervisor("PS-GONE", now), gone, minutes(9), tries=7)
    fresh = _parked(processed("PS-NEW", now), ok, now)  # its writer is sending it
    for record in (sent_later, refused, fresh):
        await local.store.create_if_absent(record)

    parked = await views.parked_statuses(local)
    assert [r.id for r in parked["entries"]] == ["PS-GONE", "PS-OK"]  # oldest first
    assert parked["queues"][gone] == {"count": 1, "since": refused.PendingStatus.At, "tries": 7}
    assert parked["queues"][ok]["count"] == 1

    # the page: per queue, each entry, and a resend link for each
    page = await _call("console_statuses", _request("GET", "/statuses"))
    body = html.unescape(page.get_body().decode())
    assert page.status_code == 200, body
    assert f'data-queue="{ok}"' in body
    assert f'data-queue="{gone}"' in body
    assert 'data-order="PS-NEW"' not in body
    assert f"/api/console/statuses/{gone}/resend?order=PS-GONE" in body

    # the Starter's alert for the refusing queue links to its parked statuses
    alert = {"Kind": "StatusUndeliverable", "Reason": "refused", "Timestamp": now.isoformat()}
    async with client.get_queue_sender("alerts") as sender:
        await sender.send_messages(ServiceBusMessage(json.dumps({**alert, "Queue": gone})))
    alerts = await _call("console_alerts", _request("GET", "/alerts"))
    assert f'href="/api/console/statuses?queue={gone}"' in alerts.get_body().decode()

    # the order's page says its status is parked, with the same link
    order = await _call(
        "console_order", _request("GET", "/orders/PS-GONE", route={"order_id": "PS-GONE"})
    )
    text = html.unescape(order.get_body().decode())
    assert "the Failed status waits in the order's outbox" in text
    assert "(7 tries refused by" in text

    # no reason: refused, nothing sent
    with pytest.raises(views.BadRequest, match="say why"):
        await views.resend_statuses(local, ok, None, "ada", "")

    # resent through the route: confirmation page, then a POST with its token
    said = await _resend(ok, None, "the queue is back")
    assert said.headers["Location"] == (
        f"/api/console/statuses?queue={ok}&done=resend&sent=1&refused=0"
    )
    after, _ = await local.store.read("PS-OK")
    assert after.PendingStatus is None  # taken by the queue, cleared
    async with client.get_queue_receiver(ok) as receiver:
        (message,) = await receiver.peek_messages(max_message_count=10)
    assert message.message_id == sent_later.PendingStatus.MessageId  # the entry's own id
    assert message.application_properties[b"Status"] == StatusKind.PROCESSED.value.encode()

    # a queue that still refuses: nothing sent, one more try counted, still parked
    said = await views.resend_statuses(local, gone, "PS-GONE", "ada", "trying once more")
    assert said == {"sent": 0, "refused": 1}
    after, _ = await local.store.read("PS-GONE")
    assert after.PendingStatus is not None
    assert after.PendingStatus.Tries == 8
    notice = await _call(
        "console_statuses",
        _request("GET", "/statuses", params={"done": "resend", "sent": "0", "refused": "1"}),
    )
    assert "the queue refused the next one" in html.unescape(notice.get_body().decode())

    # an order with nothing parked: said so, nothing sent
    with pytest.raises(views.NotFound, match="no status waiting"):
        await views.resend_statuses(local, ok, "PS-OK", "ada", "once more")


async def _resend(queue: str, order_id: str | None, reason: str):
    route = {"queue": queue, "action": "resend"}
    params = {"order": order_id} if order_id else None
    page = await _call(
        "console_status_action",
        _request("GET", f"/statuses/{queue}/resend", params=params, route=route),
    )
    form = page.get_body().decode()
    assert page.status_code == 200, form
    assert 'id="parked"' in form
    token = form.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    return await _call(
        "console_status_action",
        _request(
            "POST",
            f"/statuses/{queue}/resend",
            params=params,
            route=route,
            headers={"Origin": HOST, "Sec-Fetch-Site": "same-origin"},
            body=urlencode({"csrf": token, "reason": reason}).encode(),
        ),
    )


async def test_an_alert_left_in_the_outbox_is_listed_under_the_alerts_queue_and_resent(
    local,  # noqa: F811 - the fixture imported above
    bus,
    now,
):
    """A Failed status whose operator alert the alerts queue refused went to
    its reply queue without it; the entry stays for the alert alone. The
    console lists it under `alerts`, not as a status parked for the client's
    queue, and its resend sends the alert (the entry's own id) and not the
    status again."""
    client, ok, _ = bus
    record = _parked(errored_by_supervisor("PS-ALERT", now), ok, now - timedelta(minutes=4))
    assert record.PendingStatus is not None
    pending = record.PendingStatus.model_copy(update={"Sent": True, "Tries": 2})
    await local.store.create_if_absent(record.model_copy(update={"PendingStatus": pending}))

    parked = await views.parked_statuses(local)
    assert list(parked["queues"]) == ["alerts"]
    assert parked["queues"]["alerts"]["count"] == 1
    page = await _call("console_statuses", _request("GET", "/statuses"))
    body = html.unescape(page.get_body().decode())
    assert "/api/console/statuses/alerts/resend?order=PS-ALERT" in body
    order = await _call(
        "console_order", _request("GET", "/orders/PS-ALERT", route={"order_id": "PS-ALERT"})
    )
    text = html.unescape(order.get_body().decode())
    assert f"The Failed status is on {ok}; its operator alert waits" in text

    with pytest.raises(views.NotFound, match="no status waiting"):
        await views.resend_statuses(local, ok, "PS-ALERT", "ada", "the status again")
    said = await _resend("alerts", "PS-ALERT", "the alerts queue is back")
    assert said.headers["Location"].endswith("done=resend&sent=1&refused=0")
    after, _ = await local.store.read("PS-ALERT")
    assert after.PendingStatus is None
    async with client.get_queue_receiver("alerts") as receiver:
        alerts = await receiver.peek_messages(max_message_count=10)
    assert [json.loads(str(m))["Kind"] for m in alerts] == ["OrderError"]
    async with client.get_queue_receiver(ok) as receiver:
        assert await receiver.peek_messages(max_message_count=10) == []
