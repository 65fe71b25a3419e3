"""CosmosOrdersRepository: create-if-absent on OrderID, and a conflict naming
every immutable field that differs when a different order reuses an id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from adapters.orders_db import CosmosOrdersRepository
from domain.errors import ConflictError, NotFoundError
from domain.ids import order_key
from domain.models import OrderSubmitted
from tests.integration.adapters.builders import make_order, order_payload


async def test_an_order_is_stored_once_and_read_back(
    orders_repository: CosmosOrdersRepository,
) -> None:
    order = make_order("ORD-1")
    assert await orders_repository.create_if_absent(order) is True
    assert await orders_repository.create_if_absent(order) is False
    assert await orders_repository.get(order_key("webshop", "ORD-1")) == order


async def test_another_applications_order_with_the_same_order_id_is_another_document(
    orders_repository: CosmosOrdersRepository,
) -> None:
    mine = make_order("ORD-S")
    theirs = make_order("ORD-S", AppId="partner-portal", ReplyTo="replies-partner-portal")
    assert await orders_repository.create_if_absent(mine) is True
    assert await orders_repository.create_if_absent(theirs) is True  # no conflict
    assert await orders_repository.get(order_key("webshop", "ORD-S")) == mine
    assert await orders_repository.get(order_key("partner-portal", "ORD-S")) == theirs
    with pytest.raises(NotFoundError):
        await orders_repository.get("ORD-S")


async def test_a_redelivery_in_another_canonical_form_is_the_same_order(
    orders_repository: CosmosOrdersRepository,
) -> None:
    await orders_repository.create_if_absent(make_order("ORD-2"))
    same = make_order(
        "ORD-2",
        Total="25.5",
        Lines=[
            {"Sku": "SKU-1", "Quantity": 2, "UnitPrice": "10"},
            {"Sku": "SKU-2", "Quantity": 1, "UnitPrice": "5.5"},
        ],
    )
    assert await orders_repository.create_if_absent(same) is False


async def test_get_of_a_missing_order_is_not_found(
    orders_repository: CosmosOrdersRepository,
) -> None:
    with pytest.raises(NotFoundError):
        await orders_repository.get("NOPE-1")


def _lines(price: str) -> dict[str, Any]:
    return {
        "Lines": [
            {"Sku": "SKU-1", "Quantity": 2, "UnitPrice": price},
            {"Sku": "SKU-2", "Quantity": 1, "UnitPrice": "5.50"},
        ],
        "Total": f"{2 * float(price) + 5.5:.2f}",
    }


# One change per immutable field; the fields a change touches (Lines and Total
# are tied by a validator, so changing one changes the other).
CHANGES: dict[str, tuple[Callable[[], dict[str, Any]], list[str]]] = {
    "AppId": (lambda: {"AppId": "partner-portal"}, ["AppId"]),
    "ReplyTo": (lambda: {"ReplyTo": "replies-other"}, ["ReplyTo"]),
    "Customer": (lambda: {"Customer": {"CustomerId": "C-8", "Name": "Ada"}}, ["Customer"]),
    "Lines": (
        lambda: {
            "Lines": [
                {"Sku": "SKU-1", "Quantity": 2, "UnitPrice": "10.00"},
                {"Sku": "SKU-3", "Quantity": 1, "UnitPrice": "5.50"},
            ]
        },
        ["Lines"],
    ),
    "Total": (lambda: _lines("11.00"), ["Lines", "Total"]),
    "Currency": (lambda: {"Currency": "USD"}, ["Currency"]),
    "PaymentReference": (lambda: {"PaymentReference": "pay-ref-43"}, ["PaymentReference"]),
}
# OrderID names the order (another id is another order); SchemaVersion is a
# Literal with one value today.
NOT_CHANGEABLE = {"OrderID", "SchemaVersion"}


def test_every_immutable_field_has_a_conflict_case() -> None:
    assert set(CHANGES) | NOT_CHANGEABLE == set(OrderSubmitted.model_fields)


@pytest.mark.parametrize("field", sorted(CHANGES))
async def test_a_different_order_under_an_existing_id_is_a_conflict_naming_the_field(
    field: str, orders_repository: CosmosOrdersRepository
) -> None:
    # Both under one key (Submit gives an order its own application's key, so
    # an AppId change there is another order: the test above).
    key = order_key("webshop", "ORD-C")
    original = make_order("ORD-C")
    await orders_repository.create_if_absent(original, key)
    change, differing = CHANGES[field]
    different = OrderSubmitted.model_validate(order_payload("ORD-C", **change()))

    with pytest.raises(ConflictError) as caught:
        await orders_repository.create_if_absent(different, key)
    assert caught.value.fields == differing
    assert await orders_repository.get(key) == original  # never overwritten


async def test_taking_back_a_document_deletes_only_the_order_named(
    orders_repository: CosmosOrdersRepository,
) -> None:
    """discard_own deletes the document only when it is that order (a
    conflicting copy takes back its own write); discard_other only when it
    is not (the Rejected order clears a copy's document in its way:
    simulation seed 3005811). Neither minds a missing document."""
    key = order_key("webshop", "ORD-D")
    order, changed = make_order("ORD-D"), make_order("ORD-D", Currency="USD")
    await orders_repository.create_if_absent(changed)
    await orders_repository.discard_own(key, order)
    await orders_repository.discard_other(key, changed)
    assert await orders_repository.get(key) == changed  # not theirs to take
    await orders_repository.discard_other(key, order)
    with pytest.raises(NotFoundError):
        await orders_repository.get(key)
    await orders_repository.create_if_absent(order)
    await orders_repository.discard_own(key, order)
    with pytest.raises(NotFoundError):
        await orders_repository.get(key)
    await orders_repository.discard_own(key, order)  # gone already: nothing to do
    await orders_repository.discard_other(key, order)


async def test_taking_back_a_document_replaced_since_its_read_leaves_the_new_one(
    orders_repository: CosmosOrdersRepository,
) -> None:
    """The delete is conditional on the version read: when another delivery
    swapped the document between the read and the delete (the copy's taken
    back, the order's own written), the order's stays and the caller is told
    to look again."""
    from domain.errors import TransientError

    key = order_key("webshop", "ORD-R")
    order, changed = make_order("ORD-R"), make_order("ORD-R", Currency="USD")
    await orders_repository.create_if_absent(changed)
    real = orders_repository._container

    class SwapBeforeDelete:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        async def delete_item(self, **kwargs: Any) -> Any:
            await real.delete_item(item=key, partition_key=key)  # the racing delivery
            await real.create_item(body={"id": key, **order.model_dump(mode="json")})
            return await real.delete_item(**kwargs)

    orders_repository._container = SwapBeforeDelete()  # type: ignore[assignment]
    try:
        with pytest.raises(TransientError, match="changed while it was being taken back"):
            await orders_repository.discard_own(key, changed)
    finally:
        orders_repository._container = real
    assert await orders_repository.get(key) == order
