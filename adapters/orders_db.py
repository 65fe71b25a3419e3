"""The orders DB: the order as submitted, one document per order key
(domain.ids.order_key: the application and its OrderID, so two applications'
orders with one OrderID are two documents; a document written before keys
named the application is keyed by the bare OrderID: docs/adr/017f-order-keys.md).

Written once by Submit with create-if-absent; a redelivered message finds its
order already there and checks that it is the same order (every field of an
order is immutable). A different order under an existing key (the same
application reusing an OrderID) is a ConflictError naming the fields that
differ: Submit dead-letters and alerts, and nothing is overwritten
(docs/design.md §4, invariant 4).

It lives in its own database, and in its own account when `OrdersDbConnection`
is configured (adapters.settings): the order data has its own owner and
classification, and the state store must not depend on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from azure.core import MatchConditions
from azure.cosmos.aio import ContainerProxy
from pydantic import ValidationError

from adapters.cosmos_client import SDK_ERRORS, RequestCharges, translate_error
from adapters.state_store import strip_system
from domain.errors import (
    ConflictError,
    NotFoundError,
    PermanentError,
    StaleError,
    TransientError,
)
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


def differing_fields(stored: OrderSubmitted, submitted: OrderSubmitted) -> list[str]:
    """Top-level field names whose canonical values differ, in model order."""
    old, new = stored.immutable_fields(), submitted.immutable_fields()
    return [name for name in OrderSubmitted.model_fields if old.get(name) != new.get(name)]


class CosmosOrdersRepository:
    """Orders as submitted (container partitioned by /id = the order key)."""

    def __init__(self, container: ContainerProxy, charges: RequestCharges | None = None) -> None:
        self._container = container
        self.charges = charges if charges is not None else RequestCharges()

    async def create_if_absent(self, order: OrderSubmitted, key: str | None = None) -> bool:
        """True if this call stored the order under `key` (its own
        application's key unless given), False if the same order was already
        there; ConflictError(fields=[...]) if a different one was."""
        doc = to_document(order, key)
        key = doc["id"]
        try:
            await self._container.create_item(
                body=doc, response_hook=self.charges.hook("order_create")
            )
            return True
        except SDK_ERRORS as exc:
            error = translate_error(exc, f"create order {key}", self.charges, "order_create")
            if not isinstance(error, ConflictError):
                raise error from exc
        try:
            stored = await self.get(key)
        except NotFoundError as exc:
            # It exists (the 409 says so) but this read did not find it: a
            # replica that has not seen the create yet, or a discard racing
            # this delivery. Either way the next try knows more (the
            # simulation's `new_document_lag` found it, seed 202 of 1-400).
            raise TransientError(
                f"order {key}: the create conflicted but a read did not find it; try again"
            ) from exc
        fields = differing_fields(stored, order)
        if fields:
            raise ConflictError(
                f"order {key} exists with different {', '.join(fields)}", fields=fields
            )
        return False

    async def discard(self, key: str) -> None:
        """Delete the order if it is there. Only for an order whose state
        record is Rejected: Submit writes the orders DB before it learns that
        (it does not read first), and a rejected order must not stay."""
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

    async def discard_own(self, key: str, order: OrderSubmitted) -> None:
        """Delete the document under `key` if it is `order` (a copy whose
        record turned out Rejected takes back what it wrote, and only that:
        the document may since be another's)."""
        await self._discard_if(key, lambda stored: stored is not None and _same(stored, order))

    async def discard_other(self, key: str, order: OrderSubmitted) -> None:
        """Delete the document under `key` unless it is `order`: for the order
        whose state record is Rejected (so no document is its order's), when
        a conflicting copy's document is in its way and that copy's delivery
        may have died before taking it back (simulation seed 3005811)."""
        await self._discard_if(key, lambda stored: stored is None or not _same(stored, order))

    async def _discard_if(self, key: str, wanted: Callable[[OrderSubmitted | None], bool]) -> None:
        """Delete the version read, if `wanted` says so (None: unreadable),
        on its etag: a document put there since the read stays, and the
        caller hears TransientError to look again."""
        try:
            doc = await self._container.read_item(
                item=key, partition_key=key, response_hook=self.charges.hook("order_read")
            )
        except SDK_ERRORS as exc:
            error = translate_error(exc, f"read order {key}", self.charges, "order_read")
            if isinstance(error, NotFoundError):
                return
            raise error from exc
        try:
            stored: OrderSubmitted | None = from_document(doc)
        except PermanentError:
            stored = None
        if not wanted(stored):
            return
        try:
            await self._container.delete_item(
                item=key,
                partition_key=key,
                etag=doc.get("_etag"),
                match_condition=MatchConditions.IfNotModified,
                response_hook=self.charges.hook("order_delete"),
            )
        except SDK_ERRORS as exc:
            error = translate_error(exc, f"delete order {key}", self.charges, "order_delete")
            if isinstance(error, NotFoundError):
                return
            if isinstance(error, StaleError):
                raise TransientError(
                    f"order {key} changed while it was being taken back; try again"
                ) from exc
            raise error from exc

    async def get(self, key: str) -> OrderSubmitted:
        """The order stored under `key`; NotFoundError if there is none."""
        try:
            doc = await self._container.read_item(
                item=key, partition_key=key, response_hook=self.charges.hook("order_read")
            )
        except SDK_ERRORS as exc:
            raise translate_error(exc, f"read order {key}", self.charges, "order_read") from exc
        return from_document(doc)


def _same(stored: OrderSubmitted, order: OrderSubmitted) -> bool:
    return not differing_fields(stored, order)
