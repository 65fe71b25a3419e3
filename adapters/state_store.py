"""The state store: the Cosmos container `orderState` (docs/design.md §3), one
document per order (partition key /id, the order key). Every write is
conditional (etag, and the `LockedBy` guard); the transitions are
domain.state_machine's. Scans page by keyset: docs/adr/006-keyset-paging.md."""

from __future__ import annotations

import base64
import binascii
import enum
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal

from azure.core import MatchConditions
from azure.cosmos.aio import ContainerProxy
from pydantic import ValidationError

from adapters.cosmos_client import SDK_ERRORS, RequestCharges, query_all, translate_error
from adapters.ports import ANY_OWNER, AnyOwner, BacklogGauge
from domain.admission import RATE_WINDOW, Admission, Lease
from domain.errors import (
    ConflictError,
    NotFoundError,
    PermanentError,
    StaleError,
    TransientError,
)
from domain.models import OrderState, ProcessState
from domain.state_machine import IllegalTransition, RetryPolicy, claim_marking, is_claimable

log = logging.getLogger(__name__)

SYSTEM_PROPERTIES: Final = frozenset({"_rid", "_self", "_etag", "_attachments", "_ts", "_lsn"})
BACKLOG_GAUGE_ID: Final = "_backlog"
ADMISSION_ID: Final = "_admission"
IF_MATCH: Final = MatchConditions.IfNotModified  # domain.admission's document, beside the gauge
DEFAULT_UPDATE_ATTEMPTS: Final = 5


ExpectedLock = str | None | Literal[AnyOwner.ANY]  # ANY_OWNER: the etag guard alone


# --- serialisation --------------------------------------------------------------------


def cosmos_time(value: datetime) -> str:
    """Fixed-width UTC (`2026-11-30T08:00:00.000000Z`), so that string order is
    time order (ADR 006); pydantic's JSON form drops a zero fraction and keeps offsets."""
    if value.tzinfo is None:
        raise ValueError("naive datetimes are not stored; use timezone-aware UTC")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return cosmos_time(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


# Written even at their default: a missing field is not null to Cosmos DB
# (IS_NULL(c.LockedBy) would miss it). The other queried fields are compared
# only with values their default never equals, or tested with IS_DEFINED.
_ALWAYS_WRITTEN: Final = ("id", "SchemaVersion", "ProcessState", "LockedBy")


def to_document(record: OrderState) -> dict[str, Any]:
    """The record as stored: every field but those at their default, which
    reading restores, and _ALWAYS_WRITTEN always (every stored byte is paid
    twice by each replace: docs/adr/020b-workflow-2-3.md)."""
    doc = _jsonable(record.model_dump(mode="python", exclude_defaults=True))
    for name in _ALWAYS_WRITTEN:
        doc.setdefault(name, _jsonable(getattr(record, name)))
    if doc.get("ttl") is None:
        doc.pop("ttl", None)  # absent = container default (never expire)
    return doc


def strip_system(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in SYSTEM_PROPERTIES}


def from_document(doc: Mapping[str, Any]) -> OrderState:
    try:
        return OrderState.model_validate(strip_system(doc))
    except ValidationError as exc:
        raise PermanentError(
            f"state record {doc.get('id')!r} does not match OrderState: {exc}"
        ) from exc


def _etag_of(doc: Mapping[str, Any] | None, headers: Mapping[str, Any] | None = None) -> str:
    etag = (doc or {}).get("_etag") or (headers or {}).get("etag")
    if not etag:
        raise PermanentError("Cosmos DB returned no etag")
    return str(etag)


def encode_cursor(complete_by: str, order_id: str) -> str:
    raw = json.dumps({"v": 1, "cb": complete_by, "id": order_id}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(token: str) -> tuple[str, str]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if data.get("v") != 1 or not isinstance(data["cb"], str) or not isinstance(data["id"], str):
            raise ValueError("unknown cursor version")
        return data["cb"], data["id"]
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise PermanentError(f"invalid continuation token: {exc}") from exc


# --- queries --------------------------------------------------------------------------

_PENDING_QUERY: Final = (
    "SELECT TOP @max * FROM c WHERE c.ProcessState = @pending AND IS_NULL(c.LockedBy)"
    " AND (NOT IS_DEFINED(c.NotBefore) OR IS_NULL(c.NotBefore) OR c.NotBefore <= @now)"
)
_EXPIRED_FILTER: Final = (
    "c.ProcessState = @processing AND c.CompleteBy >= @start AND c.CompleteBy < @now"
)
_EXPIRED_ORDER: Final = " ORDER BY c.ProcessState ASC, c.CompleteBy ASC, c.id ASC"
_EXPIRED_FIRST: Final = f"SELECT TOP @max * FROM c WHERE {_EXPIRED_FILTER}{_EXPIRED_ORDER}"
_EXPIRED_AFTER: Final = (
    f"SELECT TOP @max * FROM c WHERE {_EXPIRED_FILTER}"
    " AND (c.CompleteBy > @after_cb OR (c.CompleteBy = @after_cb AND c.id > @after_id))"
    f"{_EXPIRED_ORDER}"
)
# A COUNT reads no document, so it cannot skip the invalid ones as `_valid`
# does: it counts only documents with two fields every record has, both in
# the indexing policy (STATE_QUERIED_PATHS) with a value per app, not per
# record, so the filter is an index scan of a few values. A field outside the
# policy, or one with a value per record, would cost a load of each document
# or a scan that grows with the backlog. A foreign document left Processing
# (a portal edit, garbage) is never recovered, and counted it would hold an
# admission slot for good.
_COUNT_QUERY: Final = (
    "SELECT VALUE COUNT(1) FROM c WHERE c.ProcessState = @state"
    " AND IS_DEFINED(c.AppId) AND IS_DEFINED(c.ReplyTo)"
)
_IN_STATE_QUERY: Final = "SELECT TOP @max * FROM c WHERE c.ProcessState = @state"
_IN_STATE_AFTER_QUERY: Final = (
    "SELECT TOP @max * FROM c WHERE c.ProcessState = @state AND c.id > @after ORDER BY c.id ASC"
)
_UNSENT_STATUS_FILTER: Final = (
    "SELECT TOP @max * FROM c WHERE IS_DEFINED(c.PendingStatus) AND NOT IS_NULL(c.PendingStatus)"
    " AND c.PendingStatus.At < @before"
)
# An entry whose status is sent, its alert alone left, has PendingStatus.Sent true.
_STATUS_NOT_SENT: Final = (
    " AND (NOT IS_DEFINED(c.PendingStatus.Sent) OR c.PendingStatus.Sent = false)"
)
# Oldest entry first, so that every entry's turn comes.
_UNSENT_STATUS_ORDER: Final = " ORDER BY c.PendingStatus.At ASC"
MAX_SKIPPED_QUEUES: Final = 20
"""At most this many reply queues are left out by the outbox query itself
(one parameter each); callers skip any others client-side."""
_COMPENSATION_QUERY: Final = (
    "SELECT TOP @max * FROM c WHERE c.CompensationRequested = true"
    " AND (c.ProcessState = @error OR c.ProcessState = @failed)"
)


def _valid(
    docs: list[dict[str, Any]], unreadable: list[tuple[str, str]] | None = None
) -> list[tuple[OrderState, str]]:
    """Records and etags of a query's documents. One that is not a valid
    record is logged, named in `unreadable` (the callers alert) and left out,
    so one bad document cannot stop every run."""
    valid = []
    for doc in docs:
        try:
            valid.append((from_document(doc), _etag_of(doc)))
        except PermanentError as exc:
            log.error("skipping invalid state document %r: %s", doc.get("id"), exc)
            if unreadable is not None:
                unreadable.append((str(doc.get("id")), str(exc)))
    return valid


def _params(**values: Any) -> list[dict[str, Any]]:
    return [{"name": f"@{k}", "value": v} for k, v in values.items()]


class CosmosStateStore:
    """Conditional reads and writes of state records (adapters.ports.StateStore).

    Args:
        container: the `orderState` container (a ContainerProxy of the aio client).
        charges: where request charges are recorded (one per store by default).
        update_attempts: how many times `update` re-reads after losing an etag
            race while its guard still holds, before it reports StaleError.
    """

    def __init__(
        self,
        container: ContainerProxy,
        charges: RequestCharges | None = None,
        update_attempts: int = DEFAULT_UPDATE_ATTEMPTS,
    ) -> None:
        self._container = container
        self.charges = charges if charges is not None else RequestCharges()
        self._update_attempts = update_attempts
        self.unreadable: list[tuple[str, str]] = []

    # --- point operations ---------------------------------------------------------

    async def create_if_absent(self, record: OrderState) -> tuple[OrderState, str, bool]:
        """Create the record unless one with its id exists: (stored record, its
        etag, created); an existing one is returned unchanged, for the caller to compare."""
        for _ in range(3):
            try:
                doc = await self._container.create_item(
                    body=to_document(record), response_hook=self.charges.hook("create")
                )
                return from_document(doc), _etag_of(doc), True
            except SDK_ERRORS as exc:
                error = translate_error(exc, f"create state {record.id}", self.charges, "create")
                if not isinstance(error, ConflictError):
                    raise error from exc
            try:
                stored, etag = await self.read(record.id)
                return stored, etag, False
            except NotFoundError:
                continue  # deleted (TTL) between the two calls, or a lagging read: again
        # Each create conflicted but no read found it: a lagging replica, most
        # likely. A verdict here would dead-letter a good order.
        raise TransientError(
            f"state record {record.id}: the create conflicted but a read did not find it; try again"
        )

    async def read(self, order_id: str) -> tuple[OrderState, str]:
        """The record and its etag; NotFoundError if there is none."""
        doc = await self._read_doc(order_id, f"read state {order_id}")
        try:
            return from_document(doc), _etag_of(doc)
        except PermanentError as exc:
            self.unreadable.append((order_id, str(exc)))
            raise

    async def replace(self, record: OrderState, etag: str) -> str:
        """Replace the record if it is still at `etag`; the new etag.
        StaleError if it changed since; NotFoundError if it is gone."""
        try:
            doc = await self._container.replace_item(
                item=record.id,
                body=to_document(record),
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
                response_hook=self.charges.hook("replace"),
            )
        except SDK_ERRORS as exc:
            raise translate_error(
                exc, f"replace state {record.id}", self.charges, "replace"
            ) from exc
        return _etag_of(doc)

    async def update(
        self,
        order_id: str,
        mutate: Callable[[OrderState], OrderState],
        expected_locked_by: ExpectedLock,
        *,
        confirm_refusal: bool = False,
    ) -> tuple[OrderState, str]:
        """Read, check `LockedBy == expected_locked_by`, apply `mutate` (a domain
        transition, whose errors propagate) and replace on the etag read; a
        lost etag race re-reads and re-checks, at most `update_attempts`
        times, so a write never lands unless the guard held on the version it
        replaced. A transition that changes nothing is not written. StaleError
        when the guard fails or the record keeps changing, NotFoundError when
        there is none.

        `confirm_refusal` (an attempt writing its own record): a read may lag
        the latest write (Session consistency across clients), so before a
        refusal the version read is confirmed current by replacing it
        unchanged on its etag; a 412 means the read lagged, and it reads again."""
        for _ in range(self._update_attempts):
            record, etag = await self.read(order_id)
            try:
                if expected_locked_by is not ANY_OWNER and record.LockedBy != expected_locked_by:
                    raise StaleError(
                        f"order {order_id} is locked by {record.LockedBy!r}, "
                        f"not by {expected_locked_by!r}"
                    )
                updated = mutate(record)
            except (StaleError, IllegalTransition):
                if not confirm_refusal:
                    raise
                try:
                    await self.replace(record, etag)
                except StaleError:
                    log.info("order %s: refusal read from a lagging version; re-reading", order_id)
                    continue
                raise
            if updated.id != record.id:
                raise PermanentError(f"a transition of {order_id} changed its id to {updated.id}")
            if updated == record:
                return record, etag
            try:
                new_etag = await self.replace(updated, etag)
            except StaleError:
                log.info("order %s changed while updating; re-reading", order_id)
                continue
            return updated, new_etag
        raise StaleError(
            f"order {order_id} changed {self._update_attempts} times while updating; giving up"
        )

    async def claim_known(
        self,
        record: OrderState,
        etag: str,
        now: datetime,
        policy: RetryPolicy,
        marks: tuple[list[str], datetime],
    ) -> tuple[OrderState, str] | None:
        """The Starter's claim of a record the caller holds with its etag: one
        replace, no read. `marks`: the steps and deadline of
        state_machine.claim_marking. None when it is not claimable or changed
        since (another claimer won: the loser moves on, never retries)."""
        if not is_claimable(record, now):
            return None
        claimed = claim_marking(record, now, policy, *marks)
        try:
            new_etag = await self.replace(claimed, etag)
        except (StaleError, NotFoundError):
            return None
        return claimed, new_etag

    # --- queries --------------------------------------------------------------------

    async def query_claimable(
        self, max_items: int, now: datetime, created_before: datetime | None = None
    ) -> list[tuple[OrderState, str]]:
        """Up to `max_items` claimable records with their etags (cross-partition,
        order unspecified). `created_before`: leave out records created since
        (Submit's fast path is about to claim them)."""
        params = _params(max=max_items, pending=ProcessState.PENDING.value, now=cosmos_time(now))
        query = _PENDING_QUERY
        if created_before is not None:
            query += " AND c.CreatedAt < @created_before"
            params += _params(created_before=cosmos_time(created_before))
        docs = await self._query(query, params, max_items, "query_pending")
        return [
            (record, etag)
            for record, etag in _valid(docs, self.unreadable)
            if is_claimable(record, now)
        ]

    async def query_expired(
        self,
        now: datetime,
        window_start: datetime,
        max_items: int,
        continuation: str | None = None,
    ) -> tuple[list[tuple[OrderState, str]], str | None]:
        """One page of Processing records whose CompleteBy is in
        [window_start, now), oldest deadline first, with their etags, and the
        continuation for the next (None after a short page; valid in any process)."""
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        params = _params(
            max=max_items,
            processing=ProcessState.PROCESSING.value,
            start=cosmos_time(window_start),
            now=cosmos_time(now),
        )
        query = _EXPIRED_FIRST
        if continuation is not None:
            after_cb, after_id = decode_cursor(continuation)
            params += _params(after_cb=after_cb, after_id=after_id)
            query = _EXPIRED_AFTER
        docs = await self._query(query, params, max_items, "query_expired")
        page = _valid(docs, self.unreadable)
        if len(docs) < max_items:
            return page, None
        last = docs[-1]
        return page, encode_cursor(last["CompleteBy"], last["id"])

    async def query_in_state(self, state: ProcessState | str, max_items: int) -> list[OrderState]:
        """Up to `max_items` records in `state`, for operators (cross-partition;
        not for per-message use)."""
        docs = await self._query(
            _IN_STATE_QUERY, _params(max=max_items, state=str(state)), max_items, "query_in_state"
        )
        return [record for record, _ in _valid(docs, self.unreadable)]

    async def query_in_state_after(
        self, state: ProcessState | str, max_items: int, after: str | None
    ) -> tuple[list[OrderState], str | None]:
        """One page of records in `state` whose id sorts after `after` (None:
        from the first), in id order, and where the next page starts (None
        after a short page). Invalid documents are left out but move the cursor."""
        docs = await self._query(
            _IN_STATE_AFTER_QUERY,
            _params(max=max_items, state=str(state), after=after or ""),
            max_items,
            "query_in_state",
        )
        after = str(docs[-1].get("id")) if len(docs) >= max_items else None
        return [record for record, _ in _valid(docs, self.unreadable)], after

    async def query_unsent_statuses(
        self,
        max_items: int,
        before: datetime,
        skip_queues: Iterable[str] = (),
        alerts: bool = True,
    ) -> list[tuple[OrderState, str]]:
        """Up to `max_items` records whose terminal status is in the outbox
        since before `before`, with their etags, oldest entry first. Records of
        the reply queues in `skip_queues` (the first MAX_SKIPPED_QUEUES) are
        left out: a queue refusing sends must not fill every page; with
        `alerts` False, so are entries left for their alert alone (the alerts
        queue refusing)."""
        skip = list(dict.fromkeys(skip_queues))[:MAX_SKIPPED_QUEUES]
        params = _params(max=max_items, before=cosmos_time(before))
        params += [{"name": f"@skip{i}", "value": queue} for i, queue in enumerate(skip)]
        query = (
            _UNSENT_STATUS_FILTER
            + "".join(f" AND c.ReplyTo != @skip{i}" for i in range(len(skip)))
            + ("" if alerts else _STATUS_NOT_SENT)
            + _UNSENT_STATUS_ORDER
        )
        docs = await self._query(query, params, max_items, "query_unsent_statuses")
        return _valid(docs, self.unreadable)

    async def query_compensation_requests(self, max_items: int) -> list[OrderState]:
        """Error / CompensationFailed records an operator asked to compensate
        (few; the Starter reads them once per run)."""
        docs = await self._query(
            _COMPENSATION_QUERY,
            _params(
                max=max_items,
                error=ProcessState.ERROR.value,
                failed=ProcessState.COMPENSATION_FAILED.value,
            ),
            max_items,
            "query_compensation",
        )
        return [record for record, _ in _valid(docs, self.unreadable)]

    async def count_in_state(self, state: ProcessState | str) -> int:
        """One cross-partition COUNT (its cost grows with the container): not
        per message. Of records only: a document without a field every record
        has is not counted (`_COUNT_QUERY`)."""
        value = ProcessState(state).value
        result = await self._query(_COUNT_QUERY, _params(state=value), None, "count")
        return int(result[0]) if result else 0

    # --- backlog gauge (docs/adr/008-backlog-gauge.md) ----------------------------
    # `_backlog` and `_admission` cannot be order keys and have no ProcessState,
    # so no state query sees them.

    async def write_backlog_gauge(
        self, pending: int, measured_at: datetime, processing: int | None = None
    ) -> None:
        """Store the Starter's measurement (an upsert of one small document)."""
        doc: dict[str, Any] = {
            "id": BACKLOG_GAUGE_ID,
            "PendingCount": pending,
            "MeasuredAt": cosmos_time(measured_at),
        }
        if processing is not None:
            doc["ProcessingCount"] = processing
        try:
            await self._container.upsert_item(
                body=doc, response_hook=self.charges.hook("gauge_write")
            )
        except SDK_ERRORS as exc:
            raise translate_error(exc, "write backlog gauge", self.charges, "gauge_write") from exc

    async def read_backlog_gauge(self) -> BacklogGauge | None:
        """The gauge by a point read; None if never measured or unreadable."""
        try:
            doc = await self._read_doc(BACKLOG_GAUGE_ID, "read backlog gauge", kind="gauge_read")
        except NotFoundError:
            return None
        try:
            measured_at = datetime.fromisoformat(doc["MeasuredAt"])
            processing = doc.get("ProcessingCount")
            return BacklogGauge(
                int(doc["PendingCount"]),
                measured_at,
                int(processing) if processing is not None else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            log.error("ignoring an invalid backlog gauge: %s", exc)
            return None

    # --- admission (domain.admission) ----------------------------------------------

    async def read_admission(self) -> tuple[Admission, str] | None:
        try:
            doc = await self._read_doc(ADMISSION_ID, "read admission", kind="admission_read")
        except NotFoundError:
            return None
        try:
            admission = Admission(
                limit=int(doc["Limit"]),
                counted=int(doc["Counted"]),
                counted_at=datetime.fromisoformat(doc["CountedAt"]),
                rate=float(doc.get("Rate", 0.0)),
                leases=tuple(
                    Lease(datetime.fromisoformat(at), int(slots), int(retries))
                    for at, slots, retries in doc.get("Leases", [])
                ),
                covered=float(doc.get("Covered", RATE_WINDOW)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            # Started afresh rather than stop every claim (replaced on this etag).
            log.error("an invalid admission document is replaced: %s", exc)
            return Admission(limit=0, counted=0, counted_at=datetime.now(UTC)), _etag_of(doc)
        return admission, _etag_of(doc)

    async def write_admission(self, admission: Admission, etag: str | None) -> str:
        body = {
            "id": ADMISSION_ID,
            "Limit": admission.limit,
            "Counted": admission.counted,
            "CountedAt": cosmos_time(admission.counted_at),
            "Rate": round(admission.rate, 4),
            "Covered": round(admission.covered, 3),
            "Leases": [[cosmos_time(x.at), x.slots, x.retries] for x in admission.leases],
        }
        hook = self.charges.hook("admission_write")
        try:
            if etag is None:  # a create: a second creator conflicts, never overwrites
                doc = await self._container.create_item(body=body, response_hook=hook)
            else:
                doc = await self._container.replace_item(
                    ADMISSION_ID, body, etag=etag, match_condition=IF_MATCH, response_hook=hook
                )
        except SDK_ERRORS as exc:
            raise translate_error(exc, "write admission", self.charges, "admission_write") from exc
        return _etag_of(doc)

    # --- plumbing -------------------------------------------------------------------

    async def _read_doc(self, item_id: str, what: str, kind: str = "read") -> dict[str, Any]:
        try:
            return await self._container.read_item(
                item=item_id, partition_key=item_id, response_hook=self.charges.hook(kind)
            )
        except SDK_ERRORS as exc:
            raise translate_error(exc, what, self.charges, kind) from exc

    async def _query(
        self, query: str, parameters: list[dict[str, Any]], max_items: int | None, kind: str
    ) -> list[Any]:
        return await query_all(self._container, query, parameters, max_items, self.charges, kind)
