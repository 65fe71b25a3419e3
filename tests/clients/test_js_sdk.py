"""The official JavaScript SDK (`@azure/service-bus`, installed by `npm ci` from
package-lock.json) as a client application against the emulator: it posts
orders to its ingress queue, reads its statuses from its reply queue, peeks
the dead letters, and uses sessions, scheduled messages and settlement."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from domain.dead_letters import DeadLetterReason
from domain.ids import status_message_id
from tests.clients.helpers import answer_orders, contract, order, run_js
from tests.fixtures.servicebus import EmulatorProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_orders_statuses_and_dead_letters(client_bus: EmulatorProcess):
    cs = client_bus.connection_string
    good = [order(f"JS-{n}", "replies-js") for n in (1, 2)]
    bad = order("JS-3", "replies-js", Total="ten")
    sent = run_js(
        "post", connection=cs, queue="orders-js", orders=[*good, bad], traceparent=TRACEPARENT
    )
    assert sent["sent"] == ["JS-1", "JS-2", "JS-3"]

    seen = answer_orders(cs, "orders-js", 3)
    for entry, original in zip(seen, [*good, bad], strict=True):
        # An object body reaches the app as its JSON text, once encoded.
        assert json.loads(entry["body"]) == original
        assert entry["message_id"] == original["OrderID"]
        assert entry["content_type"] == "application/json"
        # The Python SDK gives application-property keys, and string values, as bytes.
        assert entry["application_properties"] == {b"traceparent": TRACEPARENT.encode()}
    assert [e["outcome"] for e in seen] == ["answered", "answered", "dead-lettered"]

    statuses = run_js("receive", connection=cs, queue="replies-js", count=4)["messages"]
    schema = contract("StatusUpdate")
    got = set()
    for message in statuses:
        # A JSON body comes back to the JavaScript SDK as the parsed object.
        schema.validate(message["body"])
        oid, status = message["body"]["OrderID"], message["body"]["Status"]
        assert message["messageId"] == status_message_id(oid, status)
        assert message["applicationProperties"] == {"OrderID": oid, "Status": status}
        got.add((oid, status))
    assert got == {(o["OrderID"], s) for o in good for s in ("Received", "Processed")}

    (dead,) = run_js("deadletters", connection=cs, queue="orders-js")["messages"]
    assert dead["messageId"] == "JS-3"
    assert dead["deadLetterReason"] == DeadLetterReason.INVALID_MESSAGE.value
    assert "Total" in dead["deadLetterErrorDescription"]
    assert dead["body"] == bad


def test_a_string_body_is_json_encoded_a_second_time(client_bus: EmulatorProcess):
    """`body: JSON.stringify(order)` arrives as a JSON *string* literal, not the order:
    the guide says to pass the object (or a Buffer of its JSON text)."""
    cs = client_bus.connection_string
    twice = order("JS-STRING", "replies-js")
    run_js("post", connection=cs, queue="orders-js", orders=[twice], encoding="string")
    (entry,) = answer_orders(cs, "orders-js", 1)
    assert json.loads(entry["body"]) == json.dumps(twice, separators=(",", ":"))
    assert entry["outcome"] == "dead-lettered"
    dead = run_js("deadletters", connection=cs, queue="orders-js")["messages"]
    (refused,) = [d for d in dead if d["messageId"] == "JS-STRING"]
    assert refused["deadLetterReason"] == DeadLetterReason.INVALID_MESSAGE.value


def test_sessions(client_bus: EmulatorProcess):
    result = run_js("sessions", connection=client_bus.connection_string, queue="sessions-js")
    assert [m["body"] for m in result["fromA"]] == [
        {"sessionId": "session-a", "index": i} for i in range(3)
    ]
    assert {m["sessionId"] for m in result["fromA"]} == {"session-a"}
    assert result["state"] == {"seen": 3}
    assert result["lockedUntil"]
    assert result["nextId"] == "session-b"
    assert [m["body"]["index"] for m in result["fromNext"]] == [0, 1]


def test_scheduled_messages(client_bus: EmulatorProcess):
    result = run_js(
        "schedule", connection=client_bus.connection_string, queue="scheduled-js", delayMs=3000
    )
    (peeked,) = result["peeked"]  # the cancelled one is gone
    assert peeked["messageId"] == "scheduled-kept"
    assert peeked["state"] == "scheduled"
    assert result["receivedEarly"] == 0
    (received,) = result["received"]
    assert received["messageId"] == "scheduled-kept"
    scheduled_for = _when(result["scheduledFor"])
    assert _when(received["enqueuedTimeUtc"]) >= scheduled_for - timedelta(seconds=1)
    assert _when(result["receivedAt"]) >= scheduled_for


def test_dead_letter_and_defer(client_bus: EmulatorProcess):
    result = run_js("settle", connection=client_bus.connection_string, queue="settle-js")
    assert result["deferredAgain"]["messageId"] == "to-defer"
    (dead,) = result["deadLetters"]
    assert dead["messageId"] == "to-dead-letter"
    assert dead["deadLetterReason"] == "ClientRefused"
    assert dead["deadLetterErrorDescription"] == "refused by the JavaScript client"


def test_the_administration_client_is_refused_naming_the_feature(client_bus: EmulatorProcess):
    cs = client_bus.connection_string
    # The emulator's certificate is self-signed: with verification on, Node says so.
    verified = run_js("admin", connection=cs, queue="orders-js")
    assert verified["served"] is False
    assert "self-signed certificate" in verified["message"]
    unverified = run_js(
        "admin", connection=cs, queue="orders-js", env={"NODE_TLS_REJECT_UNAUTHORIZED": "0"}
    )
    assert unverified["served"] is False
    assert "ServiceBusAdministrationClient" in unverified["message"]
    assert "is not supported by the local Service Bus emulator" in unverified["message"]


def test_the_streaming_receiver(client_bus: EmulatorProcess):
    cs = client_bus.connection_string
    orders = [order(f"JS-STREAM-{n}", "replies-js") for n in range(3)]
    run_js("post", connection=cs, queue="stream-js", orders=orders)
    got = run_js("subscribe", connection=cs, queue="stream-js", count=3)["messages"]
    assert [m["body"] for m in got] == orders
    # Completed by the SDK: nothing is left to receive.
    assert (
        run_js("receive", connection=cs, queue="stream-js", count=1, waitMs=2000)["messages"] == []
    )
