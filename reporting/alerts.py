"""Operator alerts: a structured log event (which Application Insights alert
rules match on) and a message on the `alerts` queue that the operator tool tails.

An alert must never make the caller fail: if the queue cannot be reached the
log event still stands, and the error is logged."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, MutableSequence
from datetime import datetime

from adapters.ports import MessagePublisher
from adapters.servicebus import ALERTS_QUEUE
from domain.codec import encode
from domain.errors import DomainError, TransientError
from domain.models import OperatorAlert

log = logging.getLogger("orders.alerts")


class Alerts:
    def __init__(
        self, publisher: MessagePublisher, new_id: Callable[[], uuid.UUID] = uuid.uuid4
    ) -> None:
        """`new_id`: the message id of an alert that names none (a random one;
        the simulation draws them from its seed)."""
        self._publisher = publisher
        self._new_id = new_id

    async def raise_alert(
        self,
        kind: str,
        reason: str,
        now: datetime,
        order_id: str | None = None,
        *,
        message_id: str | None = None,
        queue: str | None = None,
        alert_id: str | None = None,
        required: bool = False,
    ) -> OperatorAlert:
        """`reason` is the description; for a dead letter `kind` is its reason
        and `message_id`/`queue` name it. Text is cleaned to the contracts'
        text policy (it may quote a client), never refused.

        `alert_id` makes the queued alert's message id stable, so raising the
        same alert again (after a failed send) is dropped as a duplicate by the
        alerts queue. With `required`, a failed send raises TransientError after
        the log event instead of being swallowed: the caller (the message gate)
        then keeps the message so that its next delivery alerts again."""
        alert = OperatorAlert(
            Kind=kind,
            OrderID=order_id,
            Reason=reason or "(no description)",
            Timestamp=now,
            MessageId=message_id,
            Queue=queue,
        )
        log.error(
            "operator alert %s for %s: %s",
            kind,
            f"order {alert.OrderID}" if alert.OrderID else f"message {alert.MessageId or '?'}",
            alert.Reason,
            extra={
                "alert_kind": kind,
                "order_id": alert.OrderID,
                "message_id": alert.MessageId,
                "custom_dimensions": {"AlertKind": kind},
            },
        )
        try:
            await self._publisher.send(
                ALERTS_QUEUE, encode(alert), alert_id or f"alert/{self._new_id()}", {"Kind": kind}
            )
        except DomainError as exc:
            log.exception("alert %s for order %s could not be queued", kind, order_id)
            if required:
                raise TransientError(f"alert {kind} could not be queued: {exc}") from exc
        return alert


async def alert_unreadable(
    alerts: Alerts | None, unreadable: MutableSequence[tuple[str, str]], now: datetime
) -> int:
    """One UnreadableRecord alert per document a run could not read (a field or
    value this version does not know, a hand edit, garbage), and empty the list.
    The alert's id comes from the document and the reason, so the same document
    found again by later runs is dropped by the alerts queue's duplicate
    detection: one page per incident, not one per run. Returns how many."""
    found = list(dict.fromkeys(unreadable))
    del unreadable[:]
    for doc_id, reason in found:
        digest = hashlib.sha256(f"{doc_id}\n{reason}".encode()).hexdigest()[:32]
        text = f"state document {doc_id!r} cannot be read by this version and is skipped: {reason}"
        if alerts is None:
            log.error("operator alert UnreadableRecord (no alert channel): %s", text)
            continue
        try:
            await alerts.raise_alert(
                "UnreadableRecord", text, now, alert_id=f"alert/unreadable/{digest}"
            )
        except Exception:  # noqa: BLE001 - an alert must never end the caller's run
            log.exception("alert UnreadableRecord for %r not sent", doc_id)
    return len(found)
