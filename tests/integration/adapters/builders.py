"""Orders and state records for the adapter tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from domain import state_machine as sm
from domain.models import OrderState, OrderSubmitted
from domain.steps import DEFAULT_CATALOG
from tests.builders import order_payload

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
STEPS = list(DEFAULT_CATALOG.names)  # domain/steps.json
POLICY = sm.RetryPolicy(
    threshold=3, long_retries=1, long_delay=timedelta(hours=1), claim_timeout=timedelta(seconds=60)
)


def make_order(order_id: str = "ORD-1", **overrides: Any) -> OrderSubmitted:
    return OrderSubmitted.model_validate(order_payload(order_id, **overrides))


def make_record(order_id: str = "ORD-1", now: datetime = NOW) -> OrderState:
    # Keyed by `order_id` as given: the store keeps whatever key it is given
    # (Submit alone builds keys, domain.ids.order_key).
    return sm.new_record(make_order(order_id), now, STEPS, key=order_id)


def processing_record(order_id: str, complete_by: datetime, now: datetime = NOW) -> OrderState:
    """A claimed record whose attempt must finish by `complete_by`."""
    claimed = sm.claim(make_record(order_id, now), now, POLICY)
    return claimed.model_copy(update={"CompleteBy": complete_by})
