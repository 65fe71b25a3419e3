"""The operator console's own bounded queries on the state container (the state
store's public reads serve the rest). Each is one `TOP n` query with a small
projection; the orders list pages by keyset (`ORDER BY c.id`, an opaque token
holding the last id), for the reason adapters.state_store gives."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from azure.cosmos.aio import ContainerProxy

from adapters.cosmos_client import RequestCharges, query_all
from adapters.state_store import cosmos_time
from domain.errors import PermanentError
from domain.models import ProcessState

# The states an order ends in, as the throughput chart shows them.
FINISHED_STATES: Final = (
    ProcessState.PROCESSED,
    ProcessState.COMPENSATED,
    ProcessState.ERROR,
    ProcessState.COMPENSATION_FAILED,
)

MAX_PAGE: Final = 200
MAX_RECENT: Final = 1000

_LIST_FIELDS: Final = (
    "c.id, c.ProcessState, c.AppId, c.Attempt, c.FailureCount, c.LongRetries, c.CreatedAt,"
    " c.CompleteBy, c.NotBefore, c.LastError, c.CompensationRequested"
)


@dataclass(frozen=True)
class OrderRow:
    """One line of the orders list (no History, Steps or order data)."""

    id: str
    state: str
    app_id: str
    attempt: int
    failures: int
    long_retries: int
    created_at: datetime | None
    complete_by: datetime | None
    not_before: datetime | None
    last_error: str | None
    compensation_requested: bool


@dataclass(frozen=True)
class SupervisorDecision:
    order_id: str
    at: datetime
    to: str
    reason: str | None

    @property
    def kind(self) -> str:
        """recovered (back to Pending), long-retry (Pending after a wait), failed (Error)."""
        if self.to == ProcessState.ERROR.value:
            return "failed"
        if self.reason and "long retry" in self.reason:
            return "long-retry"
        return "recovered"


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _row(doc: dict[str, Any]) -> OrderRow:
    return OrderRow(
        id=str(doc.get("id")),
        state=str(doc.get("ProcessState")),
        app_id=str(doc.get("AppId") or ""),
        attempt=int(doc.get("Attempt") or 0),
        failures=int(doc.get("FailureCount") or 0),
        long_retries=int(doc.get("LongRetries") or 0),
        created_at=_time(doc.get("CreatedAt")),
        complete_by=_time(doc.get("CompleteBy")),
        not_before=_time(doc.get("NotBefore")),
        last_error=doc.get("LastError"),
        compensation_requested=bool(doc.get("CompensationRequested")),
    )


def encode_page_token(last_id: str) -> str:
    raw = json.dumps({"v": 1, "id": last_id}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_page_token(token: str) -> str:
    try:
        data = json.loads(base64.urlsafe_b64decode((token + "=" * (-len(token) % 4)).encode()))
        # Any JSON decodes: `[1]` or `1` is no token of ours either.
        if not isinstance(data, dict) or data.get("v") != 1 or not isinstance(data.get("id"), str):
            raise ValueError("unknown token version")
        return data["id"]
    except (ValueError, KeyError, TypeError, binascii.Error, RecursionError) as exc:
        raise PermanentError(f"invalid page token: {exc}") from exc


def _params(**values: Any) -> list[dict[str, Any]]:
    return [{"name": f"@{k}", "value": v} for k, v in values.items()]


class ConsoleReads:
    """The console's own bounded queries (see the module docstring)."""

    def __init__(self, container: ContainerProxy, charges: RequestCharges | None = None) -> None:
        self._container = container
        self.charges = charges if charges is not None else RequestCharges()

    async def list_orders(
        self,
        state: ProcessState | str | None,
        page_size: int,
        app_id: str | None = None,
        created_before: datetime | None = None,
        page_token: str | None = None,
        id_prefix: str | None = None,
        created_after: datetime | None = None,
        ids: list[str] | None = None,
    ) -> tuple[list[OrderRow], str | None]:
        """One page of the records in `state` (every state when None), by
        OrderID, optionally narrowed by application, OrderID prefix, creation
        time and `ids`: (rows, the next page's token or None). One query."""
        if not 1 <= page_size <= MAX_PAGE:
            raise ValueError(f"page_size must be 1..{MAX_PAGE}")
        where = ["true"]
        params = _params(max=page_size)
        if state is not None:
            where.append("c.ProcessState = @state")
            params += _params(state=ProcessState(state).value)
        if app_id:
            where.append("c.AppId = @app")
            params += _params(app=app_id)
        if created_before is not None:
            where.append("c.CreatedAt < @before")
            params += _params(before=cosmos_time(created_before))
        if created_after is not None:
            where.append("c.CreatedAt >= @since")
            params += _params(since=cosmos_time(created_after))
        if ids is not None:  # only these records (at most MAX_PAGE): a customer's orders
            names = {f"k{n}": v for n, v in enumerate(ids[:MAX_PAGE])} or {"k0": ""}
            where.append("c.id IN (" + ", ".join(f"@{k}" for k in names) + ")")
            params += _params(**names)
        if id_prefix:
            # the key is `{app}:{OrderID}` or a bare OrderID; an OrderID holds no ':'
            where.append("(STARTSWITH(c.id, @prefix) OR CONTAINS(c.id, @keyed))")
            params += _params(prefix=id_prefix, keyed=f":{id_prefix}")
        if page_token:
            where.append("c.id > @after")
            params += _params(after=decode_page_token(page_token))
        query = (
            f"SELECT TOP @max {_LIST_FIELDS} FROM c WHERE {' AND '.join(where)} ORDER BY c.id ASC"
        )
        docs = await query_all(
            self._container, query, params, page_size, self.charges, "console_list"
        )
        rows = [_row(d) for d in docs]
        token = encode_page_token(rows[-1].id) if len(rows) == page_size else None
        return rows, token

    async def stored(self, ids: list[str]) -> set[str]:
        """Which of `ids` (at most MAX_PAGE) have a record. One query, none for no ids."""
        wanted = list(dict.fromkeys(ids))[:MAX_PAGE]
        if not wanted:
            return set()
        names = {f"i{n}": v for n, v in enumerate(wanted)}
        query = "SELECT VALUE c.id FROM c WHERE c.id IN (" + ", ".join(f"@{k}" for k in names) + ")"
        found = await query_all(
            self._container, query, _params(**names), len(wanted), self.charges, "console_stored"
        )
        return {f for f in found if isinstance(f, str)}

    async def finished_since(
        self, since: datetime, limit: int = MAX_RECENT
    ) -> tuple[list[tuple[str, datetime]], bool]:
        """(state, UpdatedAt) of at most `limit` records that reached a
        FINISHED_STATES state since `since`, and whether the limit cut the
        answer short. One query of two small fields per record."""
        states = {f"s{i}": s.value for i, s in enumerate(FINISHED_STATES)}
        query = (
            "SELECT TOP @max c.ProcessState, c.UpdatedAt FROM c WHERE c.UpdatedAt >= @since AND ("
            + " OR ".join(f"c.ProcessState = @{name}" for name in states)
            + ")"
        )
        params = _params(max=limit, since=cosmos_time(since), **states)
        docs = await query_all(
            self._container, query, params, limit, self.charges, "console_throughput"
        )
        found = [(str(d.get("ProcessState")), _time(d.get("UpdatedAt"))) for d in docs]
        return [(state, at) for state, at in found if at is not None], len(docs) >= limit

    async def supervisor_decisions(
        self, since: datetime, limit: int = 200
    ) -> tuple[list[SupervisorDecision], bool]:
        """The Supervisor's decisions since `since`, read from the History of
        records that changed since then and that it may have touched (a
        failure counted, a second attempt, or Error; an order resubmitted
        after a single failed attempt is the one case this misses): at most
        `limit` records, one query. Returns (decisions newest first, whether
        the limit cut the answer short)."""
        query = (
            "SELECT TOP @max c.id, c.History FROM c WHERE c.UpdatedAt >= @since"
            " AND (c.FailureCount > 0 OR c.Attempt > 1 OR c.ProcessState = @error)"
        )
        params = _params(max=limit, since=cosmos_time(since), error=ProcessState.ERROR.value)
        docs = await query_all(
            self._container, query, params, limit, self.charges, "console_supervisor"
        )
        decisions = []
        for d in docs:
            for h in d.get("History") or []:
                at = _time(h.get("At"))
                if h.get("By") == "supervisor" and at is not None and at >= since:
                    decisions.append(
                        SupervisorDecision(str(d.get("id")), at, str(h.get("To")), h.get("Reason"))
                    )
        decisions.sort(key=lambda x: x.at, reverse=True)
        return decisions, len(docs) >= limit
