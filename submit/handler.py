"""The Submit use case, independent of the trigger that delivers the message.

`SubmitHandler.handle` returns what to do with the message (`Settle`), and the
trigger function carries it out. The two writes share no transaction: each is
create-if-absent on OrderID followed by a comparison of the immutable data, so a
redelivered message finishes whichever half is missing (DESIGN.md §4).

Order of effects, and why:
1. validate (the client boundary: domain.codec / domain.boundary), check the
   reply queue belongs to the sender — nothing written yet;
2. read the state record: an existing one is compared by digest (cheap) first;
   a Rejected one gets its Rejected status again (its first send may have
   failed; the stable message id makes a repeat a duplicate) and nothing is
   written: a rejected order never reaches the orders DB;
3. admission control for new orders, from a gauge the starter refreshes (one
   point read, cached; never a cross-partition COUNT per message);
4. orders DB, then state record — a crash between them is healed on redelivery;
5. `Received` status, then `ReceivedSent` on the record — a crash between them
   re-sends with the same message id, which the reply queue's duplicate
   detection drops.

The handler decides; it does not alert or settle. submit.functions runs it
through adapters.settlement.MessageGate, which raises one alert per dead
letter (with the message id), turns a transient failure into a delayed retry,
and an unexpected exception into a `ProcessingFailed` dead letter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from adapters.ports import ANY_OWNER, OrdersRepository, StateStore
from adapters.settings import Settings
from adapters.settlement import Settle
from domain import state_machine as sm
from domain.boundary import readable_order_id
from domain.codec import decode
from domain.errors import (
    ConflictError,
    NotFoundError,
    PermanentError,
    TransientError,
    ValidationFailed,
)
from domain.models import OrderState, OrderSubmitted, ProcessState, StatusKind
from reporting import Alerts, StatusReporter

log = logging.getLogger(__name__)


class BacklogReader:
    """The Pending backlog as last measured by the Starter.

    One point read per `cache_seconds` per process. A measurement older than
    `max_age` means the Starter is not running: the backlog is then unknown
    and orders are admitted (and the staleness logged), because refusing all
    orders while the Starter is down would turn one fault into two."""

    def __init__(
        self,
        store: StateStore,
        max_age_seconds: float,
        cache_seconds: float = 5.0,
        clock=time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._max_age = max_age_seconds
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        self._cached: tuple[float, int | None] | None = None

    async def pending(self) -> int | None:
        now = self._clock()
        if self._cached and now - self._cached[0] < self._cache_seconds:
            return self._cached[1]
        gauge = await self._store.read_backlog_gauge()
        value: int | None = None
        if gauge is not None:
            age = (self._wall_clock() - gauge.measured_at).total_seconds()
            if age <= self._max_age:
                value = gauge.pending
            else:
                log.warning("backlog gauge is %.0fs old: admitting without a backlog check", age)
        self._cached = (now, value)
        return value


class SubmitHandler:
    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        orders: OrdersRepository,
        status: StatusReporter,
        alerts: Alerts,
        steps: list[str],
        backlog: BacklogReader | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._settings = settings
        self._store = store
        self._orders = orders
        self._status = status
        # Alerts are raised by the gate that runs this handler (with the
        # message id); kept here so the gate can use the same sink.
        self.alerts = alerts
        self._steps = steps
        self._backlog = backlog or BacklogReader(store, settings.backlog_gauge_max_age.total_seconds())
        self._clock = clock

    async def handle(self, body: bytes) -> Settle:
        try:
            return await self._handle(body)
        except TransientError as exc:
            # The store or the bus is briefly unavailable: retry after a
            # back-off delay (the gate schedules it), not at once.
            log.warning("transient failure, retrying later: %s", exc)
            return Settle.retry(str(exc), readable_order_id(body))

    async def _handle(self, body: bytes) -> Settle:
        now = self._clock()
        try:
            order = decode(OrderSubmitted, body, self._settings.max_order_bytes)
        except ValidationFailed as exc:
            return Settle.deadletter("InvalidMessage", exc.reason, readable_order_id(body))

        allowed = self._settings.reply_queues.get(order.AppId)
        if allowed != order.ReplyTo:
            reason = (
                f"application {order.AppId!r} may not use reply queue {order.ReplyTo!r}"
                + (f" (its queue is {allowed!r})" if allowed else " (application not registered)")
            )
            return Settle.deadletter("ReplyQueueNotAllowed", reason, order.OrderID)

        existing = await self._read(order.OrderID)
        if existing is not None and existing.OrderDigest != order.digest():
            return await self._conflict(order, now)
        if existing is not None and existing.ProcessState is ProcessState.REJECTED:
            return await self._send_rejected(order, existing, now)

        if existing is None and await self._over_backlog():
            return await self._reject(order, now)

        try:
            await self._orders.create_if_absent(order)
        except ConflictError as exc:
            return await self._conflict(order, now, exc.fields)

        record, _, created = await self._store.create_if_absent(
            sm.new_record(order, now, self._steps)
        )
        if not created and record.OrderDigest != order.digest():
            return await self._conflict(order, now)
        if created:
            log.info("order accepted", extra={"order_id": order.OrderID})

        if record.ProcessState is ProcessState.REJECTED:
            # Rejected by a delivery racing this one, after our orders write.
            return await self._send_rejected(order, record, now)
        if not record.ReceivedSent:
            await self._status.send(order.ReplyTo, order.OrderID, StatusKind.RECEIVED, now)
            await self._store.update(
                order.OrderID, lambda r: sm.mark_received_sent(r, now), ANY_OWNER
            )
        return Settle.complete(order.OrderID)

    async def _read(self, order_id: str) -> OrderState | None:
        try:
            record, _ = await self._store.read(order_id)
            return record
        except NotFoundError:
            return None

    async def _over_backlog(self) -> bool:
        pending = await self._backlog.pending()
        return pending is not None and pending > self._settings.pending_backlog_limit

    async def _reject(self, order: OrderSubmitted, now: datetime) -> Settle:
        reason = f"backlog above {self._settings.pending_backlog_limit} pending orders; try later"
        record, _, created = await self._store.create_if_absent(sm.rejected_record(order, now, reason))
        if record.ProcessState is not ProcessState.REJECTED:
            # Lost a race with a delivery that was admitted: treat as that.
            return await self._handle_existing_after_race(order, now)
        log.warning("order rejected: %s", reason, extra={"order_id": order.OrderID})
        return await self._send_rejected(order, record, now)

    async def _send_rejected(self, order: OrderSubmitted, record: OrderState, now: datetime) -> Settle:
        """(Re)send Rejected. Every delivery of a rejected order sends it: the
        first send may have failed, and its stable message id makes a repeat
        within the duplicate window a duplicate the reply queue drops."""
        await self._status.send(
            order.ReplyTo, order.OrderID, StatusKind.REJECTED, now, detail=record.LastError
        )
        return Settle.complete(order.OrderID)

    async def _handle_existing_after_race(self, order: OrderSubmitted, now: datetime) -> Settle:
        record = await self._read(order.OrderID)
        if record is None or record.OrderDigest != order.digest():
            return await self._conflict(order, now)
        return Settle.complete(order.OrderID)

    async def _conflict(
        self, order: OrderSubmitted, now: datetime, fields: list[str] | None = None
    ) -> Settle:
        if fields is None:
            fields = await self._differing_fields(order)
        description = (
            f"order {order.OrderID} exists with different data in: {', '.join(fields) or 'unknown'}; "
            "nothing was overwritten"
        )
        return Settle.deadletter("OrderConflict", description, order.OrderID)

    async def _differing_fields(self, order: OrderSubmitted) -> list[str]:
        try:
            stored = await self._orders.get(order.OrderID)
        except (NotFoundError, PermanentError):
            return []
        mine, theirs = order.immutable_fields(), stored.immutable_fields()
        return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
