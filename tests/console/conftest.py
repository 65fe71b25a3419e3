"""Console tests: records built through the domain's own transitions, stored
in the real Cosmos server (tests/fixtures/cosmos.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from adapters.console_reads import ConsoleReads
from adapters.settings import CosmosAccount, ServiceBusAccess, Settings
from console.views import Deps
from domain import state_machine as sm
from domain.ids import attempt_instance_id
from domain.models import OrderState, OrderSubmitted
from domain.steps import DEFAULT_CATALOG
from tests.builders import order_payload, start_step

STEPS = list(DEFAULT_CATALOG.names)  # domain/steps.json
POLICY = sm.RetryPolicy(
    threshold=2,
    long_retries=1,
    long_delay=timedelta(minutes=5),
    claim_timeout=timedelta(seconds=60),
)


def order(order_id: str, app: str = "webshop") -> OrderSubmitted:
    return OrderSubmitted.model_validate(
        order_payload(order_id, AppId=app, ReplyTo=f"replies-{app}")
    )


def pending(order_id: str, now: datetime, app: str = "webshop") -> OrderState:
    # Keyed by `order_id` as given: the console reads keys from records and
    # routes, in either form (domain.ids), and never builds one.
    return sm.new_record(order(order_id, app), now, STEPS, key=order_id)


def processing(order_id: str, now: datetime, app: str = "webshop") -> OrderState:
    return sm.claim(pending(order_id, now, app), now, POLICY)


def processed(order_id: str, now: datetime, app: str = "webshop") -> OrderState:
    record = processing(order_id, now, app)
    owner = record.LockedBy
    for step in STEPS:
        record = start_step(record, step, now, now + timedelta(seconds=30))
        record = sm.complete_step(record, owner, step, now)
    return sm.mark_processed(record, owner, now)


def errored_by_supervisor(order_id: str, now: datetime) -> OrderState:
    """Two attempts that both missed their deadline, then Error (threshold 2)."""
    record = pending(order_id, now)
    t = now
    for _ in range(POLICY.max_failures):
        record = sm.claim(record, t, POLICY)
        t = record.CompleteBy + timedelta(seconds=1)
        record = sm.recover_expired(record, record.LockedBy, t, POLICY)
        if record.NotBefore:
            t = record.NotBefore
    return record


def settings() -> Settings:
    return Settings(
        state_account=CosmosAccount("https://127.0.0.1:1/", "k", verify_tls=False),
        orders_account=CosmosAccount("https://127.0.0.1:1/", "k", verify_tls=False),
        servicebus=ServiceBusAccess(connection_string=None),
        reply_queues={"webshop": "replies-webshop", "partner-portal": "replies-partner-portal"},
        retry=POLICY,
    )


@pytest.fixture
def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class NoMessages:
    """A QueuePeeker over queues that are all empty: for the pages' store reads."""

    async def peek(self, *_args: Any, **_kw: Any) -> list[Any]:
        return []

    async def count(self, *_args: Any, **_kw: Any) -> tuple[int, bool]:
        return 0, False


@pytest.fixture
def deps(state_store, state_container, request_charges, orders_repository, now) -> Deps:
    return Deps(
        settings=settings(),
        store=state_store,
        reads=ConsoleReads(state_container, request_charges),
        orders=orders_repository,
        servicebus=cast(Any, NoMessages()),
        now=now,
    )


def instance(order_id: str, attempt: int) -> str:
    return attempt_instance_id(order_id, attempt)
