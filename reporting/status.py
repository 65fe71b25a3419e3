"""Status updates to each submitting application's own reply queue, and the
outbox that makes terminal statuses survive a failed send
(docs/adr/001-status-outbox.md)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from adapters import telemetry
from adapters.clock import SYSTEM_CLOCK, Clock
from adapters.ports import ANY_OWNER, MessagePublisher, StateStore
from domain import state_machine as sm
from domain.codec import encode
from domain.errors import NotFoundError, StaleError
from domain.ids import client_order_id, outbox_alert_message_id, status_message_id
from domain.models import OperatorAlert, OrderState, PendingStatus, StatusKind, StatusUpdate
from reporting.alerts import log_alert, send_alert

log = logging.getLogger(__name__)


class StatusReporter:
    def __init__(self, publisher: MessagePublisher) -> None:
        self.publisher = publisher

    async def send(
        self,
        reply_to: str,
        key: str,
        status: StatusKind,
        now: datetime,
        detail: str | None = None,
        step: str | None = None,
        qualifier: str = "",
    ) -> None:
        """A status of the order `key` (the message carries the client's own
        OrderID); `qualifier` separates repeated statuses of one kind."""
        message_id = status_message_id(key, status.value, qualifier or (step or ""))
        detail = sm.short_text(detail, sm.ERROR_LIMIT)
        pending = PendingStatus(
            Status=status, MessageId=message_id, Detail=detail, Step=step, At=now
        )
        await self.send_pending(reply_to, key, pending)

    async def send_pending(self, reply_to: str, key: str, pending: PendingStatus) -> None:
        """Send an outbox entry as written, so every retry is the same message."""
        order_id, status = client_order_id(key), pending.Status.value
        update = StatusUpdate(
            OrderID=order_id,
            Status=pending.Status,
            Detail=pending.Detail,
            Step=pending.Step,
            Timestamp=pending.At,
        )
        await self.publisher.send(
            reply_to, encode(update), pending.MessageId, {"OrderID": order_id, "Status": status}
        )
        log.info(
            "status sent",
            extra={"order_id": key, "status": status, "queue": reply_to, "step": pending.Step},
        )
        telemetry.count_terminal_status(status)


# The operator alert a terminal status's outbox entry carries.
ALERT_OF_STATUS = {
    StatusKind.FAILED: "OrderError",
    StatusKind.COMPENSATION_FAILED: "CompensationFailed",
}


# What became of an outbox entry's operator alert (Delivery.alert).
AlertOutcome = Literal["sent", "refused", "skipped", "none"]


@dataclass(frozen=True)
class Delivery:
    """What delivering an outbox entry did."""

    status_sent: bool  # the client has its status (now or earlier)
    # Its operator alert: "sent", "refused" (the alerts queue refused it; the
    # entry keeps it), "skipped" (not tried: the caller knows the alerts queue
    # refuses) or "none" (no alert owed, or sent before).
    alert: AlertOutcome = "none"

    @property
    def done(self) -> bool:
        """Nothing is left: the entry is cleared (or being cleared)."""
        return self.status_sent and self.alert in ("sent", "none")


class StatusOutbox:
    """Delivers a record's pending terminal status, and its operator alert
    first for Failed and CompensationFailed, then clears the entry; a failed
    send leaves it (one more try counted) for the next caller, the Starter at
    last (docs/adr/001-status-outbox.md). A refused alert never holds the
    status back: the status goes, and the entry stays for the alert alone."""

    def __init__(
        self,
        store: StateStore,
        reporter: StatusReporter,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._store = store
        self._reporter = reporter
        self._clock = clock

    async def deliver(
        self, record: OrderState, etag: str | None = None, alert: bool = True
    ) -> Delivery:
        """Send `record`'s pending status (its alert first, unless `alert` is
        False: the alerts queue is known to refuse), then clear the entry.
        With the etag read, clearing costs one replace."""
        pending = record.PendingStatus
        if pending is None:
            return Delivery(status_sent=True)
        owed = pending.Status in ALERT_OF_STATUS
        outcome: AlertOutcome = "none" if not owed else "sent" if alert else "skipped"
        if outcome == "sent":
            try:
                await self._send_alert(record, pending)
            except Exception as exc:  # the operators' queue: the client's status goes on
                outcome = "refused"
                log.warning(
                    "alert of order %s's status %s not sent (%s); it stays in the outbox",
                    record.id,
                    pending.Status.value,
                    exc,
                    extra={"order_id": record.id},
                )
        if not pending.Sent:
            try:
                await self._reporter.send_pending(record.ReplyTo, record.id, pending)
            except Exception as exc:  # any send failure: the entry stays for the next try
                log.warning(
                    "status %s of order %s not sent (%s); it stays in the outbox",
                    pending.Status.value,
                    record.id,
                    exc,
                    extra={"order_id": record.id},
                )
                # Bookkeeping: failing to write it must not pass for a sent status.
                await self._note(record, lambda r: sm.status_send_failed(r, pending.MessageId))
                return Delivery(status_sent=False, alert=outcome)
        delivery = Delivery(status_sent=True, alert=outcome)
        if not delivery.done:
            if not pending.Sent:
                await self._note(record, lambda r: sm.mark_alert_left(r, pending.MessageId))
            return delivery
        try:
            await self._clear(record, pending.MessageId, etag)
        except Exception:  # sent; a later delivery re-sends the same id, which is dropped
            log.exception("status of order %s sent but not cleared from the outbox", record.id)
        return delivery

    async def _note(self, record: OrderState, change) -> None:
        """Write down what a delivery left (a try, a status sent without its
        alert); failing to write it leaves the entry as it was, to be sent again."""
        try:
            await self._store.update(record.id, change, ANY_OWNER)
        except (StaleError, NotFoundError):
            pass
        except Exception:
            log.warning("outbox entry of order %s not updated", record.id, exc_info=True)

    async def _send_alert(self, record: OrderState, pending: PendingStatus) -> None:
        """The entry's operator alert (its id derived from the entry's); raises
        when the send fails, so the entry stays."""
        kind = ALERT_OF_STATUS.get(pending.Status)
        if kind is None:
            return
        reason = pending.Detail or kind
        alert = OperatorAlert(Kind=kind, OrderID=record.id, Reason=reason, Timestamp=pending.At)
        log_alert(alert)
        message_id = outbox_alert_message_id(record.id, pending.MessageId)
        await send_alert(self._reporter.publisher, alert, message_id)

    async def _clear(self, record: OrderState, message_id: str, etag: str | None) -> None:
        now = self._clock.now()
        if etag is not None:
            try:
                await self._store.replace(sm.mark_status_sent(record, message_id, now), etag)
                return
            except StaleError:
                pass  # changed since read: clear on the current version below
        with contextlib.suppress(NotFoundError):
            await self._store.update(
                record.id, lambda r: sm.mark_status_sent(r, message_id, now), ANY_OWNER
            )
