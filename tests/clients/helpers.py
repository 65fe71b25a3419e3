"""Helpers of the client tests: client applications in other stacks than the
Python SDK, against the local Service Bus emulator: the official JavaScript
SDK (`@azure/service-bus`, run with node from tests/clients/js/) and Qpid
Proton, a generic AMQP 1.0 client.

Each client stack gets its own queues (`orders-<stack>`, `replies-<stack>`,
...) on one emulator, shaped like the project's ingress and reply queues.
`answer_orders` plays the app's part at the queue boundary with the app's own
decoder and message ids (domain.codec, domain.ids): a valid order gets its
Received and Processed statuses, an invalid one is dead-lettered as Submit
does. The whole app, through the local host, answers the client guide's
Python and JavaScript examples in tests/contracts/test_client_guide.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from domain import schemas
from domain.codec import decode, encode
from domain.dead_letters import DeadLetterReason
from domain.errors import ValidationFailed
from domain.ids import status_message_id
from domain.models import OrderSubmitted, StatusKind, StatusUpdate

JS_DIR = Path(__file__).resolve().parent / "js"
REPO = Path(__file__).resolve().parents[2]
STACKS = ("js", "amqp")
_INGRESS = {
    "LockDuration": "PT30S",
    "MaxDeliveryCount": 5,
    "RequiresDuplicateDetection": True,
    "DuplicateDetectionHistoryTimeWindow": "PT10M",
    "DeadLetteringOnMessageExpiration": True,
}
_PLAIN = {"LockDuration": "PT30S", "MaxDeliveryCount": 5}


def client_queues() -> dict[str, dict[str, Any]]:
    queues: dict[str, dict[str, Any]] = {}
    for stack in STACKS:
        queues[f"orders-{stack}"] = _INGRESS
        queues[f"replies-{stack}"] = {**_PLAIN, "RequiresDuplicateDetection": True}
        queues[f"sessions-{stack}"] = {**_PLAIN, "RequiresSession": True}
        queues[f"scheduled-{stack}"] = _PLAIN
        queues[f"settle-{stack}"] = _PLAIN
        queues[f"stream-{stack}"] = _PLAIN
    return queues


def node() -> str:
    found = shutil.which("node")
    assert found, "node is needed for the JavaScript client tests (make install sets it up)"
    return found


def run_js(
    command: str, timeout: float = 120, env: dict[str, str] | None = None, **args: Any
) -> dict[str, Any]:
    """Run one command of tests/clients/js/servicebus_client.mjs; its JSON answer."""
    done = subprocess.run(
        [node(), str(JS_DIR / "servicebus_client.mjs"), command, json.dumps(args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"no answer from node ({done.returncode}): {done.stderr[-3000:]}"
    answer = json.loads(lines[-1])
    assert "error" not in answer, (answer, done.stderr[-3000:])
    assert done.returncode == 0, done.stderr[-3000:]
    return answer


def contract(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((schemas.CONTRACTS_DIR / f"{name}.schema.json").read_text())
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def order(order_id: str, reply_to: str, **overrides: Any) -> dict[str, Any]:
    """An order as a client writes it (amounts as strings, as the client guide says)."""
    body: dict[str, Any] = {
        "OrderID": order_id,
        "AppId": "acme",
        "ReplyTo": reply_to,
        "Customer": {"CustomerId": "C-7", "Name": "Ada"},
        "Lines": [
            {"Sku": "SKU-1", "Quantity": 2, "UnitPrice": "10.00"},
            {"Sku": "SKU-2", "Quantity": 1, "UnitPrice": "5.50"},
        ],
        "Total": "25.50",
        "Currency": "EUR",
        "PaymentReference": "pay-ref-42",
    }
    body.update(overrides)
    return body


def answer_orders(connection_string: str, ingress: str, count: int) -> list[dict[str, Any]]:
    """Play the app at the queue boundary for `count` messages on `ingress`.

    Returns what arrived, per message: the raw body bytes, content type, message id,
    application properties as the Python SDK gives them, and what was done.
    """
    seen: list[dict[str, Any]] = []
    with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_receiver(ingress, max_wait_time=10) as receiver,
    ):
        while len(seen) < count:
            batch = receiver.receive_messages(max_message_count=count - len(seen))
            assert batch, f"only {len(seen)} of {count} messages arrived on {ingress}"
            for message in batch:
                body = b"".join(message.body)
                entry = {
                    "body": body,
                    "message_id": message.message_id,
                    "content_type": message.content_type,
                    "application_properties": dict(message.application_properties or {}),
                }
                try:
                    submitted = decode(OrderSubmitted, body)
                except ValidationFailed as exc:
                    receiver.dead_letter_message(
                        message,
                        reason=DeadLetterReason.INVALID_MESSAGE.value,
                        error_description=exc.reason,
                    )
                    entry["outcome"] = "dead-lettered"
                else:
                    _send_statuses(client, submitted)
                    receiver.complete_message(message)
                    entry["outcome"] = "answered"
                seen.append(entry)
    return seen


def _send_statuses(client: ServiceBusClient, submitted: OrderSubmitted) -> None:
    with client.get_queue_sender(submitted.ReplyTo) as sender:
        for status in (StatusKind.RECEIVED, StatusKind.PROCESSED):
            update = StatusUpdate(
                OrderID=submitted.OrderID, Status=status, Timestamp=datetime.now(UTC)
            )
            sender.send_messages(
                ServiceBusMessage(
                    encode(update),
                    message_id=status_message_id(submitted.OrderID, status.value),
                    content_type="application/json",
                    application_properties={"OrderID": submitted.OrderID, "Status": status.value},
                )
            )
