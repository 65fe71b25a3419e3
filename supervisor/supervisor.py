"""One Supervisor run: bounded pages of expired Processing records (invariant
6): each page reads at most `page_size` candidates and saves its cursor, and a
run goes on while pages make progress, for `max_pages` and `budget` (ADR 018c).
A recovery is conditional on the LockedBy read (and the etag): with several
supervisors an expiry is recovered once. `slack`, added to CompleteBy, covers
a supervisor's clock running ahead."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from adapters import telemetry
from adapters.clock import SYSTEM_CLOCK, Clock
from adapters.ports import StateStore
from domain import state_machine as sm
from domain.errors import NotFoundError, PermanentError, StaleError
from domain.models import ProcessState
from reporting import Alerts, StatusOutbox, StatusReporter
from reporting.alerts import alert_unreadable
from supervisor.sources import Candidate

log = logging.getLogger(__name__)


class CheckpointStore(Protocol):
    async def load(self) -> str | None: ...

    async def save(self, cursor: str | None) -> None: ...


class ExpiredSource(Protocol):
    async def page(
        self, upper: datetime, max_items: int, cursor: str | None
    ) -> tuple[list[Candidate], str | None, int]: ...


@dataclass
class SupervisorReport:
    read: int = 0
    examined: int = 0
    recovered: int = 0
    long_retry: int = 0
    failed: int = 0
    skipped: int = 0
    status_unsent: int = 0
    pass_finished: bool = False
    pages: int = 0
    requests: int = 0
    request_charge: float = 0.0
    failed_orders: list[str] = field(default_factory=list)
    unreadable: int = 0  # documents skipped (and alerted) because this version cannot read them


class Supervisor:
    def __init__(
        self,
        store: StateStore,
        source: ExpiredSource,
        checkpoints: CheckpointStore,
        status: StatusReporter,
        alerts: Alerts,
        policy: sm.RetryPolicy,
        page_size: int,
        slack: timedelta = timedelta(seconds=5),
        clock: Clock = SYSTEM_CLOCK,
        charges=None,
        *,
        max_pages: int = 1,
        budget: timedelta | None = None,
    ) -> None:
        """`charges`: the request-charge recorder of this run's own adapters,
        or None. `budget`: how long a run starts new pages (None: no limit)."""
        if max_pages < 1:
            raise ValueError(f"max_pages must be at least 1, not {max_pages}")
        self._max_pages = max_pages
        self._budget = budget
        self._charges = charges
        self._store = store
        self._source = source
        self._checkpoints = checkpoints
        self._status = status
        self._alerts = alerts
        self._policy = policy
        self._page_size = page_size
        self._slack = slack
        self._clock = clock
        self._outbox = StatusOutbox(store, status, clock)

    async def run(self) -> SupervisorReport:
        started = now = self._clock.now()
        cursor = await self._checkpoints.load()
        report = SupervisorReport()
        try:
            while True:
                cursor, more = await self._page(now, cursor, report)
                report.pages += 1
                if not more or report.pages >= self._max_pages:
                    break
                now = self._clock.now()
                if self._budget is not None and now - started >= self._budget:
                    break
        except Exception:
            # Alerted even when the run fails: it may have been set aside, and
            # no run meets it again before UNREADABLE_RETRY.
            await alert_unreadable(self._alerts, self._store.unreadable, self._clock.now())
            raise
        report.pass_finished = cursor is None
        report.unreadable = await alert_unreadable(self._alerts, self._store.unreadable, now)
        if self._charges is not None:
            report.requests, report.request_charge = self._charges.calls, self._charges.total
        log.info(
            "supervisor: pages=%d read=%d examined=%d recovered=%d long_retry=%d failed=%d "
            "skipped=%d requests=%d request_charge=%.1f",
            report.pages,
            report.read,
            report.examined,
            report.recovered,
            report.long_retry,
            report.failed,
            report.skipped,
            report.requests,
            report.request_charge,
            extra={
                "custom_dimensions": {
                    k: v for k, v in report.__dict__.items() if k != "failed_orders"
                }
            },
        )
        _record_metrics(report)
        return report

    async def _page(
        self, now: datetime, cursor: str | None, report: SupervisorReport
    ) -> tuple[str | None, bool]:
        """One page from `cursor`, its checkpoint saved: (the cursor saved,
        whether another page may follow at once)."""
        start, handled = cursor, _handled(report)
        candidates, cursor, read = await self._source.page(
            now - self._slack, self._page_size, cursor
        )
        report.read += read
        rewind: str | None = None
        for candidate in candidates:
            report.examined += 1
            if await self._recover(candidate.record.id, candidate.record.LockedBy, now, report):
                await candidate.done()
            elif rewind is None and candidate.position is not None:
                # The read may have lagged a live attempt's newer deadline (rule 3).
                rewind = candidate.position
        if rewind is not None:
            cursor = rewind
        await self._checkpoints.save(cursor)
        # Another page only after progress: something recovered (the index's
        # cursor may stay put), or a full page and the cursor moved on.
        if rewind is not None or cursor is None:
            return cursor, False
        progress = _handled(report) > handled or (cursor != start and read >= self._page_size)
        return cursor, progress

    async def _recover(self, order_id: str, locked_by: str | None, now: datetime, report) -> bool:
        """Recover one expired attempt; False if it was skipped."""

        def recover(record):
            return sm.recover_expired(record, locked_by, now, self._policy, self._slack)

        try:
            record, etag = await self._store.update(order_id, recover, locked_by)
        except (StaleError, sm.IllegalTransition, NotFoundError, PermanentError) as exc:
            # Another supervisor got there first, the attempt finished, or unreadable.
            report.skipped += 1
            log.debug("supervisor skipped %s: %s", order_id, exc)
            return False
        if record.ProcessState is ProcessState.ERROR:
            report.failed += 1
            report.failed_orders.append(order_id)
            # In the outbox with Error: a failed send is the Starter's to retry.
            if not (await self._outbox.deliver(record, etag)).status_sent:
                report.status_unsent += 1
        elif record.NotBefore is not None:
            report.long_retry += 1
        else:
            report.recovered += 1
        return True


def _handled(report: SupervisorReport) -> int:
    return report.recovered + report.long_retry + report.failed


def _record_metrics(report: SupervisorReport) -> None:
    """The run's figures as OpenTelemetry metrics (alert rules read the log line)."""
    m = telemetry.app_metrics()
    for outcome in ("recovered", "long_retry", "failed"):
        count = getattr(report, outcome)
        if count:
            m.recoveries.add(count, {"outcome": outcome})
    m.scan_read.record(report.read)
    if report.requests:
        m.scan_charge.record(report.request_charge)
