"""Status updates to each submitting application's own reply queue."""

from __future__ import annotations

import logging
from datetime import datetime

from adapters.ports import MessagePublisher
from domain.codec import encode
from domain.ids import status_message_id
from domain.models import StatusKind, StatusUpdate

log = logging.getLogger(__name__)


class StatusReporter:
    def __init__(self, publisher: MessagePublisher) -> None:
        self._publisher = publisher

    async def send(
        self,
        reply_to: str,
        order_id: str,
        status: StatusKind,
        now: datetime,
        detail: str | None = None,
        step: str | None = None,
        qualifier: str = "",
    ) -> None:
        """`qualifier` separates repeated statuses of one kind (a step, an
        attempt) so that duplicate detection drops only true re-sends."""
        update = StatusUpdate(OrderID=order_id, Status=status, Detail=detail, Step=step, Timestamp=now)
        message_id = status_message_id(order_id, status.value, qualifier or (step or ""))
        await self._publisher.send(
            reply_to, encode(update), message_id, {"OrderID": order_id, "Status": status.value}
        )
        log.info(
            "status sent",
            extra={"order_id": order_id, "status": status.value, "queue": reply_to, "step": step},
        )
