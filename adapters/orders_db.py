"""The orders DB: the order as submitted, one document per OrderID.

Written once by Submit with create-if-absent; a redelivered message finds its
order already there and checks that it is the same order (every field of an
order is immutable). A different order under an existing OrderID is a
ConflictError naming the fields that differ: Submit dead-letters and alerts,
and nothing is overwritten (docs/design.md §4, invariant 4).

It lives in its own database, and in its own account when `OrdersDbConnection`
is configured (adapters.settings): the order data has its own owner and
classification, and the state store must not depend on it."""

from __future__ import annotations

from typing import Any

from azure.cosmos.aio import ContainerProxy
from pydantic import ValidationError

from adapters.cosmos_client import SDK_ERRORS, RequestCharges, translate_error
from adapters.state_store import strip_system
from domain.errors import ConflictError, NotFoundError, PermanentError
from domain.models import OrderSubmitted


def to_document(order: OrderSubmitted) -> dict[str, Any]:
    return {"id": order.OrderID, **order.model_dump(mode="json")}


def from_document(doc: dict[str, Any]) -> OrderSubmitted:
    body = strip_system(doc)
    body.pop("id", None)
    try:
        return OrderSubmitted.model_validate(body)
    except ValidationError as exc:
        raise PermanentError(
            f"stored order {doc.get('id')!r} does not match OrderSubmitted: {exc}"
        ) from exc


def differing_fields(stored: OrderSubmitted, submitted: OrderSubmitted) -> list[str]:
    """Top-level field names whose canonical values differ, in model order."""
    old, new = stored.immutable_fields(), submitted.immutable_fields()
    return [name for name in OrderSubmitted.model_fields if old.get(name) != new.get(name)]


class CosmosOrdersRepository:
    """Orders as submitted (container partitioned by /id = OrderID)."""

    def __init__(self, container: ContainerProxy, charges: RequestCharges | None = None) -> None:
        self._container = container
        self.charges = charges if charges is not None else RequestCharges()

    async def create_if_absent(self, order: OrderSubmitted) -> bool:
        """True if this call stored the order, False if the same order was
        already there; ConflictError(fields=[...]) if a different one was."""
        try:
            await self._container.create_item(
                body=to_document(order), response_hook=self.charges.hook("order_create")
            )
            return True
        except SDK_ERRORS as exc:
            error = translate_error(
                exc, f"create order {order.OrderID}", self.charges, "order_create"
            )
            if not isinstance(error, ConflictError):
                raise error from exc
        stored = await self.get(order.OrderID)
        fields = differing_fields(stored, order)
        if fields:
            raise ConflictError(
                f"order {order.OrderID} exists with different {', '.join(fields)}", fields=fields
            )
        return False

    async def discard(self, order_id: str) -> None:
        """Delete the order if it is there. Only for an order whose state
        record is Rejected: Submit writes the orders DB before it learns that
        (it does not read first), and a rejected order must not stay."""
        try:
            await self._container.delete_item(
                item=order_id,
                partition_key=order_id,
                response_hook=self.charges.hook("order_delete"),
            )
        except SDK_ERRORS as exc:
            error = translate_error(exc, f"delete order {order_id}", self.charges, "order_delete")
            if not isinstance(error, NotFoundError):
                raise error from exc

    async def get(self, order_id: str) -> OrderSubmitted:
        """The stored order; NotFoundError if there is none."""
        try:
            doc = await self._container.read_item(
                item=order_id, partition_key=order_id, response_hook=self.charges.hook("order_read")
            )
        except SDK_ERRORS as exc:
            raise translate_error(
                exc, f"read order {order_id}", self.charges, "order_read"
            ) from exc
        return from_document(doc)
