"""Building orders to post: from a JSON file, or generated N at a time."""

from __future__ import annotations

import json
import random
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

from domain.models import OrderSubmitted


def generate(
    app_id: str, reply_to: str, count: int, prefix: str | None = None, seed: int | None = None
):
    rng = random.Random(seed)
    prefix = prefix or f"ORD-{uuid.uuid4().hex[:6]}"
    for i in range(count):
        lines: list[dict[str, Any]] = [
            {
                "Sku": f"SKU-{rng.randint(1, 50):03d}",
                "Quantity": rng.randint(1, 3),
                "UnitPrice": f"{rng.randint(100, 9999) / 100:.2f}",
            }
            for _ in range(rng.randint(1, 3))
        ]
        total = sum(Decimal(line["UnitPrice"]) * line["Quantity"] for line in lines)
        yield OrderSubmitted.model_validate(
            {
                "OrderID": f"{prefix}-{i:05d}",
                "AppId": app_id,
                "ReplyTo": reply_to,
                "Customer": {"CustomerId": f"C-{rng.randint(1, 500)}"},
                "Lines": lines,
                "Total": f"{total:.2f}",
                "Currency": "EUR",
                "PaymentReference": f"pay-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}",
            }
        )


def from_file(path: Path) -> list[dict]:
    """A JSON object or a list of them; validated when sent (an invalid one is
    sent anyway when asked, to exercise the dead-letter path)."""
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else [data]
