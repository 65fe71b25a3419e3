"""The Starter: the Scheduler's front door for Pending orders.

Each run (timer trigger, a singleton across hosts):
1. measures the backlog once — a COUNT of Pending and of Processing records —
   and saves the Pending figure as the gauge Submit's admission control reads;
2. claims up to min(batch size, MAX_PROCESSING - Processing) claimable records,
   each with a conditional update (etag): Processing, LockedBy = the attempt's
   instance id, Attempt + 1, CompleteBy = now + claim timeout;
3. starts that attempt's orchestration. The claim comes first and sets
   CompleteBy, so a starter that dies between claim and start leaves a record
   the Supervisor recovers; starting an instance id that already exists (a
   re-run after a crash) is not an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from adapters.clock import utc_now
from adapters.crashpoints import crash_point
from adapters.ports import ANY_OWNER, DeadlineIndex, NoIndex, StateStore
from adapters.settings import Settings
from domain.errors import StaleError
from domain.models import ProcessState
from domain.state_machine import IllegalTransition, claim_compensation
from orchestrators.order_workflow import WORKFLOW_NAME

log = logging.getLogger(__name__)


@dataclass
class StarterReport:
    pending: int = 0
    processing: int = 0
    examined: int = 0
    claimed: int = 0
    started: list[str] = field(default_factory=list)
    lost: int = 0
    compensations: int = 0


async def start_attempt(client, instance_id: str) -> None:
    """Start the attempt's orchestration; an existing instance is fine."""
    try:
        await client.start_new(WORKFLOW_NAME, instance_id, None)
    except Exception:
        status = await client.get_status(instance_id)
        if status is None or getattr(status, "runtime_status", None) is None:
            raise
        log.info("instance %s already exists (%s)", instance_id, status.runtime_status)


class Starter:
    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        index: DeadlineIndex | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._settings = settings
        self._store = store
        self._index = index or NoIndex()
        self._clock = clock

    async def _compensation_requests(self, client, now: datetime, report: StarterReport) -> None:
        """Operators ask for compensation by flagging an Error or
        CompensationFailed record; a new attempt claims it (etag: one winner)
        and its orchestration undoes the completed steps."""
        for record in await self._store.query_compensation_requests(self._settings.starter_batch_size):
            try:
                claimed, _ = await self._store.update(
                    record.id, lambda r: claim_compensation(r, now, self._settings.retry), ANY_OWNER
                )
            except (StaleError, IllegalTransition):
                report.lost += 1
                continue
            report.compensations += 1
            await start_attempt(client, claimed.LockedBy)
            report.started.append(claimed.LockedBy)

    async def _resume_compensations(self, client, report: StarterReport) -> None:
        """A starter that died between claiming a compensation and starting it
        leaves a Compensating record with no live instance: start it (again;
        undos are idempotent). Running instances are left alone."""
        for record in await self._store.query_in_state(
            ProcessState.COMPENSATING, self._settings.starter_batch_size
        ):
            if record.LockedBy is None:
                continue
            try:
                status = await client.get_status(record.LockedBy)
            except Exception:  # the client raises bare Exception for an unknown instance
                status = None
            runtime = getattr(getattr(status, "runtime_status", None), "name", None)
            if runtime in (None, "Failed", "Terminated", "Canceled"):
                await start_attempt(client, record.LockedBy)
                report.started.append(record.LockedBy)

    async def run(self, client) -> StarterReport:
        now = self._clock()
        report = StarterReport()
        report.pending = await self._store.count_in_state(ProcessState.PENDING)
        report.processing = await self._store.count_in_state(ProcessState.PROCESSING)
        await self._store.write_backlog_gauge(report.pending, now)

        await self._compensation_requests(client, now, report)
        await self._resume_compensations(client, report)
        room = self._settings.max_processing - report.processing
        batch = min(self._settings.starter_batch_size, room)
        if batch <= 0:
            log.info("starter: %d processing, at the cap; nothing claimed", report.processing)
            return report
        for record in await self._store.query_pending(batch, now):
            report.examined += 1
            # The deadline is indexed before the record carries it (see
            # adapters.recovery_index): a lost claim leaves a harmless extra entry.
            await self._index.add(
                record.id, now + self._settings.retry.claim_timeout, record.Attempt + 1
            )
            claimed = await self._store.claim(record.id, now, self._settings.retry)
            if claimed is None:
                report.lost += 1  # another starter (or the fast path) won the etag
                continue
            report.claimed += 1
            crash_point("starter.after_claim")
            await start_attempt(client, claimed.LockedBy)
            report.started.append(claimed.LockedBy)
        log.info(
            "starter: pending=%d processing=%d claimed=%d lost=%d",
            report.pending, report.processing, report.claimed, report.lost,
            extra={"custom_dimensions": {k: v for k, v in report.__dict__.items() if k != "started"}},
        )
        return report
