"""The wire contracts reject what they should, with reasons a human can read."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from domain import ids
from domain.codec import decode, encode
from domain.errors import ValidationFailed
from domain.models import AgentReply, AgentRequest, OperatorAlert, OrderSubmitted, StatusUpdate
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
        (
            {"Lines": [{"Sku": "S", "Quantity": "2", "UnitPrice": "1.00"}], "Total": "2.00"},
            "Lines.0.Quantity",
        ),
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


@pytest.mark.parametrize(
    "reference", ["pay-348934981143", "4111111111111112", "ref-12345678901234567"]
)
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
        body(
            Lines=[
                {"Sku": "SKU-1", "Quantity": 2, "UnitPrice": 10},
                {"Sku": "SKU-2", "Quantity": 1, "UnitPrice": 5.5},
            ],
            Total=25.5,
        ),
    )
    c = decode(OrderSubmitted, body(Customer={"CustomerId": "C-8", "Name": "Ada"}))
    assert a.digest() == b.digest()
    assert a.digest() != c.digest()


def test_naive_timestamps_refused():
    with pytest.raises(ValidationFailed, match="Timestamp"):
        decode(
            StatusUpdate, b'{"OrderID":"A","Status":"Received","Timestamp":"2026-01-01T00:00:00"}'
        )


@pytest.mark.parametrize(
    "instant",
    [1780000000, 1780000000.5, "1780000000", "1780000000.5", "2026-06-01 00:00:00Z", "2026-06-01"],
)
def test_a_timestamp_written_as_a_number_is_not_coerced(instant):
    """ADR 013: types are not coerced. Every other wire field is strict on its
    own (a Quantity, the SchemaVersion, an amount); a timestamp is strict
    by the codec's strict validation (mutant `codec-lax-types`, which took
    Unix seconds for a Deadline or a call's time) and, written as a string,
    by RFC 3339's date-time (domain.models.WireTime): pydantic alone takes
    Unix seconds in a string and a space for the "T"."""
    request = {
        "InstanceId": "webshop:ORD-1:1",
        "OrderID": "webshop:ORD-1",
        "Step": "charge-payment",
        "Action": "do",
        "Attempt": 1,
        "IdempotencyKey": "webshop:ORD-1/charge-payment",
        "FencingToken": 1,
        "Deadline": "2026-06-01T00:00:00Z",
        "ReplyEvent": "reply-charge-payment-1",
        "Payload": {},
    }
    decode(AgentRequest, json.dumps(request))
    with pytest.raises(ValidationFailed, match="Deadline"):
        decode(AgentRequest, json.dumps({**request, "Deadline": instant}))
    reply = {
        "InstanceId": "webshop:ORD-1:1",
        "OrderID": "webshop:ORD-1",
        "Step": "charge-payment",
        "Action": "do",
        "Attempt": 1,
        "Outcome": "ok",
        "Result": {"Reference": "r-1"},
        "EventName": "reply-charge-payment-1",
        "EventId": "webshop:ORD-1:1/reply-charge-payment-1/reply",
        "Calls": [{"At": "2026-06-01T00:00:00Z", "Ms": 200, "Outcome": "ok"}],
    }
    decode(AgentReply, json.dumps(reply))
    with pytest.raises(ValidationFailed, match="At"):
        decode(AgentReply, json.dumps({**reply, "Calls": [{**reply["Calls"][0], "At": instant}]}))


def test_agent_reply_needs_an_error_when_not_ok():
    base = {
        "InstanceId": "A:1",
        "OrderID": "A",
        "Step": "charge-payment",
        "Attempt": 1,
        "EventName": "reply-charge-payment-1",
        "EventId": "e1",
    }
    with pytest.raises(ValidationFailed, match="must say why"):
        decode(AgentReply, json.dumps({**base, "Outcome": "permanent"}))
    assert decode(
        AgentReply, json.dumps({**base, "Outcome": "ok", "Result": {"ref": "x"}})
    ).Result == {"ref": "x"}


def test_agent_request_payload_is_bounded():
    request = {
        "InstanceId": "A:1",
        "OrderID": "A",
        "Step": "charge-payment",
        "Attempt": 1,
        "IdempotencyKey": "A/charge-payment",
        "FencingToken": 1,
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
    assert (
        ids.agent_request_message_id(instance, "charge-payment", "undo")
        == "ORD-1:3/charge-payment/undo"
    )
    assert ids.reply_event_name("charge-payment", 3) != ids.reply_event_name("charge-payment", 4)
    assert ids.reply_event_name("charge-payment", 3) != ids.reply_event_name(
        "charge-payment", 3, "undo"
    )


@pytest.mark.parametrize("bad", ["", "a:b:c", "A:b", "a/b", "-x", "x" * 65, "a" * 17 + ":b"])
def test_order_keys_that_would_break_separators_are_refused(bad):
    with pytest.raises(ValueError, match="OrderID"):
        ids.attempt_instance_id(bad, 1)


@pytest.mark.parametrize("bad", ["a:b", "a/b", "-x", "x" * 65])
def test_order_ids_that_would_break_separators_are_refused(bad):
    with pytest.raises(ValueError, match="OrderID"):
        ids.order_key("webshop", bad)


def test_attempts_start_at_one():
    with pytest.raises(ValueError, match="numbered from 1"):
        ids.attempt_instance_id("A", 0)
    with pytest.raises(ValueError, match="not an attempt instance id"):
        ids.parse_attempt_instance_id("A:x")


# --- the client boundary (domain.boundary) ---------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"OrderID": "A", "OrderID": "B"}', "duplicate key 'OrderID'"),
        (b'{"Total": NaN}', "NaN is not a JSON number"),
        (b'{"Total": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"Total": 1e400}', "out of range"),
        (b"[" * 40 + b"]" * 40, "nested more than 32 levels"),
        (b"\xef\xbb\xbf{}", "byte order mark"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b"{} {}", "invalid JSON: Extra data"),
    ],
)
def test_inexact_json_is_refused_naming_the_rule(raw, expected):
    with pytest.raises(ValidationFailed) as info:
        decode(OrderSubmitted, raw)
    assert expected in info.value.reason
    assert info.value.reason.startswith("OrderSubmitted: ")


def test_a_duplicate_key_anywhere_is_refused_even_when_both_values_agree():
    text = json.dumps(order_payload())
    with pytest.raises(ValidationFailed, match="duplicate key 'Total'"):
        decode(OrderSubmitted, '{"Total": "25.50", ' + text[1:])


@pytest.mark.parametrize("version", [1.0, True, "1", None, 2])
def test_schema_version_is_exactly_the_integer_one(version):
    with pytest.raises(ValidationFailed, match="SchemaVersion"):
        decode(OrderSubmitted, body(SchemaVersion=version))


@pytest.mark.parametrize("version", [1.0, True])
def test_nested_schema_versions_are_not_coerced_either(version):
    with pytest.raises(ValidationFailed, match=r"Customer\.SchemaVersion"):
        decode(OrderSubmitted, body(Customer={"CustomerId": "C-1", "SchemaVersion": version}))


TEXT_FIELDS = {
    "Customer.CustomerId": lambda v: {"Customer": {"CustomerId": v}},
    "Customer.Name": lambda v: {"Customer": {"CustomerId": "C-1", "Name": v}},
    "Lines.0.Sku": lambda v: {"Lines": [{"Sku": v, "Quantity": 1, "UnitPrice": "25.50"}]},
    "PaymentReference": lambda v: {"PaymentReference": v},
}
BAD_TEXT = {
    "NUL": "a\x00b",
    "newline": "ab\n",
    "tab": "a\tb",
    "escape": "a\x1b[31m",
    "bidi override": "a\u202eb",
    "bidi isolate": "a\u2066b",
    "zero-width space": "a\u200bb",
    "zero-width joiner": "a\u200db",
    "BOM": "\ufeffab",
    "line separator": "a\u2028b",
    "lone surrogate": "a\ud800b",
    "leading space": " ab",
    "trailing space": "ab ",
    "whitespace only": "   ",
    "empty": "",
}


@pytest.mark.parametrize("field", sorted(TEXT_FIELDS))
@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
def test_every_client_text_field_obeys_the_text_policy(field, kind):
    with pytest.raises(ValidationFailed) as info:
        decode(OrderSubmitted, body(**TEXT_FIELDS[field](BAD_TEXT[kind])))
    assert field in info.value.reason


@pytest.mark.parametrize("text", ["Ada Lovelace", "Zoë", "漢字", "O'Brien", "a b", "🙂"])
def test_ordinary_text_passes_the_policy(text):
    assert (
        decode(OrderSubmitted, body(Customer={"CustomerId": "C-1", "Name": text})).Customer.Name
        == text
    )


@pytest.mark.parametrize(
    "order_id", ["ORD-1\n", "ORD-1\r\n", " ORD-1", "ORD-1 ", "ORD\u200b1", "ORD-1\x00"]
)
def test_order_ids_are_matched_in_full(order_id):
    with pytest.raises(ValidationFailed, match="OrderID"):
        decode(OrderSubmitted, body(OrderID=order_id))
    with pytest.raises(ValueError, match="OrderID"):
        ids.attempt_instance_id(order_id, 1)


def test_agent_messages_obey_the_text_policy_on_the_wire():
    base = {
        "InstanceId": "A:1",
        "OrderID": "A",
        "Step": "charge-payment",
        "Attempt": 1,
        "EventName": "reply-charge-payment-1",
        "EventId": "e1",
        "Outcome": "permanent",
        "Error": "no",
    }
    for key, value in [
        ("EventName", "x\u202e"),
        ("EventId", " e1"),
        ("Error", "declined\n"),
        ("InstanceId", ""),
    ]:
        with pytest.raises(ValidationFailed, match=key):
            decode(AgentReply, json.dumps({**base, key: value}))
    with pytest.raises(ValidationFailed, match="key"):
        decode(
            AgentReply,
            json.dumps({**base, "Outcome": "ok", "Error": None, "Result": {"a\u200b": 1}}),
        )


def test_text_our_code_produces_from_outside_text_is_cleaned_not_refused():
    reply = AgentReply(
        InstanceId="A:1",
        OrderID="A",
        Step="charge-payment",
        Attempt=1,
        EventName="reply-charge-payment-1",
        EventId="e1",
        Outcome="permanent",
        Error="  card\ndeclined\u202e " + "x" * 600,
    )
    assert "\n" not in reply.Error
    assert "\u202e" not in reply.Error
    assert len(reply.Error) == 500
    assert decode(AgentReply, encode(reply)) == reply  # and what we send passes our own boundary
    alert = OperatorAlert(
        Kind="InvalidMessage",
        Reason="OrderID 'x\u202e' bad\n",
        OrderID=None,
        MessageId="m\x00",
        Timestamp=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert decode(OperatorAlert, encode(alert)) == alert
    status = StatusUpdate(
        OrderID="A",
        Status="Failed",
        Detail="\x1b[2Jboom",
        Timestamp=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert status.Detail == "\ufffd[2Jboom"


def test_the_contracts_document_the_text_policy_and_every_dead_letter_reason():
    from pathlib import Path

    import domain.models as models
    from adapters import settlement

    record = "docs/adr/013-message-contracts.md"
    assert record in models.__doc__
    doc = (Path(__file__).parents[3] / record).read_text(encoding="utf-8")
    assert "text policy" in doc
    for reason in (
        "InvalidMessage",
        "ReplyQueueNotAllowed",
        "AppIdMismatch",
        "OrderConflict",
        "RetriesExhausted",
        "ProcessingFailed",
        settlement.INVALID_MESSAGE,
        settlement.PROCESSING_FAILED,
        settlement.RETRIES_EXHAUSTED,
    ):
        assert f"| `{reason}` |" in doc
