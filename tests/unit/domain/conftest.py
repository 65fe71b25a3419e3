"""Builders for domain tests: a valid order, and records in each state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from domain import state_machine as sm
from domain.models import OrderSubmitted
from domain.steps import DEFAULT_CATALOG
from tests.builders import order_payload

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
STEPS = list(DEFAULT_CATALOG.names)  # domain/steps.json


@pytest.fixture
def order() -> OrderSubmitted:
    return OrderSubmitted.model_validate(order_payload())


@pytest.fixture
def policy() -> sm.RetryPolicy:
    return sm.RetryPolicy(
        threshold=3,
        long_retries=1,
        long_delay=timedelta(hours=1),
        claim_timeout=timedelta(seconds=60),
    )


@pytest.fixture
def pending(order):
    return sm.new_record(order, NOW, STEPS)


@pytest.fixture
def processing(pending, policy):
    return sm.claim(pending, NOW, policy)
