"""In-memory fakes of the project's own ports (adapters.ports), for fast unit
tests of application logic. They keep the contract that matters: etags change
on every write and a stale etag is refused. Integration tests use the real
adapters against the real local servers instead."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime
from typing import Any

from adapters.ports import ANY_OWNER, BacklogGauge
from domain import state_machine as sm
from domain.admission import Admission
from domain.errors import ConflictError, NotFoundError, StaleError
from domain.ids import order_key
from domain.models import OrderState, OrderSubmitted, ProcessState


class FakeStateStore:
    def __init__(self) -> None:
        self.docs: dict[str, tuple[dict, str]] = {}
        self.unreadable: list[tuple[str, str]] = []
        self.gauge: BacklogGauge | None = None
        self.admission: tuple[Admission, str] | None = None
        self.writes = 0
        self._etags = itertools.count(1)

    def _etag(self) -> str:
        return f'"{next(self._etags)}"'

    async def create_if_absent(self, record: OrderState) -> tuple[OrderState, str, bool]:
        if record.id in self.docs:
            doc, etag = self.docs[record.id]
            return OrderState.model_validate(doc), etag, False
        etag = self._etag()
        self.docs[record.id] = (record.model_dump(mode="json"), etag)
        self.writes += 1
        return record, etag, True

    async def read(self, order_id: str) -> tuple[OrderState, str]:
        if order_id not in self.docs:
            raise NotFoundError(order_id)
        doc, etag = self.docs[order_id]
        return OrderState.model_validate(doc), etag

    async def replace(self, record: OrderState, etag: str) -> str:
        current = self.docs.get(record.id)
        if current is None or current[1] != etag:
            raise StaleError(f"etag mismatch for {record.id}")
        new = self._etag()
        self.docs[record.id] = (record.model_dump(mode="json"), new)
        self.writes += 1
        return new

    async def update(
        self,
        order_id: str,
        mutate: Callable[[OrderState], OrderState],
        expected_locked_by: Any,
        *,
        confirm_refusal: bool = False,  # this fake's reads never lag: nothing to confirm
    ) -> tuple[OrderState, str]:
        record, etag = await self.read(order_id)
        if expected_locked_by is not ANY_OWNER and record.LockedBy != expected_locked_by:
            raise StaleError(f"{order_id} locked by {record.LockedBy}")
        new = mutate(record)
        return new, await self.replace(new, etag)

    async def claim_known(
        self,
        record: OrderState,
        etag: str,
        now: datetime,
        policy: sm.RetryPolicy,
        marks: tuple[list[str], datetime],
    ):
        if not sm.is_claimable(record, now):
            return None
        claimed = sm.claim_marking(record, now, policy, *marks)
        try:
            return claimed, await self.replace(claimed, etag)
        except (StaleError, NotFoundError):
            return None

    async def query_claimable(
        self, max_items: int, now: datetime, created_before: datetime | None = None
    ):
        pairs = [(OrderState.model_validate(d), e) for d, e in self.docs.values()]
        return [
            (r, e)
            for r, e in pairs
            if sm.is_claimable(r, now) and (created_before is None or r.CreatedAt < created_before)
        ][:max_items]

    async def query_expired(self, now, window_start, max_items, continuation):
        """Like Cosmos' ORDER BY continuation: resumes after the last sort key
        returned, so records changed since then simply drop out."""
        records = sorted(
            (
                (OrderState.model_validate(d), e)
                for d, e in self.docs.values()
                if d["ProcessState"] == ProcessState.PROCESSING.value
            ),
            key=lambda pair: (pair[0].CompleteBy, pair[0].id),
        )
        hits = [p for p in records if window_start <= p[0].CompleteBy < now]
        if continuation:
            at, _, last_id = continuation.partition("|")
            after = (datetime.fromisoformat(at), last_id)
            hits = [p for p in hits if (p[0].CompleteBy, p[0].id) > after]
        page = hits[:max_items]
        if len(hits) <= max_items:
            return page, None
        last = page[-1][0]
        return page, f"{last.CompleteBy.isoformat()}|{last.id}"

    async def query_in_state(self, state, max_items: int) -> list[OrderState]:
        records = [OrderState.model_validate(d) for d, _ in self.docs.values()]
        return [r for r in records if r.ProcessState == state][:max_items]

    async def query_in_state_after(self, state, max_items: int, after):
        records = sorted(
            (OrderState.model_validate(d) for d, _ in self.docs.values()), key=lambda r: r.id
        )
        page = [r for r in records if r.ProcessState == state and r.id > (after or "")][:max_items]
        return page, (page[-1].id if len(page) >= max_items else None)

    async def query_unsent_statuses(
        self, max_items: int, before: datetime, skip_queues=(), alerts: bool = True
    ):
        out = []
        for doc, etag in self.docs.values():
            record = OrderState.model_validate(doc)
            if (
                record.PendingStatus is not None
                and record.PendingStatus.At < before
                and record.ReplyTo not in set(skip_queues)
                and (alerts or not record.PendingStatus.Sent)
            ):
                out.append((record, etag))
        out.sort(key=lambda pair: pair[0].PendingStatus.At)
        return out[:max_items]

    async def query_compensation_requests(self, max_items: int) -> list[OrderState]:
        records = [OrderState.model_validate(d) for d, _ in self.docs.values()]
        wanted = (ProcessState.ERROR, ProcessState.COMPENSATION_FAILED)
        return [r for r in records if r.CompensationRequested and r.ProcessState in wanted][
            :max_items
        ]

    async def count_in_state(self, state) -> int:
        return sum(1 for d, _ in self.docs.values() if d["ProcessState"] == str(state))

    async def read_backlog_gauge(self) -> BacklogGauge | None:
        return self.gauge

    async def write_backlog_gauge(
        self, pending: int, measured_at: datetime, processing: int | None = None
    ) -> None:
        self.gauge = BacklogGauge(pending, measured_at, processing)

    async def read_admission(self) -> tuple[Admission, str] | None:
        return self.admission

    async def write_admission(self, admission: Admission, etag: str | None) -> str:
        current = self.admission
        if etag is None and current is not None:
            raise ConflictError("admission exists", [])
        if etag is not None and (current is None or current[1] != etag):
            raise StaleError("admission changed")
        new = self._etag()
        self.admission = (admission, new)
        return new


class FakeOrders:
    def __init__(self) -> None:
        self.orders: dict[str, OrderSubmitted] = {}

    async def create_if_absent(self, order: OrderSubmitted, key: str | None = None) -> bool:
        key = key or order_key(order.AppId, order.OrderID)
        existing = self.orders.get(key)
        if existing is None:
            self.orders[key] = order
            return True
        mine, theirs = order.immutable_fields(), existing.immutable_fields()
        fields = sorted(k for k in mine if mine[k] != theirs.get(k))
        if fields:
            raise ConflictError(f"order {key} differs", fields)
        return False

    async def get(self, order_id: str) -> OrderSubmitted:
        if order_id not in self.orders:
            raise NotFoundError(order_id)
        return self.orders[order_id]

    async def discard(self, order_id: str) -> None:
        self.orders.pop(order_id, None)

    async def get_version(self, key: str) -> tuple[OrderSubmitted, str]:
        return await self.get(key), self.version(key)

    def version(self, key: str) -> str:
        """The etag of what is stored under `key`: the order's content."""
        return self.orders[key].digest()

    async def store(self, order: OrderSubmitted, key: str | None = None) -> str:
        key = key or order_key(order.AppId, order.OrderID)
        try:
            await self.create_if_absent(order, key)
        except ConflictError as exc:
            exc.version = self.version(key)
            raise
        return self.version(key)

    async def discard_version(self, key: str, version: str) -> bool:
        if key in self.orders and self.version(key) == version:
            del self.orders[key]
            return True
        return False


class RecordingPublisher:
    """Records every send, duplicates included (`sends`), and what the queues
    keep (`sent`): a message whose id was already sent to that queue is dropped
    there, as Service Bus duplicate detection does. Assert on `sends` to show
    what the code did, on `sent` for what a receiver would see."""

    def __init__(self) -> None:
        self.sends: list[tuple[str, bytes, str, dict | None]] = []
        self.sent: list[tuple[str, bytes, str, dict | None]] = []
        self.fail_next: Exception | None = None
        self.down: Exception | None = None  # every send fails with it while set
        self.refusing: dict[str, Exception] = {}  # queue -> what every send to it raises

    async def send(self, queue, body, message_id, application_properties=None) -> None:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        if self.down is not None:
            raise self.down
        if queue in self.refusing:
            raise self.refusing[queue]
        self.sends.append((queue, body, message_id, application_properties))
        if any(q == queue and mid == message_id for q, _, mid, _ in self.sent):
            return
        self.sent.append((queue, body, message_id, application_properties))

    def resent(self) -> list[tuple[str, str]]:
        """(queue, message id) of every send that repeated an earlier one."""
        seen: set[tuple[str, str]] = set()
        out = []
        for q, _, mid, _ in self.sends:
            if (q, mid) in seen:
                out.append((q, mid))
            seen.add((q, mid))
        return out

    def to(self, queue: str) -> list[bytes]:
        return [body for q, body, _, _ in self.sent if q == queue]


class CountingStateStore(FakeStateStore):
    """FakeStateStore that counts what would be Cosmos requests: every point
    operation and every query page is one request (a failed conditional
    replace too); `update` and `claim` count as the reads and replaces they
    are made of. For cost-per-order tests (counts, not timings)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.requests[kind] = self.requests.get(kind, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    async def create_if_absent(self, record):
        self._count("create")
        existed = record.id in self.docs
        result = await super().create_if_absent(record)
        if existed:
            self._count("read")  # the real adapter reads the existing record after the 409
        return result

    async def read(self, order_id):
        self._count("read")
        return await super().read(order_id)

    async def replace(self, record, etag):
        self._count("replace")
        return await super().replace(record, etag)

    async def query_claimable(self, max_items, now, created_before=None):
        self._count("query")
        return await super().query_claimable(max_items, now, created_before)

    async def query_unsent_statuses(self, max_items, before, skip_queues=(), alerts=True):
        self._count("query")
        return await super().query_unsent_statuses(max_items, before, skip_queues, alerts)


class CountingOrders(FakeOrders):
    def __init__(self) -> None:
        super().__init__()
        self.requests: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    async def create_if_absent(self, order, key=None):
        self.requests["create"] = self.requests.get("create", 0) + 1
        return await super().create_if_absent(order, key)

    async def get(self, order_id):
        self.requests["read"] = self.requests.get("read", 0) + 1
        return await super().get(order_id)


class FakeIndex:
    """The recovery index's writer side (adapters.ports.DeadlineIndex), in
    memory: entries by (order, deadline), and how many requests were made."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, datetime], int] = {}
        self.requests: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    async def add(self, order_id: str, complete_by: datetime, attempt: int) -> None:
        self.requests["add"] = self.requests.get("add", 0) + 1
        self.entries[(order_id, complete_by)] = attempt

    async def discard(self, order_id: str, complete_by: datetime) -> None:
        self.requests["discard"] = self.requests.get("discard", 0) + 1
        self.entries.pop((order_id, complete_by), None)
