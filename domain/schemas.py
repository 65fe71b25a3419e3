"""JSON Schemas of the messages on the wire, generated from the pydantic models
into docs/contracts/ by `python -m domain.schemas`, never edited
(docs/adr/013-message-contracts.md); tests/contracts fails when a file is stale."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from domain.boundary import ORDER_ID_PATTERN
from domain.models import AgentReply, AgentRequest, OperatorAlert, OrderSubmitted, StatusUpdate

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS_DIR = ROOT / "docs" / "contracts"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True)
class Contract:
    model: type[BaseModel]
    mode: Literal["validation", "serialization"]
    route: str
    notes: str = ""


CONTRACTS: dict[str, Contract] = {
    "OrderSubmitted": Contract(
        OrderSubmitted,
        "validation",
        "client application -> its ingress queue (orders-<AppId>)",
        "Also checked in code: Total equals the sum of Quantity x UnitPrice over Lines; "
        "PaymentReference must not look like a card number (13-19 digits passing the Luhn check); "
        "AppId must be the sending application and ReplyTo its registered reply queue.",
    ),
    "StatusUpdate": Contract(
        StatusUpdate,
        "serialization",
        "order processing -> the client application's reply queue",
    ),
    "OperatorAlert": Contract(
        OperatorAlert,
        "serialization",
        "order processing -> alerts (operators)",
    ),
    "AgentRequest": Contract(
        AgentRequest,
        "validation",
        "Scheduler -> agent-requests (internal)",
        "Also checked in code: Signature must be the Scheduler's HMAC over the canonical request "
        "(domain.signing, ADR 017e) before anything is called; unsigned or mis-signed: dead-lettered "
        "ForgedRequest; a signed request for an unknown step: UnknownStep.",
    ),
    "AgentReply": Contract(
        AgentReply,
        "validation",
        "Agent -> agent-responses (internal)",
        "Also checked in code: Error is required when Outcome is transient or permanent; "
        "ReplyToken must be the token of the request this reply names (AppId, InstanceId, OrderID, "
        "Step, Action, Attempt, EventName) and Signature an agent's HMAC over the canonical reply "
        "(domain.signing, ADR 017e), else dead-lettered ForgedReply.",
    ),
}


def _tighten(node: Any) -> None:
    """Add the rules pydantic cannot see (AfterValidator) to every OrderID property."""
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict):
            for name, spec in props.items():
                if name == "OrderID" and spec.get("type") == "string" and "pattern" not in spec:
                    # The same expression domain.boundary.check_order_id applies.
                    spec["pattern"] = f"^{ORDER_ID_PATTERN.pattern}$"
                    spec["minLength"], spec["maxLength"] = 1, 64
        for value in node.values():
            _tighten(value)
    elif isinstance(node, list):
        for value in node:
            _tighten(value)


def schema_for(name: str) -> dict[str, Any]:
    contract = CONTRACTS[name]
    body = contract.model.model_json_schema(mode=contract.mode)
    _tighten(body)
    description = " ".join(
        filter(None, [body.pop("description", ""), f"Route: {contract.route}.", contract.notes])
    )
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"{name}.schema.json",
        **body,
        "description": description,
    }


def render_all() -> dict[str, str]:
    """{file name: text} for every contract."""
    return {
        f"{name}.schema.json": json.dumps(schema_for(name), indent=2, sort_keys=True) + "\n"
        for name in CONTRACTS
    }


def write_all(directory: Path = CONTRACTS_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    wanted = render_all()
    for old in directory.glob("*.schema.json"):
        if old.name not in wanted:
            old.unlink()
    for name, text in wanted.items():
        (directory / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    write_all()
    print(f"wrote {len(CONTRACTS)} schemas to {CONTRACTS_DIR.relative_to(ROOT)}")
