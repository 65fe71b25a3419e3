"""Operator alerts: a structured log event (which Application Insights alert
rules match on) and a message on the `alerts` queue that the operator tool tails.

An alert must never make the caller fail: if the queue cannot be reached the
log event still stands, and the error is logged."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from adapters.ports import MessagePublisher
from domain.codec import encode
from domain.errors import DomainError
from domain.models import OperatorAlert

ALERTS_QUEUE = "alerts"

log = logging.getLogger("orders.alerts")


class Alerts:
    def __init__(self, publisher: MessagePublisher) -> None:
        self._publisher = publisher

    async def raise_alert(
        self, kind: str, reason: str, now: datetime, order_id: str | None = None
    ) -> OperatorAlert:
        alert = OperatorAlert(Kind=kind, OrderID=order_id, Reason=reason[:2000], Timestamp=now)
        log.error(
            "operator alert %s for order %s: %s",
            kind,
            order_id,
            reason,
            extra={"alert_kind": kind, "order_id": order_id, "custom_dimensions": {"AlertKind": kind}},
        )
        try:
            await self._publisher.send(
                ALERTS_QUEUE, encode(alert), f"alert/{uuid.uuid4()}", {"Kind": kind}
            )
        except DomainError:
            log.exception("alert %s for order %s could not be queued", kind, order_id)
        return alert
