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
    etag = await orders_repository.store(order)
    assert await orders_repository.store(order) == etag  # found, not written again
    assert await orders_repository.get(order_key("webshop", "ORD-1")) == order


async def test_another_applications_order_with_the_same_order_id_is_another_document(
    orders_repository: CosmosOrdersRepository,
) -> None:
    mine = make_order("ORD-S")
    theirs = make_order("ORD-S", AppId="partner-portal", ReplyTo="replies-partner-portal")
    await orders_repository.store(mine)
    await orders_repository.store(theirs)  # no conflict
    assert await orders_repository.get(order_key("webshop", "ORD-S")) == mine
    assert await orders_repository.get(order_key("partner-portal", "ORD-S")) == theirs
    with pytest.raises(NotFoundError):
        await orders_repository.get("ORD-S")


async def test_a_redelivery_in_another_canonical_form_is_the_same_order(
    orders_repository: CosmosOrdersRepository,
) -> None:
    etag = await orders_repository.store(make_order("ORD-2"))
    same = make_order(
        "ORD-2",
        Total="25.5",
        Lines=[
            {"Sku": "SKU-1", "Quantity": 2, "UnitPrice": "10"},
            {"Sku": "SKU-2", "Quantity": 1, "UnitPrice": "5.5"},
        ],
    )
    assert await orders_repository.store(same) == etag


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
    await orders_repository.store(original, key)
    change, differing = CHANGES[field]
    different = OrderSubmitted.model_validate(order_payload("ORD-C", **change()))

    with pytest.raises(ConflictError) as caught:
        await orders_repository.store(different, key)
    assert caught.value.fields == differing
    assert await orders_repository.get(key) == original  # never overwritten


async def test_a_stored_version_is_taken_back_and_no_other(
    orders_repository: CosmosOrdersRepository,
) -> None:
    """`store` answers the etag of the document that is the order (created,
    or found the same), and a conflict carries the etag of the one in the
    way; `discard_version` deletes only that version (a conflicting copy
    takes back only what it wrote; the Rejected order only the copy's
    document it met: simulation seeds 3005811 and 963). No read first."""
    key = order_key("webshop", "ORD-D")
    order, changed = make_order("ORD-D"), make_order("ORD-D", Currency="USD")
    theirs = await orders_repository.store(changed)
    assert await orders_repository.store(changed) == theirs  # found the same
    with pytest.raises(ConflictError) as met:
        await orders_repository.store(order)
    assert met.value.version == theirs
    assert await orders_repository.get_version(key) == (changed, theirs)  # a read says the same
    assert await orders_repository.discard_version(key, theirs) is True
    assert await orders_repository.discard_version(key, theirs) is False  # gone: nothing to do
    mine = await orders_repository.store(order)
    assert mine != theirs
    # The copy's late take-back names its own version: the order's stays.
    assert await orders_repository.discard_version(key, theirs) is False
    assert await orders_repository.get(key) == order
    assert await orders_repository.discard_version(key, mine) is True
    with pytest.raises(NotFoundError):
        await orders_repository.get(key)
