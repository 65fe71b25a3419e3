"""The Submit use case: `SubmitHandler.handle` validates, admits and writes an
order, and says what to do with the message. The order of the writes:
docs/adr/009-submit-order-of-effects.md; admission: docs/adr/008-backlog-gauge.md."""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime
from typing import TYPE_CHECKING

from adapters import telemetry
from adapters.clock import SYSTEM_CLOCK, Clock
from adapters.ports import ANY_OWNER, BacklogGauge, OrdersRepository, StateStore
from adapters.settlement import Settle
from domain import state_machine as sm
from domain.boundary import readable_order_id
from domain.codec import decode
from domain.errors import (
    ConflictError,
    NotFoundError,
    PermanentError,
    StaleError,
    TransientError,
    ValidationFailed,
)
from domain.ids import order_key
from domain.models import OrderState, OrderSubmitted, ProcessState, StatusKind
from domain.shards import shard_of
from reporting import Alerts, StatusReporter
from submit.policy import SubmitPolicy

if TYPE_CHECKING:
    from orchestrators.starter import FastStart

log = logging.getLogger(__name__)


class BacklogReader:
    """The Pending backlog and the records in flight, as last measured by the
    Starter: one point read per `cache_seconds` per process; older than
    `max_age`, unknown, and orders are admitted (ADR 008)."""

    def __init__(
        self,
        store: StateStore,
        max_age_seconds: float,
        cache_seconds: float = 5.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._store = store
        self._max_age = max_age_seconds
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._cached: tuple[datetime, BacklogGauge | None] | None = None

    async def gauge(self) -> BacklogGauge | None:
        """The Starter's last measurement, or None when none is young enough."""
        now = self._clock.now()
        if self._cached:
            # A clock stepped back counts as expired, not as a longer cache.
            read_for = (now - self._cached[0]).total_seconds()
            if 0 <= read_for < self._cache_seconds:
                return self._cached[1]
        gauge = await self._store.read_backlog_gauge()
        if gauge is not None:
            age = (now - gauge.measured_at).total_seconds()
            if age > self._max_age:
                log.warning("backlog gauge is %.0fs old: admitting without a backlog check", age)
                gauge = None
        self._cached = (now, gauge)
        return gauge

    async def pending(self) -> int | None:
        gauge = await self.gauge()
        return gauge.pending if gauge is not None else None

    async def processing(self) -> int | None:
        """Records in flight at the Starter's last run (on any host), or None."""
        gauge = await self.gauge()
        return gauge.processing if gauge is not None else None


class SubmitHandler:
    def __init__(
        self,
        settings: SubmitPolicy,
        store: StateStore,
        orders: OrdersRepository,
        status: StatusReporter,
        alerts: Alerts,
        steps: list[str],
        backlog: BacklogReader | None = None,
        clock: Clock = SYSTEM_CLOCK,
        fast_start: FastStart | None = None,
    ) -> None:
        """`fast_start`: the Starter's fast path; without one every order
        waits for the timer Starter."""
        self._settings = settings
        self._start = fast_start
        self._store = store
        self._orders = orders
        self._status = status
        self.alerts = alerts
        self._steps = steps
        self._backlog = backlog or BacklogReader(
            store, settings.backlog_gauge_max_age.total_seconds(), clock=clock
        )
        self._clock = clock

    async def handle(self, body: bytes, app_id: str, client: object | None = None) -> Settle:
        """Decide what becomes of one order that arrived on `app_id`'s ingress
        queue. `client`: the trigger's Durable client, for the fast path."""
        try:
            return await self._handle(body, app_id, client)
        except TransientError as exc:
            log.warning("transient failure, retrying later: %s", exc)
            return Settle.retry(str(exc), readable_order_id(body))
        except NotFoundError as exc:
            # A read that may rightly find nothing handles it where it is made;
            # one that escapes met a lagging replica: dead-lettering would lose a good order.
            log.warning("a record read did not find what exists, retrying later: %s", exc)
            return Settle.retry(f"{exc} (a lagging read); try again", readable_order_id(body))

    async def _handle(self, body: bytes, app_id: str, client: object | None) -> Settle:
        now = self._clock.now()
        try:
            order = decode(OrderSubmitted, body, self._settings.max_order_bytes)
        except ValidationFailed as exc:
            return Settle.dead_letter("InvalidMessage", exc.reason, readable_order_id(body))
        telemetry.annotate(**{telemetry.ORDER_ID: order.OrderID})

        if order.AppId != app_id:
            # Only `app_id` can send to this queue (docs/adr/010-ingress-queue-identity.md).
            reason = (
                f"order arrived on the ingress queue of {app_id!r} but names AppId {order.AppId!r}"
            )
            return Settle.dead_letter("AppIdMismatch", reason, order.OrderID)

        allowed = self._settings.reply_queues.get(app_id)
        if allowed != order.ReplyTo:
            reason = f"application {app_id!r} may not use reply queue {order.ReplyTo!r}" + (
                f" (its queue is {allowed!r})" if allowed else " (application not registered)"
            )
            return Settle.dead_letter("ReplyQueueNotAllowed", reason, order.OrderID)

        count, index = self._settings.shard_count, self._settings.shard_index
        owner = shard_of(order.AppId, order.OrderID, count)
        if owner != index:
            # Accepted here, it would have a second record and run (ADR 020e).
            reason = (
                f"order {order.OrderID!r} of {app_id!r} belongs to shard {owner} of {count} "
                f"(domain.shards.shard_of); this is shard {index}: send it to shard {owner}'s "
                "ingress queue"
            )
            return Settle.dead_letter("WrongShard", reason, order.OrderID)

        key = order_key(order.AppId, order.OrderID)
        telemetry.annotate(**{telemetry.ORDER_ID: key})
        pending = await self._backlog.pending()
        if pending is not None and pending > self._settings.pending_backlog_limit:
            rejected = await self._reject(order, key, now)
            if rejected is not None:
                return rejected
        return await self._admit(order, key, now, client)

    async def _admit(
        self, order: OrderSubmitted, key: str, now: datetime, client: object | None
    ) -> Settle:
        try:
            mine = await self._orders.store(order, key)
        except ConflictError as exc:
            await self._unless_in_the_way(order, key, exc.version)
            return await self._conflict(order, key, exc.fields)

        # The record keeps Submit's trace context for its first attempt (ADR 015).
        record, etag, created = await self._store.create_if_absent(
            sm.new_record(order, now, self._steps, key).model_copy(
                update={"Trace": telemetry.inject() or None}
            )
        )
        if not created and record.OrderDigest != order.digest():
            if record.ProcessState is ProcessState.REJECTED:
                # A rejected order has no orders-DB document: this one is this
                # delivery's. Only that version: the Rejected order may have put its own since.
                await self._orders.discard_version(key, mine)
            return await self._conflict(order, key)
        if created:
            log.info("order accepted", extra={"order_id": key})
            telemetry.app_metrics().received.add(1, {"outcome": "accepted", "app.id": order.AppId})

        if record.ProcessState is ProcessState.REJECTED:
            record, etag = await self._readmit(order, key, now)
            # A rejection of the same order racing this delivery may have taken
            # the document this one wrote (simulation seed 40000990, 50 orders:
            # two deliveries at once, one rejecting): the readmitted order needs it.
            await self._orders.store(order, key)
        fast_path = (
            client is not None
            and record.ProcessState is ProcessState.PENDING
            and record.LockedBy is None
        )
        if not record.ReceivedSent:
            await self._status.send(order.ReplyTo, key, StatusKind.RECEIVED, now)
            if fast_path and await self._fast_start(
                client, record, etag, order, received_sent_at=now
            ):
                return Settle.complete(key)  # the claim marked Received sent too: one write
            record = sm.mark_received_sent(record, now)
            try:
                etag = await self._store.replace(record, etag)
            except StaleError:
                # Written since our create (claimed, or marked by a racing delivery).
                record, etag = await self._store.update(
                    key, lambda r: sm.mark_received_sent(r, now), ANY_OWNER
                )
            fast_path = (
                fast_path
                and record.ProcessState is ProcessState.PENDING
                and record.LockedBy is None
            )
        if fast_path:
            await self._fast_start(client, record, etag, order)
        return Settle.complete(key)

    async def _readmit(
        self, order: OrderSubmitted, key: str, now: datetime
    ) -> tuple[OrderState, str]:
        """A Rejected order sent again now that the backlog has room starts
        over on the same record; the orders write stays."""
        steps = self._steps

        def again(r: OrderState) -> OrderState:
            return sm.readmit(r, now, steps) if r.ProcessState is ProcessState.REJECTED else r

        record, etag = await self._store.update(key, again, ANY_OWNER)
        log.info("rejected order sent again and admitted", extra={"order_id": key})
        telemetry.app_metrics().received.add(1, {"outcome": "readmitted", "app.id": order.AppId})
        return record, etag

    async def _fast_start(
        self,
        client,
        record: OrderState,
        etag: str,
        order: OrderSubmitted,
        received_sent_at: datetime | None = None,
    ) -> bool:
        """Claim and start the order now, before settling. Never raises; False
        leaves it to the timer Starter (and, with `received_sent_at`, marking
        Received sent to the caller). MAX_PROCESSING is checked against the
        gauge, the count of whichever host ran the timer Starter last."""
        if self._start is None:
            return False
        processing = await self._backlog.processing()
        if processing is not None and processing >= self._settings.max_processing:
            return False
        # The attempt claimed here continues this order's trace.
        with telemetry.order_scope(record.id):
            return await self._start(client, record, etag, order, received_sent_at) is not None

    async def _reject(self, order: OrderSubmitted, key: str, now: datetime) -> Settle | None:
        """Reject a new order; None if the order was admitted before (a
        redelivery, or a delivery racing this one): the caller carries on."""
        reason = f"backlog above {self._settings.pending_backlog_limit} pending orders; try later"
        # An orders-DB document without a record is an order admitted first,
        # by a delivery that died: a copy with other data conflicts with it.
        stored: OrderSubmitted | None
        version: str | None
        try:
            stored, version = await self._orders.get_version(key)
        except (NotFoundError, PermanentError):
            stored = version = None
        if stored is not None and stored.digest() != order.digest():
            await self._unless_in_the_way(order, key, version)
            return await self._conflict(order, key)
        record, _, created = await self._store.create_if_absent(
            sm.rejected_record(order, now, reason, key)
        )
        if record.OrderDigest != order.digest():
            if record.ProcessState is ProcessState.REJECTED:
                # A rejected order has no orders-DB document: one there is this
                # copy's own, from a delivery that died (even if the read missed it).
                await self._orders.discard(key)
            return await self._conflict(order, key)
        if record.ProcessState is not ProcessState.REJECTED:
            return None
        if created:
            log.warning("order rejected: %s", reason, extra={"order_id": key})
            telemetry.app_metrics().received.add(1, {"outcome": "rejected", "app.id": order.AppId})
        # The client hears first: a clean-up that keeps failing (Cosmos 429s
        # until the lineage dead-letters) must not leave the Rejected record
        # unannounced (simulation seed 26000797, 50 orders).
        settle = await self._send_rejected(order, record, now)
        # A document an earlier admitted delivery wrote goes with the rejection.
        await self._orders.discard(key)
        # Unless a delivery admitting the same order readmitted the record
        # meanwhile (seed 40000990): it keeps the order's document.
        try:
            current, _ = await self._store.read(key)
        except (NotFoundError, PermanentError):
            return settle
        if current.ProcessState is not ProcessState.REJECTED:
            await self._orders.store(order, key)
        return settle

    async def _send_rejected(
        self, order: OrderSubmitted, record: OrderState, now: datetime
    ) -> Settle:
        """(Re)send Rejected, on every delivery (its stable message id makes a
        repeat a duplicate). A failed send parks the status in the record's
        outbox for the Starter instead of failing the delivery, which a reply
        queue refusing for hours would dead-letter unsent."""
        try:
            await self._status.send(
                order.ReplyTo, record.id, StatusKind.REJECTED, now, detail=record.LastError
            )
        except Exception as exc:  # any send failure: parked, as the outbox does
            log.warning(
                "Rejected status of order %s not sent (%s); parked in the outbox",
                record.id,
                exc,
                extra={"order_id": record.id},
            )
            await self._store.update(record.id, lambda r: sm.park_rejected(r, now), ANY_OWNER)
        return Settle.complete(record.id)

    async def _unless_in_the_way(
        self, order: OrderSubmitted, key: str, version: str | None = None
    ) -> None:
        """The orders DB holds other data under this key. If the record is this
        very order, Rejected, that document is a conflicting copy's left by a
        delivery that died: take it back (`version` only) and raise
        TransientError to try again, instead of dead-lettering the order as a
        conflict with every later resend. If the record is another order,
        Rejected, and the document is that order's own, its rejecting delivery
        died before taking it back (a Rejected order has no document: scale
        seed 63023640, 2 orders): it goes, and this message conflicts all the
        same (the caller dead-letters it)."""
        try:
            record, _ = await self._store.read(key)
        except (NotFoundError, PermanentError):
            return
        if record.ProcessState is not ProcessState.REJECTED:
            return
        if record.OrderDigest != order.digest():
            await self._take_back_rejected(record, key)
            return
        if version is None:  # a conflict that did not say which version was in the way
            with contextlib.suppress(NotFoundError, PermanentError):
                _, version = await self._orders.get_version(key)
        if version is not None:
            await self._orders.discard_version(key, version)
        raise TransientError(
            f"order {order.OrderID} of {order.AppId}: a conflicting copy's document was in "
            "the orders DB; taken back, trying again"
        )

    async def _take_back_rejected(self, record: OrderState, key: str) -> None:
        """The Rejected `record`'s own document, left by its rejecting delivery,
        goes (that version only); a delivery of that order readmitting it
        meanwhile needs it, so it is put back if the record is no longer
        Rejected (that delivery also stores it after readmitting)."""
        try:
            stored, version = await self._orders.get_version(key)
        except (NotFoundError, PermanentError):
            return
        if stored.digest() != record.OrderDigest:
            return  # a third copy's: its own deliveries take it back
        await self._orders.discard_version(key, version)
        try:
            current, _ = await self._store.read(key)
        except (NotFoundError, PermanentError):
            return
        if current.ProcessState is not ProcessState.REJECTED:
            await self._orders.store(stored, key)

    async def _conflict(
        self, order: OrderSubmitted, key: str, fields: list[str] | None = None
    ) -> Settle:
        """The application sent another order under an OrderID it has used."""
        if fields is None:
            fields = await self._differing_fields(order, key)
        description = (
            f"order {order.OrderID} of {order.AppId} exists with different data in: "
            f"{', '.join(fields) or 'unknown'}; nothing was overwritten"
        )
        return Settle.dead_letter("OrderConflict", description, key)

    async def _differing_fields(self, order: OrderSubmitted, key: str) -> list[str]:
        try:
            stored = await self._orders.get(key)
        except (NotFoundError, PermanentError):
            return []
        return order.differing_fields(stored)
