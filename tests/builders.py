"""Orders for tests: one valid order payload, overridable field by field."""

from __future__ import annotations

from typing import Any


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
