"""One Supervisor run: bounded pages of expired Processing records.

Bounded cost (invariant 6): each page reads at most `page_size` candidates
from its source (supervisor.sources: the state container's query, or the
recovery index) and saves the source's cursor as its checkpoint, so the next
page — in this run, or the next run, possibly in another process — resumes
where it stopped. A run goes on to the next page while the last one made
progress (see `_page`), for at most `max_pages` pages and while its time
`budget` lasts, so a backlog of expired attempts is worked through at the rate the
store allows rather than one page per timer tick.

Safe with several supervisors at once: each recovery is a conditional update
that requires the LockedBy value read (and the etag), so one expiry is
recovered once; the loser sees StaleError and moves on. Timer triggers are also
singletons under the Functions host.

Clock skew: `slack` is added to CompleteBy, so a supervisor whose clock runs
ahead of the orchestration's by less than `slack` does not steal a live attempt.
"""

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
        """`charges`: the request-charge recorder of the adapters this run uses
        (its own, so the figures are this run's), or None. `max_pages` and
        `budget`: how many pages one run may read, and for how long it starts
        new ones (None: no limit but `max_pages`)."""
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
            # A document this run could not read is alerted on first sight,
            # even when the run then fails (a store outage): it may have been
            # set aside, and no run meets it again before UNREADABLE_RETRY.
            # alert_unreadable never raises.
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
                # Not recovered here: the source's read may have lagged a
                # newer deadline of a live attempt, so passing the candidate
                # could lose that attempt; the next run reads it again.
                rewind = candidate.position
        if rewind is not None:
            cursor = rewind
        await self._checkpoints.save(cursor)
        # Another page now only after one that made progress: it recovered
        # something (the index's cursor may stay where it was, the entries
        # before it being gone), or it was full and the cursor moved on. A
        # page that did neither reached the end of what is due; a rewind
        # waits for the next run.
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
            # Another supervisor got there first, or the attempt finished in time
            # (or the record became unreadable: the store names it, the run alerts).
            report.skipped += 1
            log.debug("supervisor skipped %s: %s", order_id, exc)
            return False
        if record.ProcessState is ProcessState.ERROR:
            report.failed += 1
            report.failed_orders.append(order_id)
            # The Failed status and its OrderError alert are in the record's
            # outbox (written with Error): a failed send here is retried by
            # the Starter, never lost or only logged.
            if not await self._outbox.deliver(record, etag):
                report.status_unsent += 1
        elif record.NotBefore is not None:
            report.long_retry += 1
        else:
            report.recovered += 1
        return True


def _handled(report: SupervisorReport) -> int:
    return report.recovered + report.long_retry + report.failed


def _record_metrics(report: SupervisorReport) -> None:
    """The run's figures as OpenTelemetry metrics (the log line above stays:
    the alert rules read it)."""
    m = telemetry.app_metrics()
    for outcome in ("recovered", "long_retry", "failed"):
        count = getattr(report, outcome)
        if count:
            m.recoveries.add(count, {"outcome": outcome})
    m.scan_read.record(report.read)
    if report.requests:
        m.scan_charge.record(report.request_charge)
