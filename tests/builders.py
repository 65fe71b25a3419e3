"""Orders for tests: one valid order payload, overridable field by field."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

from domain.ids import attempt_instance_id, fencing_token, idempotency_key, reply_event_name
from domain.models import AgentRequest


def order_payload(order_id: str = "ORD-1", **overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "OrderID": order_id,
        "AppId": "webshop",
        "ReplyTo": "replies-webshop",
        "Customer": {"CustomerId": "C-7", "Name": "Ada"},
        "Lines": [
            {"Sku": "SKU-1", "Quantity": 2, "UnitPrice": "10.00"},
            {"Sku": "SKU-2", "Quantity": 1, "UnitPrice": "5.50"},
        ],
        "Total": "25.50",
        "Currency": "EUR",
        "PaymentReference": "pay-ref-42",
    }
    payload.update(overrides)
    return payload


def agent_request(
    order_id: str,
    step: str,
    attempt: int,
    action: str,
    deadline: datetime,
    payload: dict[str, Any] | None = None,
) -> AgentRequest:
    """An AgentRequest with every identity built by domain.ids, as the
    Scheduler's send activity builds it."""
    return AgentRequest(
        InstanceId=attempt_instance_id(order_id, attempt),
        OrderID=order_id,
        Step=step,
        Action=action,
        Attempt=attempt,
        IdempotencyKey=idempotency_key(order_id, step),
        FencingToken=fencing_token(attempt),
        Deadline=deadline,
        ReplyEvent=reply_event_name(step, attempt, action),
        Payload=payload or {},
    )


class ReadClock:
    """The product's Clock (adapters.clock) reading a test's time; it sleeps for real."""

    def __init__(self, read: Callable[[], datetime]) -> None:
        self._read = read

    def now(self) -> datetime:
        return self._read()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
