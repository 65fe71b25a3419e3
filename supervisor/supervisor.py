"""One Supervisor run: a bounded page of expired Processing records.

Bounded cost (invariant 6): each run reads at most `page_size` records. A scan
pass fixes its upper bound (`now - slack`) and window start when it begins and
keeps them in the checkpoint with the continuation token, because a Cosmos
continuation token is only valid for the exact query that produced it; the
next run resumes the pass, possibly in another process, and a new pass starts
when the token runs out.

Safe with several supervisors at once: each recovery is a conditional update
that requires the LockedBy value read (and the etag), so one expiry is
recovered once; the loser sees StaleError and moves on. Timer triggers are also
singletons under the Functions host.

Clock skew: `slack` is added to CompleteBy, so a supervisor whose clock runs
ahead of the orchestration's by less than `slack` does not steal a live attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from adapters.ports import StateStore
from domain import state_machine as sm
from domain.errors import NotFoundError, StaleError
from domain.models import ProcessState, StatusKind
from reporting import Alerts, StatusReporter

log = logging.getLogger(__name__)


@dataclass
class Checkpoint:
    upper: datetime
    window_start: datetime
    continuation: str | None


class CheckpointStore(Protocol):
    async def load(self) -> Checkpoint | None: ...

    async def save(self, checkpoint: Checkpoint | None) -> None: ...


@dataclass
class SupervisorReport:
    examined: int = 0
    recovered: int = 0
    long_retry: int = 0
    failed: int = 0
    skipped: int = 0
    pass_finished: bool = False
    failed_orders: list[str] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        store: StateStore,
        checkpoints: CheckpointStore,
        status: StatusReporter,
        alerts: Alerts,
        policy: sm.RetryPolicy,
        page_size: int,
        window: timedelta = timedelta(days=7),
        slack: timedelta = timedelta(seconds=5),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._checkpoints = checkpoints
        self._status = status
        self._alerts = alerts
        self._policy = policy
        self._page_size = page_size
        self._window = window
        self._slack = slack
        self._clock = clock

    async def run(self) -> SupervisorReport:
        now = self._clock()
        checkpoint = await self._checkpoints.load()
        if checkpoint is None:
            upper = now - self._slack
            checkpoint = Checkpoint(upper, upper - self._window, None)
        page, continuation = await self._store.query_expired(
            checkpoint.upper, checkpoint.window_start, self._page_size, checkpoint.continuation
        )
        report = SupervisorReport()
        for record, _etag in page:
            report.examined += 1
            await self._recover(record.id, record.LockedBy, now, report)
        if continuation is None:
            report.pass_finished = True
            await self._checkpoints.save(None)
        else:
            await self._checkpoints.save(Checkpoint(checkpoint.upper, checkpoint.window_start, continuation))
        log.info(
            "supervisor: examined=%d recovered=%d long_retry=%d failed=%d skipped=%d",
            report.examined, report.recovered, report.long_retry, report.failed, report.skipped,
            extra={"custom_dimensions": {k: v for k, v in report.__dict__.items() if k != "failed_orders"}},
        )
        return report

    async def _recover(self, order_id: str, locked_by: str | None, now: datetime, report) -> None:
        def recover(record):
            return sm.recover_expired(record, locked_by, now, self._policy, self._slack)

        try:
            record, _ = await self._store.update(order_id, recover, locked_by)
        except (StaleError, sm.IllegalTransition, NotFoundError) as exc:
            # Another supervisor got there first, or the attempt finished in time.
            report.skipped += 1
            log.debug("supervisor skipped %s: %s", order_id, exc)
            return
        if record.ProcessState is ProcessState.ERROR:
            report.failed += 1
            report.failed_orders.append(order_id)
            await self._alerts.raise_alert("OrderError", record.LastError or "gave up", now, order_id)
            await self._status.send(
                record.ReplyTo, order_id, StatusKind.FAILED, now, detail=record.LastError,
                qualifier=f"supervisor/{record.Attempt}",
            )
        elif record.NotBefore is not None:
            report.long_retry += 1
        else:
            report.recovered += 1
