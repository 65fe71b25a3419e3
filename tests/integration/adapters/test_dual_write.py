"""Idempotent submit across two stores (DESIGN.md §4): the orders DB and the
state store have no shared transaction. Each write is create-if-absent on
OrderID, so a redelivered message finishes whatever half is missing, and a
crash between the writes loses nothing and duplicates nothing."""

from __future__ import annotations

import pytest
from azure.cosmos.aio import ContainerProxy

from adapters.orders_db import CosmosOrdersRepository
from adapters.state_store import CosmosStateStore
from domain import state_machine as sm
from domain.errors import ConflictError, NotFoundError
from domain.ids import order_key
from domain.models import OrderSubmitted
from tests.integration.adapters.builders import NOW, STEPS, make_order


class Crash(BaseException):
    """The process dies here (BaseException: no handler on the way catches it)."""


async def submit(
    orders: CosmosOrdersRepository,
    store: CosmosStateStore,
    order: OrderSubmitted,
    crash_between_writes: bool = False,
) -> bool:
    """The two writes Submit makes, in its order: whether the record was created."""
    await orders.store(order)
    if crash_between_writes:
        raise Crash
    _, _, record_created = await store.create_if_absent(sm.new_record(order, NOW, STEPS))
    return record_created


async def count(container: ContainerProxy, order_id: str) -> int:
    query = container.query_items(
        "SELECT VALUE COUNT(1) FROM c WHERE c.id = @id",
        parameters=[{"name": "@id", "value": order_id}],
    )
    [n] = [n async for n in query]
    return n


async def test_a_redelivery_completes_a_submit_that_crashed_between_the_writes(
    orders_repository: CosmosOrdersRepository,
    state_store: CosmosStateStore,
    state_container: ContainerProxy,
) -> None:
    order = make_order("ORD-DW")
    with pytest.raises(Crash):
        await submit(orders_repository, state_store, order, crash_between_writes=True)
    assert await orders_repository.get(order_key("webshop", "ORD-DW")) == order
    with pytest.raises(NotFoundError):
        await state_store.read(order_key("webshop", "ORD-DW"))

    # The message is redelivered (its lock expired with the process).
    assert await submit(orders_repository, state_store, order) is True
    # And once more, as Service Bus may: nothing changes.
    assert await submit(orders_repository, state_store, order) is False

    record, _ = await state_store.read(order_key("webshop", "ORD-DW"))
    assert record == sm.new_record(order, NOW, STEPS)
    assert record.OrderDigest == order.digest()
    orders_container = orders_repository._container
    assert await count(orders_container, order_key("webshop", "ORD-DW")) == 1
    assert await count(state_container, order_key("webshop", "ORD-DW")) == 1


async def test_a_conflicting_redelivery_after_a_crash_writes_no_record(
    orders_repository: CosmosOrdersRepository, state_store: CosmosStateStore
) -> None:
    with pytest.raises(Crash):
        await submit(
            orders_repository, state_store, make_order("ORD-DX"), crash_between_writes=True
        )
    different = make_order("ORD-DX", Currency="USD")
    with pytest.raises(ConflictError) as caught:
        await submit(orders_repository, state_store, different)
    assert caught.value.fields == ["Currency"]
    with pytest.raises(NotFoundError):
        await state_store.read(order_key("webshop", "ORD-DX"))
