"""The orders DB: the order as submitted, one document per order key
(docs/adr/017f-order-keys.md), written once by Submit. A different order
under an existing key is a ConflictError naming the fields that differ, and
nothing is overwritten (docs/design.md §4, invariant 4). Its own database, in
its own account when `OrdersDbConnection` is set: the order data has its own
owner and classification."""

from __future__ import annotations

from typing import Any

from azure.core import MatchConditions
from azure.cosmos.aio import ContainerProxy
from pydantic import ValidationError

from adapters.cosmos_client import SDK_ERRORS, RequestCharges, query_all, translate_error
from adapters.state_store import strip_system
from domain.errors import ConflictError, NotFoundError, PermanentError, StaleError, TransientError
from domain.ids import check_order_key, order_key
from domain.models import OrderSubmitted


def to_document(order: OrderSubmitted, key: str | None = None) -> dict[str, Any]:
    """The document of `order` under `key` (its own application's key unless given)."""
    key = check_order_key(key) if key is not None else order_key(order.AppId, order.OrderID)
    return {"id": key, **order.model_dump(mode="json")}


def from_document(doc: dict[str, Any]) -> OrderSubmitted:
    body = strip_system(doc)
    body.pop("id", None)
    try:
        return OrderSubmitted.model_validate(body)
    except ValidationError as exc:
        raise PermanentError(
            f"stored order {doc.get('id')!r} does not match OrderSubmitted: {exc}"
        ) from exc


class CosmosOrdersRepository:
    """Orders as submitted (container partitioned by /id = the order key)."""

    def __init__(self, container: ContainerProxy, charges: RequestCharges | None = None) -> None:
        self._container = container
        self.charges = charges if charges is not None else RequestCharges()

    async def store(self, order: OrderSubmitted, key: str | None = None) -> str:
        """Store the order under `key` (its own application's key unless given)
        unless the same order is already there, answering the etag of the
        document that is this order, for a later `discard_version`; a
        different order there is a ConflictError(fields=[...]) carrying its etag."""
        doc = to_document(order, key)
        key = doc["id"]
        try:
            created = await self._container.create_item(
                body=doc, response_hook=self.charges.hook("order_create")
            )
            return str(created.get("_etag", ""))
        except SDK_ERRORS as exc:
            error = translate_error(exc, f"create order {key}", self.charges, "order_create")
            if not isinstance(error, ConflictError):
                raise error from exc
        try:
            found = await self._read(key)
        except NotFoundError as exc:
            # The 409 says it exists: a lagging replica, or a racing discard.
            raise TransientError(
                f"order {key}: the create conflicted but a read did not find it; try again"
            ) from exc
        stored, etag = from_document(found), str(found.get("_etag", ""))
        fields = stored.differing_fields(order)
        if fields:
            raise ConflictError(
                f"order {key} exists with different {', '.join(fields)}",
                fields=fields,
                version=etag,
            )
        return etag

    async def discard(self, key: str) -> None:
        """Delete the order if it is there (only for an order whose record is Rejected)."""
        try:
            await self._container.delete_item(
                item=key,
                partition_key=key,
                response_hook=self.charges.hook("order_delete"),
            )
        except SDK_ERRORS as exc:
            error = translate_error(exc, f"delete order {key}", self.charges, "order_delete")
            if not isinstance(error, NotFoundError):
                raise error from exc

    async def discard_version(self, key: str, version: str) -> bool:
        """Delete the document under `key` if it is still at etag `version`:
        True if this call deleted it. No read first: a lagging replica would
        answer 404 for a document that is there."""
        try:
            await self._container.delete_item(
                item=key,
                partition_key=key,
                etag=version,
                match_condition=MatchConditions.IfNotModified,
                response_hook=self.charges.hook("order_delete"),
            )
        except SDK_ERRORS as exc:
            error = translate_error(exc, f"delete order {key}", self.charges, "order_delete")
            if isinstance(error, NotFoundError | StaleError):
                return False
            raise error from exc
        return True

    async def keys_of_customer(self, customer_id: str, limit: int = 200) -> list[str]:
        """The keys of up to `limit` orders of one customer (the console's
        search by customer). One cross-partition query of the ids only."""
        query = "SELECT TOP @max VALUE c.id FROM c WHERE c.Customer.CustomerId = @customer"
        params: list[dict[str, Any]] = [
            {"name": "@max", "value": limit},
            {"name": "@customer", "value": customer_id},
        ]
        found = await query_all(
            self._container, query, params, limit, self.charges, "console_customer"
        )
        return [k for k in found if isinstance(k, str)]

    async def get(self, key: str) -> OrderSubmitted:
        """The order stored under `key`; NotFoundError if there is none."""
        return from_document(await self._read(key))

    async def get_version(self, key: str) -> tuple[OrderSubmitted, str]:
        """The order stored under `key` and its etag, for a later
        `discard_version`; NotFoundError if there is none."""
        doc = await self._read(key)
        return from_document(doc), str(doc.get("_etag", ""))

    async def _read(self, key: str) -> dict[str, Any]:
        try:
            return await self._container.read_item(
                item=key, partition_key=key, response_hook=self.charges.hook("order_read")
            )
        except SDK_ERRORS as exc:
            raise translate_error(exc, f"read order {key}", self.charges, "order_read") from exc
