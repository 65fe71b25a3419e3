"""Status updates to each submitting application's own reply queue, and the
outbox that makes terminal statuses survive a failed send
(docs/adr/001-status-outbox.md)."""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime

from adapters import telemetry
from adapters.clock import SYSTEM_CLOCK, Clock
from adapters.ports import ANY_OWNER, MessagePublisher, StateStore
from adapters.servicebus import ALERTS_QUEUE
from domain import state_machine as sm
from domain.codec import encode
from domain.errors import NotFoundError, StaleError
from domain.ids import client_order_id, outbox_alert_message_id, status_message_id
from domain.models import OperatorAlert, OrderState, PendingStatus, StatusKind, StatusUpdate

log = logging.getLogger(__name__)


class StatusReporter:
    def __init__(self, publisher: MessagePublisher) -> None:
        self._publisher = publisher

    async def send_alert(self, alert: OperatorAlert, message_id: str) -> None:
        """An operator alert from a status outbox entry; raises if not sent."""
        await self._publisher.send(ALERTS_QUEUE, encode(alert), message_id, {"Kind": alert.Kind})

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
        """A status of the order `key` (domain.ids.order_key; the message
        carries the client's own OrderID). `qualifier` separates repeated
        statuses of one kind (a step, an attempt) so that duplicate detection
        drops only true re-sends."""
        message_id = status_message_id(key, status.value, qualifier or (step or ""))
        detail = sm.short_text(detail, sm.ERROR_LIMIT)
        pending = PendingStatus(
            Status=status, MessageId=message_id, Detail=detail, Step=step, At=now
        )
        await self.send_pending(reply_to, key, pending)

    async def send_pending(self, reply_to: str, key: str, pending: PendingStatus) -> None:
        """Send an outbox entry as it was written: same message id, same
        timestamp, so every retry is the same message."""
        # Callers name the order by its key; the client knows only its own OrderID.
        order_id, status = client_order_id(key), pending.Status.value
        update = StatusUpdate(
            OrderID=order_id,
            Status=pending.Status,
            Detail=pending.Detail,
            Step=pending.Step,
            Timestamp=pending.At,
        )
        await self._publisher.send(
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


class StatusOutbox:
    """Delivers a record's pending terminal status and clears it once sent.

    Called right after the write that made the record terminal (by the
    orchestration's report_status activity, or the Supervisor), and again by
    the Starter for entries still there after a grace period; all of them
    send the entry's own message id, so a status sent twice is dropped by the
    reply queue's duplicate detection. A failed send leaves the entry (with
    one more try counted) for the next caller."""

    def __init__(
        self,
        store: StateStore,
        reporter: StatusReporter,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """A Failed or CompensationFailed entry carries its operator alert:
        the alert goes first and the entry is cleared only once both are
        sent, so a failed alert send is retried like a failed status send
        (never only logged). The alert's message id is derived from the
        entry's, so a repeat (the alert went out, the status did not) is
        dropped by duplicate detection."""
        self._store = store
        self._reporter = reporter
        self._clock = clock

    async def deliver(self, record: OrderState, etag: str | None = None) -> bool:
        """Send `record`'s pending status (and its alert), then clear it. True
        when there is nothing left to send; False when a send failed (the
        entry stays). With the etag the record was read at, clearing costs
        one replace."""
        pending = record.PendingStatus
        if pending is None:
            return True
        try:
            await self._send_alert(record, pending)
            await self._reporter.send_pending(record.ReplyTo, record.id, pending)
        except Exception as exc:  # any send failure: the entry stays for the next try
            log.warning(
                "status %s of order %s not sent (%s); it stays in the outbox",
                pending.Status.value,
                record.id,
                exc,
                extra={"order_id": record.id},
            )
            # The try count is bookkeeping: failing to write it must not pass
            # for a sent status (the Starter would end its back-off and start
            # the queue's spell of refusals over: seed 12000745).
            try:
                await self._store.update(
                    record.id, lambda r: sm.status_send_failed(r, pending.MessageId), ANY_OWNER
                )
            except (StaleError, NotFoundError):
                pass
            except Exception:
                log.warning("try count of order %s's status not written", record.id, exc_info=True)
            return False
        try:
            await self._clear(record, pending.MessageId, etag)
        except Exception:  # sent; a later delivery re-sends the same id, which is dropped
            log.exception("status of order %s sent but not cleared from the outbox", record.id)
        return True

    async def _send_alert(self, record: OrderState, pending: PendingStatus) -> None:
        """The entry's operator alert; raises when the send fails (unlike
        reporting.Alerts, which only logs), so the entry stays."""
        kind = ALERT_OF_STATUS.get(pending.Status)
        if kind is None:
            return
        reason = pending.Detail or kind
        alert = OperatorAlert(Kind=kind, OrderID=record.id, Reason=reason, Timestamp=pending.At)
        log.error(
            "operator alert %s for order %s: %s",
            kind,
            record.id,
            reason,
            extra={
                "alert_kind": kind,
                "order_id": record.id,
                "custom_dimensions": {"AlertKind": kind},
            },
        )
        await self._reporter.send_alert(
            alert, outbox_alert_message_id(record.id, pending.MessageId)
        )

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
