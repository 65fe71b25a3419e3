"""Orders and state records for the adapter tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from domain import state_machine as sm
from domain.models import OrderState, OrderSubmitted

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
STEPS = ["reserve-inventory", "charge-payment", "arrange-shipment"]
POLICY = sm.RetryPolicy(
    threshold=3, long_retries=1, long_delay=timedelta(hours=1), claim_timeout=timedelta(seconds=60)
)


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


def make_order(order_id: str = "ORD-1", **overrides: Any) -> OrderSubmitted:
    return OrderSubmitted.model_validate(order_payload(order_id, **overrides))


def make_record(order_id: str = "ORD-1", now: datetime = NOW) -> OrderState:
    return sm.new_record(make_order(order_id), now, STEPS)


def processing_record(order_id: str, complete_by: datetime, now: datetime = NOW) -> OrderState:
    """A claimed record whose attempt must finish by `complete_by`."""
    claimed = sm.claim(make_record(order_id, now), now, POLICY)
    return claimed.model_copy(update={"CompleteBy": complete_by})
