"""The interfaces the application code depends on. Real adapters (Cosmos,
Service Bus) and the fakes used by fast unit tests both satisfy them."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NamedTuple, Protocol

from domain.admission import Admission
from domain.models import OrderState, OrderSubmitted
from domain.state_machine import RetryPolicy


class AnyOwner(enum.Enum):
    ANY = "ANY"

    def __repr__(self) -> str:
        return "ANY"


ANY_OWNER: Final = AnyOwner.ANY
"""Pass as `expected_locked_by` when a write does not depend on the owner
(the Starter's claim, Submit's bookkeeping, an operator's resubmit): the etag
guard alone applies."""


class BacklogGauge(NamedTuple):
    """The Starter's last count of Pending (and Processing: None when not
    measured) records, point-read by Submit on every host (docs/adr/008-backlog-gauge.md)."""

    pending: int
    measured_at: datetime
    processing: int | None = None


class StateStore(Protocol):
    # (id, reason) of each document a read or scan could not take as a record
    # since the caller last emptied it (and alerted): scans leave them out.
    unreadable: list[tuple[str, str]]

    async def create_if_absent(self, record: OrderState) -> tuple[OrderState, str, bool]: ...

    async def read(self, order_id: str) -> tuple[OrderState, str]: ...

    async def replace(self, record: OrderState, etag: str) -> str: ...

    async def update(
        self,
        order_id: str,
        mutate: Callable[[OrderState], OrderState],
        expected_locked_by: Any,
        *,
        confirm_refusal: bool = False,
    ) -> tuple[OrderState, str]: ...

    async def claim_known(
        self,
        record: OrderState,
        etag: str,
        now: datetime,
        policy: RetryPolicy,
        marks: tuple[list[str], datetime],
    ) -> tuple[OrderState, str] | None: ...

    async def query_claimable(
        self, max_items: int, now: datetime, created_before: datetime | None = None
    ) -> list[tuple[OrderState, str]]: ...

    async def query_expired(
        self, now: datetime, window_start: datetime, max_items: int, continuation: str | None
    ) -> tuple[list[tuple[OrderState, str]], str | None]: ...

    async def count_in_state(self, state: str) -> int: ...

    async def query_compensation_requests(self, max_items: int) -> list[OrderState]: ...

    async def query_in_state(self, state: str, max_items: int) -> list[OrderState]: ...

    async def query_in_state_after(
        self, state: str, max_items: int, after: str | None
    ) -> tuple[list[OrderState], str | None]: ...

    async def query_unsent_statuses(
        self,
        max_items: int,
        before: datetime,
        skip_queues: Iterable[str] = (),
        alerts: bool = True,
    ) -> list[tuple[OrderState, str]]: ...

    async def read_backlog_gauge(self) -> BacklogGauge | None: ...

    async def write_backlog_gauge(
        self, pending: int, measured_at: datetime, processing: int | None = None
    ) -> None: ...

    async def read_admission(self) -> tuple[Admission, str] | None:
        """The admission document (domain.admission) and its etag; None if
        never written."""
        ...

    async def write_admission(self, admission: Admission, etag: str | None) -> str:
        """Write it if it is still at `etag` (None: create it); the new etag.
        StaleError (or ConflictError, for a create) when another writer won."""
        ...


class OrdersRepository(Protocol):
    """Orders as submitted, one per order key (domain.ids.order_key; `key`
    None: the key of the order's own AppId and OrderID)."""

    async def get(self, key: str) -> OrderSubmitted: ...

    async def get_version(self, key: str) -> tuple[OrderSubmitted, str]: ...

    async def discard(self, key: str) -> None: ...

    async def store(self, order: OrderSubmitted, key: str | None = None) -> str: ...

    async def discard_version(self, key: str, version: str) -> bool: ...


class MessagePublisher(Protocol):
    """Sends one message to a queue. `message_id` is stable for a logical
    message so the queue's duplicate detection drops a re-send."""

    async def send(
        self,
        queue: str,
        body: bytes,
        message_id: str,
        application_properties: dict[str, str] | None = None,
    ) -> None: ...


class DeadlineIndex(Protocol):
    """The recovery index (ADR 007): told of an attempt's deadline before the
    record gets it; `NoIndex` when the Supervisor uses the state container's query."""

    async def add(self, order_id: str, complete_by: datetime, attempt: int) -> None: ...

    async def discard(self, order_id: str, complete_by: datetime) -> None:
        """Remove the entry `add(order_id, complete_by, ...)` made, if it is
        still there (an attempt retires its own entry when it ends)."""
        ...


BUCKET_SECONDS = 60  # the recovery index's partitions: deadlines floored to the minute
UNREADABLE_RETRY = timedelta(minutes=10)
"""How long before a record the Supervisor could not read, or an index document
that is not an entry, is looked at (and alerted) again."""


def bucket_of(moment: datetime) -> str:
    """The recovery-index bucket (partition) of a deadline."""
    moment = moment.astimezone(UTC)
    floored = moment - timedelta(
        seconds=moment.second % BUCKET_SECONDS, microseconds=moment.microsecond
    )
    return floored.strftime("%Y-%m-%dT%H:%M:%S")


def minute_of(partition: str) -> str:
    """The bucket (minute) of a recovery-index partition key value,
    `<minute>|<shard>` or a bare `<minute>` (docs/adr/019b-sharded-recovery-index.md)."""
    return partition.split("|", 1)[0]


@dataclass(frozen=True)
class IndexEntry:
    id: str
    bucket: str  # the entry's partition key value (`<minute>|<shard>` or `<minute>`)
    order_id: str
    complete_by: datetime
    attempt: int


class NoIndex:
    """The null index: takes the port's arguments and keeps nothing."""

    async def add(self, order_id: str, complete_by: datetime, attempt: int) -> None:  # noqa: ARG002
        return None

    async def discard(self, order_id: str, complete_by: datetime) -> None:  # noqa: ARG002
        return None
