"""Operator alerts: a structured log event (which the alert rules match on)
and a message on the `alerts` queue. Alerts about queue messages are
aggregated per process, by kind and queue, within a window; alerts about an
order are always their own. What is promised: docs/operations.md, "Alerts".
An alert never makes the caller fail unless it asks (`required`)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable, MutableSequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from adapters.clock import SYSTEM_CLOCK, Clock, Wake, task_wake
from adapters.ports import MessagePublisher
from adapters.servicebus import ALERTS_QUEUE
from domain.codec import encode
from domain.errors import AlertNotQueued, DomainError
from domain.ids import bounded_id
from domain.models import AlertExample, OperatorAlert

log = logging.getLogger("orders.alerts")

WINDOW_SECONDS = 60.0
# Alert ids remembered, so a redelivery is not counted twice: a day of a flood.
SEEN_MAX = 100_000


@dataclass
class _Window:
    """One kind's alerts from one queue after the first sent, until `end`."""

    start: datetime
    end: datetime
    count: int = 0
    first: OperatorAlert | None = None
    last: OperatorAlert | None = None

    def add(self, alert: OperatorAlert) -> None:
        self.count += 1
        self.first = self.first or alert
        self.last = alert


def _remember(ids: OrderedDict[str, None], alert_id: str | None) -> None:
    if alert_id is None:
        return
    ids[alert_id] = None
    if len(ids) > SEEN_MAX:
        ids.popitem(last=False)


def _subject(alert: OperatorAlert) -> str:
    """What the log line names, with an aggregate's count."""
    who = f"order {alert.OrderID}" if alert.OrderID else f"message {alert.MessageId or '?'}"
    return f"{who} ({alert.Count} alerts)" if alert.Count > 1 else who


class Alerts:
    """One per process: N hosts send at most N aggregates per kind, queue and window."""

    def __init__(
        self,
        publisher: MessagePublisher,
        new_id: Callable[[], uuid.UUID] = uuid.uuid4,
        *,
        window: float = WINDOW_SECONDS,
        clock: Clock = SYSTEM_CLOCK,
        wake: Wake | None = None,
        on_counted: Callable[[str, OperatorAlert, str | None], None] | None = None,
    ) -> None:
        """`new_id`: the message id of an alert that names none, and this
        process's name in its aggregates' ids. `on_counted(aggregate id,
        alert, its own alert id)`: told of each alert an aggregate counts."""
        self._publisher = publisher
        self._new_id = new_id
        self._window = timedelta(seconds=window)
        self._clock = clock
        self._on_counted = on_counted
        self._process: str | None = None
        self._windows: dict[tuple[str, str], _Window] = {}
        self._due: dict[str, OperatorAlert] = {}  # aggregates and held alerts, by message id
        # Alert ids counted (or held), and those whose send failed.
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._tried: OrderedDict[str, None] = OrderedDict()
        self._sending: set[str] = set()  # alert ids whose send is under way
        self._retry_at: datetime | None = None  # a refused aggregate is sent again then
        self._flushing = False
        self._retry_armed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = wake or task_wake(clock, self._tasks, "alert flush")

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
        """`reason` is the description (cleaned to the text policy, never
        refused); for a dead letter `kind` is its reason and
        `message_id`/`queue` name it. A stable `alert_id` makes a repeat a
        duplicate, counted once. With `queue`, the alert joins its kind's open
        window if there is one. With `required`, a refused send raises
        AlertNotQueued after the log event; without it, an alert with a
        `queue` is held (`hold`) and one without is given up, logged."""
        alert = OperatorAlert(
            Kind=kind,
            OrderID=order_id,
            Reason=reason or "(no description)",
            Timestamp=now,
            MessageId=message_id,
            Queue=queue,
        )
        if queue is None:
            log_alert(alert)
            try:
                await send_alert(self._publisher, alert, alert_id or f"alert/{self._new_id()}")
            except DomainError:
                log.exception("alert %s for order %s could not be queued", kind, order_id)
            return alert
        await self.flush(now)
        if alert_id is not None and alert_id in self._seen:
            return alert  # counted already: a redelivery of a counted message
        if alert_id is not None and alert_id in self._sending:
            # A redelivery while its first delivery sends it: held, so sent
            # again under its own id (dropped by the queue if the first
            # landed), never counted in a window as well.
            self.hold(alert, alert_id)
            return alert
        window = self._windows.get((kind, queue))
        if window is not None and not (alert_id is not None and alert_id in self._tried):
            self._count(window, alert, alert_id)
            return alert
        # The first of a window, or one whose send failed before (it may
        # have landed: sent again under its own id, which the queue drops
        # if so, never counted a second time in an aggregate).
        log_alert(alert)
        if alert_id is not None:
            self._sending.add(alert_id)
        try:
            await send_alert(self._publisher, alert, alert_id or f"alert/{self._new_id()}")
        except DomainError as exc:
            _remember(self._tried, alert_id)
            if required:
                raise AlertNotQueued(
                    f"alert {kind} could not be queued: {exc}", alert, alert_id
                ) from exc
            log.warning("alert %s for %s not queued, held: %s", kind, _subject(alert), exc)
            self.hold(alert, alert_id)
            return alert
        finally:
            self._sending.discard(alert_id or "")
        _remember(self._seen, alert_id)
        # Looked up again: alerts raised during the send may have opened it.
        if (kind, queue) not in self._windows:
            self._open(kind, queue, now)
        return alert

    def hold(self, alert: object, alert_id: str | None = None) -> None:
        """Keep `alert` (one the queue refused) and send it again, under its
        own id, with each flush until the queue takes it."""
        assert isinstance(alert, OperatorAlert)
        if alert_id is not None and alert_id in self._seen:
            return
        _remember(self._seen, alert_id)
        self._due[alert_id or f"alert/{self._new_id()}"] = alert
        self._arm_retry()

    async def flush(self, now: datetime | None = None, *, everything: bool = False) -> None:
        """Close the windows that have ended (all with `everything`) and send
        every aggregate not yet sent; a refused one is tried a window later."""
        now = now or self._clock.now()
        for key, window in list(self._windows.items()):
            if everything or now >= window.end:
                self._close(key, window)
        if self._flushing or not self._due:
            return  # a flush under way sends what is added meanwhile
        if not everything and self._retry_at is not None and now < self._retry_at:
            return
        self._retry_at = None
        self._flushing = True
        try:
            tried: set[str] = set()
            while self._retry_at is None:
                todo = [(i, a) for i, a in self._due.items() if i not in tried]
                if not todo:
                    break
                for aggregate_id, aggregate in todo:
                    tried.add(aggregate_id)
                    try:
                        await send_alert(self._publisher, aggregate, aggregate_id)
                    except DomainError as exc:
                        log.warning(
                            "alert %s (%d alerts) not queued, kept: %s",
                            aggregate_id,
                            aggregate.Count,
                            exc,
                        )
                        self._retry_at = now + self._window
                        break
                    self._due.pop(aggregate_id, None)
                    if aggregate.Count > 1:  # a held alert was logged when raised
                        log_alert(aggregate)
        finally:
            self._flushing = False
        if self._due and not everything:
            self._arm_retry()

    async def close(self) -> None:
        """At shutdown: send every open window's aggregate (once)."""
        for task in list(self._tasks):
            task.cancel()
        await self.flush(everything=True)

    # --- the windows --------------------------------------------------------------

    def _open(self, kind: str, queue: str, now: datetime) -> _Window:
        window = _Window(now, now + self._window)
        self._windows[(kind, queue)] = window
        self._wake(
            self._window.total_seconds(), functools.partial(self._ends, (kind, queue), window)
        )
        return window

    async def _ends(self, key: tuple[str, str], window: _Window) -> None:
        """The wake at `window`'s end closes it whatever the clock says (a
        timer may fire early; the raiser's clock is not the flusher's)."""
        if self._windows.get(key) is window:
            self._close(key, window)
        await self.flush()

    def _close(self, key: tuple[str, str], window: _Window) -> None:
        del self._windows[key]
        if window.count:
            self._due[self._aggregate_id(key, window)] = self._aggregate(key, window)

    def _arm_retry(self) -> None:
        """One wake at a time to send again what the queue refused."""
        if self._retry_armed:
            return
        self._retry_armed = True

        async def retry() -> None:
            self._retry_armed = False
            self._retry_at = None
            await self.flush()

        self._wake(self._window.total_seconds(), retry)

    def _count(self, window: _Window, alert: OperatorAlert, alert_id: str | None) -> None:
        window.add(alert)
        _remember(self._seen, alert_id)
        log.debug("alert %s for %s counted", alert.Kind, _subject(alert))
        if self._on_counted is not None:
            key = (alert.Kind, alert.Queue or "")
            self._on_counted(self._aggregate_id(key, window), alert, alert_id)

    def _aggregate_id(self, key: tuple[str, str], window: _Window) -> str:
        if self._process is None:
            self._process = str(self._new_id())
        kind, queue = key
        return bounded_id(
            f"alert/aggregate/{queue}/{kind}/{self._process}/{window.start.isoformat()}", "alert/"
        )

    @staticmethod
    def _aggregate(key: tuple[str, str], window: _Window) -> OperatorAlert:
        kind, queue = key
        first, last = window.first, window.last
        assert first is not None  # a window with a count has both
        assert last is not None
        return OperatorAlert(
            Kind=first.Kind,
            OrderID=first.OrderID,
            Reason=(
                f"{window.count} {kind} alerts on {queue} from "
                f"{first.Timestamp.isoformat()} to {last.Timestamp.isoformat()} "
                f"(first and last shown); the first: {first.Reason}"
            ),
            Timestamp=first.Timestamp,
            MessageId=first.MessageId,
            Queue=first.Queue,
            Count=window.count,
            Last=AlertExample(
                OrderID=last.OrderID,
                Reason=last.Reason,
                Timestamp=last.Timestamp,
                MessageId=last.MessageId,
            ),
        )


async def send_alert(publisher: MessagePublisher, alert: OperatorAlert, message_id: str) -> None:
    """`alert` onto the alerts queue, its Kind a property; raises if not sent."""
    await publisher.send(ALERTS_QUEUE, encode(alert), message_id, {"Kind": alert.Kind})


def log_alert(alert: OperatorAlert) -> None:
    """The alert's log event, the line infra/app/alerts.bicep's rules parse."""
    log.error(
        "operator alert %s for %s: %s",
        alert.Kind,
        _subject(alert),
        alert.Reason,
        extra={
            "alert_kind": alert.Kind,
            "order_id": alert.OrderID,
            "message_id": alert.MessageId,
            "custom_dimensions": {"AlertKind": alert.Kind, "AlertCount": alert.Count},
        },
    )


async def alert_unreadable(
    alerts: Alerts | None, unreadable: MutableSequence[tuple[str, str]], now: datetime
) -> int:
    """One UnreadableRecord alert per document a run could not read, and empty
    the list; how many. The alert id comes from the document and the reason,
    so later runs finding it again page no one again."""
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
