"""The timer Starter's claim on the real Cosmos server: it reads the order
from the orders DB once, after the claim is won, and starts the attempt with
the step payload in its input, so no activity of the attempt reads the order
(issue 44). A claim it loses reads nothing."""

from __future__ import annotations

import pytest

from domain import state_machine as sm
from domain.ids import order_key
from orchestrators.contracts import AttemptStart, step_payload
from orchestrators.starter import Starter
from tests.builders import ReadClock
from tests.integration.adapters.builders import NOW, STEPS, make_order
from tests.unit.orchestrators.driver import SETTINGS, StartingClient

pytestmark = pytest.mark.timeout(120)


class _CountedReads:
    """The real orders repository, its reads counted."""

    def __init__(self, orders) -> None:
        self._orders, self.reads = orders, 0

    async def get(self, key):
        self.reads += 1
        return await self._orders.get(key)


async def test_a_timer_claim_starts_its_attempt_with_the_payload_read_once(
    state_store, orders_repository
):
    order = make_order("PAYLOAD-1")
    key = order_key(order.AppId, order.OrderID)
    await orders_repository.store(order)
    record, etag, _ = await state_store.create_if_absent(sm.new_record(order, NOW, STEPS, key))
    orders = _CountedReads(orders_repository)
    starter = Starter(SETTINGS, state_store, clock=ReadClock(lambda: NOW), orders=orders)
    client = StartingClient()

    instance_id = await starter.claim_and_start(client, record, etag)

    assert instance_id == f"{key}:1"
    given = AttemptStart.of_instance(client.started[instance_id], instance_id)
    assert given.Payload == step_payload(order)
    assert given.Plan is not None
    assert [s.Name for s in given.Plan.Steps] == list(STEPS)
    assert orders.reads == 1
    # The same record as read before the claim: the etag race is lost, nothing read.
    assert await starter.claim_and_start(StartingClient(), record, etag) is None
    assert orders.reads == 1
