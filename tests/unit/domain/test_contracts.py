"""The wire contracts reject what they should, with reasons a human can read."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from domain import ids
from domain.codec import decode, encode
from domain.errors import ValidationFailed
from domain.models import AgentReply, AgentRequest, OrderSubmitted, StatusUpdate
from tests.unit.domain.conftest import order_payload


def body(**overrides) -> bytes:
    return json.dumps(order_payload(**overrides)).encode()


def test_round_trip():
    order = decode(OrderSubmitted, body())
    assert decode(OrderSubmitted, encode(order)) == order


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"Extra": 1}, "Extra: Extra inputs are not permitted"),
        ({"Lines": [{"Sku": "S", "Quantity": "2", "UnitPrice": "1.00"}], "Total": "2.00"}, "Lines.0.Quantity"),
        ({"Lines": []}, "Lines"),
        ({"Total": "99.00"}, "does not equal the sum"),
        ({"OrderID": "a/b"}, "OrderID"),
        ({"ReplyTo": "Bad Queue"}, "ReplyTo"),
        ({"PaymentReference": "4111 1111 1111 1111"}, "card number"),
        ({"PaymentReference": "5500-0000-0000-0004"}, "card number"),
        ({"SchemaVersion": 2}, "SchemaVersion"),
    ],
)
def test_invalid_orders_are_refused_with_a_reason(overrides, expected):
    with pytest.raises(ValidationFailed) as info:
        decode(OrderSubmitted, body(**overrides))
    assert expected in info.value.reason
    assert info.value.reason.startswith("OrderSubmitted: ")


@pytest.mark.parametrize("reference", ["pay-348934981143", "4111111111111112", "ref-12345678901234567"])
def test_payment_references_that_are_not_card_numbers_pass(reference):
    assert decode(OrderSubmitted, body(PaymentReference=reference)).PaymentReference == reference


def test_oversize_body_refused_before_parsing():
    with pytest.raises(ValidationFailed, match="limit is 1024 bytes"):
        decode(OrderSubmitted, b"x" * 2000, max_bytes=1024)


def test_not_json_is_refused():
    with pytest.raises(ValidationFailed, match="OrderSubmitted"):
        decode(OrderSubmitted, b"{not json")


def test_digest_ignores_decimal_spelling_but_not_values():
    a = decode(OrderSubmitted, body())
    b = decode(
        OrderSubmitted,
        body(Lines=[{"Sku": "SKU-1", "Quantity": 2, "UnitPrice": 10}, {"Sku": "SKU-2", "Quantity": 1, "UnitPrice": 5.5}], Total=25.5),
    )
    c = decode(OrderSubmitted, body(Customer={"CustomerId": "C-8", "Name": "Ada"}))
    assert a.digest() == b.digest()
    assert a.digest() != c.digest()


def test_naive_timestamps_refused():
    with pytest.raises(ValidationFailed, match="Timestamp"):
        decode(StatusUpdate, b'{"OrderID":"A","Status":"Received","Timestamp":"2026-01-01T00:00:00"}')


def test_agent_reply_needs_an_error_when_not_ok():
    base = {"InstanceId": "A:1", "OrderID": "A", "Step": "charge-payment", "Attempt": 1,
            "EventName": "reply-charge-payment-1", "EventId": "e1"}
    with pytest.raises(ValidationFailed, match="must say why"):
        decode(AgentReply, json.dumps({**base, "Outcome": "permanent"}))
    assert decode(AgentReply, json.dumps({**base, "Outcome": "ok", "Result": {"ref": "x"}})).Result == {"ref": "x"}


def test_agent_request_payload_is_bounded():
    request = {
        "InstanceId": "A:1", "OrderID": "A", "Step": "charge-payment", "Attempt": 1,
        "IdempotencyKey": "A/charge-payment", "FencingToken": 1,
        "Deadline": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
        "ReplyEvent": "reply-charge-payment-1",
        "Payload": {f"k{i}": i for i in range(51)},
    }
    with pytest.raises(ValidationFailed, match="at most 50"):
        decode(AgentRequest, json.dumps(request))


# --- identities ----------------------------------------------------------------------


def test_identities_have_one_builder_each():
    instance = ids.attempt_instance_id("ORD-1", 3)
    assert instance == "ORD-1:3"
    assert ids.parse_attempt_instance_id(instance) == ("ORD-1", 3)
    assert ids.idempotency_key("ORD-1", "charge-payment") == "ORD-1/charge-payment"
    assert ids.fencing_token(3) == 3
    assert ids.agent_request_message_id(instance, "charge-payment") == "ORD-1:3/charge-payment"
    assert ids.agent_request_message_id(instance, "charge-payment", "undo") == "ORD-1:3/charge-payment/undo"
    assert ids.reply_event_name("charge-payment", 3) != ids.reply_event_name("charge-payment", 4)
    assert ids.reply_event_name("charge-payment", 3) != ids.reply_event_name("charge-payment", 3, "undo")


@pytest.mark.parametrize("bad", ["", "a:b", "a/b", "-x", "x" * 65])
def test_order_ids_that_would_break_separators_are_refused(bad):
    with pytest.raises(ValueError):
        ids.attempt_instance_id(bad, 1)


def test_attempts_start_at_one():
    with pytest.raises(ValueError):
        ids.attempt_instance_id("A", 0)
    with pytest.raises(ValueError):
        ids.parse_attempt_instance_id("A:x")
