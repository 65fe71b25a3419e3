"""The published message contracts (docs/contracts/*.schema.json) are current,
valid JSON Schema, and agree with what the app itself accepts and writes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest

from domain import schemas
from domain.codec import decode, encode
from domain.errors import ValidationFailed
from domain.models import AgentReply, OperatorAlert, OrderSubmitted, StatusKind, StatusUpdate
from tests.builders import agent_request, order_payload

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((schemas.CONTRACTS_DIR / f"{name}.schema.json").read_text())
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def stale_files(directory: Path = schemas.CONTRACTS_DIR) -> list[str]:
    """Files missing, different, or no longer generated."""
    wanted = schemas.render_all()
    present = {p.name for p in directory.glob("*.schema.json")} if directory.exists() else set()
    stale = [
        n
        for n, text in wanted.items()
        if not (directory / n).exists() or (directory / n).read_text() != text
    ]
    return sorted(stale + sorted(present - set(wanted)))


def test_contract_files_are_current():
    """Fails when a model changed and `python -m domain.schemas` was not run."""
    assert stale_files() == []


def test_a_changed_model_is_caught(tmp_path):
    schemas.write_all(tmp_path)
    assert stale_files(tmp_path) == []
    target = tmp_path / "StatusUpdate.schema.json"
    target.write_text(target.read_text().replace('"Timestamp"', '"When"'))
    (tmp_path / "Retired.schema.json").write_text("{}")
    assert stale_files(tmp_path) == ["Retired.schema.json", "StatusUpdate.schema.json"]


@pytest.mark.parametrize("name", sorted(schemas.CONTRACTS))
def test_schema_is_valid_2020_12(name: str):
    schema = json.loads((schemas.CONTRACTS_DIR / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == schemas.JSON_SCHEMA_DIALECT
    assert schema["additionalProperties"] is False, "contracts are closed"
    assert "Route:" in schema["description"]


def test_every_message_on_the_wire_has_a_contract():
    assert set(schemas.CONTRACTS) == {
        "OrderSubmitted",
        "StatusUpdate",
        "OperatorAlert",
        "AgentRequest",
        "AgentReply",
    }


def test_what_the_app_writes_validates():
    status = StatusUpdate(
        OrderID="ORD-1", Status=StatusKind.STEP_COMPLETED, Step="payment", Timestamp=NOW
    )
    validator("StatusUpdate").validate(json.loads(encode(status)))
    alert = OperatorAlert(Kind="OrderConflict", OrderID="ORD-1", Reason="differs", Timestamp=NOW)
    validator("OperatorAlert").validate(json.loads(encode(alert)))
    request = agent_request("ORD-1", "payment", 2, "do", NOW + timedelta(seconds=60))
    validator("AgentRequest").validate(json.loads(encode(request)))
    reply = AgentReply(
        InstanceId=request.InstanceId,
        OrderID="ORD-1",
        Step="payment",
        Attempt=2,
        EventName=request.ReplyEvent,
        EventId="e-1",
        Outcome="transient",
        Error="503",
    )
    validator("AgentReply").validate(json.loads(encode(reply)))


def _app_accepts(payload: dict) -> bool:
    try:
        decode(OrderSubmitted, json.dumps(payload).encode())
        return True
    except ValidationFailed:
        return False


# (payload, accepted by the app and the schema alike)
ORDER_CASES = {
    "valid": (order_payload(), True),
    "numbers as JSON numbers": (
        order_payload(Lines=[{"Sku": "S", "Quantity": 1, "UnitPrice": 5}], Total=5),
        True,
    ),
    "no OrderID": ({k: v for k, v in order_payload().items() if k != "OrderID"}, False),
    "OrderID with a slash": (order_payload("ORD/1"), False),
    "OrderID too long": (order_payload("O" * 65), False),
    "unknown field": (order_payload(Discount="5"), False),
    "quantity as a string": (
        order_payload(Lines=[{"Sku": "S", "Quantity": "1", "UnitPrice": "5.00"}], Total="5.00"),
        False,
    ),
    "no lines": (order_payload(Lines=[], Total="0"), False),
    "amount in words": (order_payload(Total="ten"), False),
    "amount with a decimal comma": (
        order_payload(Lines=[{"Sku": "S", "Quantity": 1, "UnitPrice": "5,00"}], Total="5.00"),
        False,
    ),
    "amount in exponent form": (
        order_payload(Lines=[{"Sku": "S", "Quantity": 1, "UnitPrice": "5e0"}], Total="5"),
        False,
    ),
    "amount with a sign": (
        order_payload(Lines=[{"Sku": "S", "Quantity": 1, "UnitPrice": "+5"}], Total="5"),
        False,
    ),
    "amount with three decimals": (
        order_payload(Lines=[{"Sku": "S", "Quantity": 1, "UnitPrice": "5.000"}], Total="5"),
        False,
    ),
    "amount with a leading zero": (
        order_payload(Lines=[{"Sku": "S", "Quantity": 1, "UnitPrice": "05.00"}], Total="5"),
        False,
    ),
    "amount without decimals": (
        order_payload(Lines=[{"Sku": "S", "Quantity": 1, "UnitPrice": "5"}], Total="5.0"),
        True,
    ),
    "amount too large for a unit price": (
        order_payload(
            Lines=[{"Sku": "S", "Quantity": 1, "UnitPrice": "12345678901"}], Total="12345678901"
        ),
        False,
    ),
    "lower-case currency": (order_payload(Currency="eur"), False),
    "wrong schema version": (order_payload(SchemaVersion=2), False),
}


@pytest.mark.parametrize("case", sorted(ORDER_CASES))
def test_order_schema_agrees_with_the_app(case: str):
    payload, accepted = ORDER_CASES[case]
    assert _app_accepts(payload) is accepted, "the case itself is wrong"
    errors = list(validator("OrderSubmitted").iter_errors(payload))
    assert (not errors) is accepted, [e.message for e in errors]


def test_rules_only_code_checks_are_stated():
    schema = json.loads((schemas.CONTRACTS_DIR / "OrderSubmitted.schema.json").read_text())
    assert "Total equals the sum" in schema["description"]
    assert "card number" in schema["description"]
    # The schema cannot see the sum, the app can:
    payload = order_payload(Total="99.00")
    assert not list(validator("OrderSubmitted").iter_errors(payload))
    assert not _app_accepts(payload)
