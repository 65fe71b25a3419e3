"""The Starter: the Scheduler's front door for Pending orders (docs/design.md
section 4, "Claim" and "Admission control"; ADR 021a).

Each timer run (a singleton across hosts) counts the backlog and saves the
gauge Submit's admission control reads (ADR 008), then claims batch after
batch within the slots it takes from the admission document, each record with
one conditional replace that marks the attempt, starts the attempt's
orchestration with its plan, deadline and step payload, and sends the request
of its first step itself (ADR 021l: one activity and one episode less per
attempt). The claim comes first and sets CompleteBy, so a Starter that dies
before the start, or before that send, leaves an attempt the Supervisor
recovers at its deadline; starting an instance id that exists is not an error.
`start_submitted` does the same for one order Submit has just written; the
claim's etag race keeps it safe with the timer.

Before claiming, a run also starts and restarts compensations (ADR 003, 019a,
019e) and delivers terminal statuses left in an outbox past `status_grace`
(ADR 001), leaving out reply queues in back-off so that one refusing queue
cannot starve every other application's statuses. A failing start or send is
logged and counted; it never ends the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from adapters import telemetry
from adapters.clock import SYSTEM_CLOCK, Clock
from adapters.ports import (
    ANY_OWNER,
    DeadlineIndex,
    MessagePublisher,
    NoIndex,
    OrdersRepository,
    StateStore,
)
from adapters.servicebus import ALERTS_QUEUE
from adapters.settings import Settings
from domain import admission
from domain.admission import Admission
from domain.errors import ConflictError, NotFoundError, StaleError
from domain.models import OrderState, OrderSubmitted, ProcessState, StepStatus
from domain.state_machine import (
    MAX_COMPENSATION_RESTARTS,
    IllegalTransition,
    claim_compensation,
    compensation_waits,
    is_claimable,
    mark_received_sent,
    restart_compensation,
)
from domain.steps import DEFAULT_CATALOG
from orchestrators.contracts import AttemptStart, SendRequest, plan_for, step_payload
from orchestrators.hooks import CrashPoint, no_crash_point
from orchestrators.order_workflow import WORKFLOW_NAME
from orchestrators.policy import StarterPolicy
from orchestrators.requests import AgentRequests
from reporting import Alerts, Delivery, StatusOutbox, StatusReporter
from reporting.alerts import alert_unreadable

log = logging.getLogger(__name__)

# A refusing reply queue is probed with one send after 10 s, 20 s, 40 s, ...,
# then every 5 minutes (about 12 refused sends an hour, not one per scan). The
# back-off is the singleton holder's: a host taking the lock over starts at 10 s.
STATUS_BACKOFF_FIRST = timedelta(seconds=10)
STATUS_BACKOFF_MAX = timedelta(minutes=5)
# Refusals in a row that raise the spell's one StatusUndeliverable alert.
STATUS_ALERT_AFTER = 5
STATUS_GRACE = timedelta(seconds=30)  # an outbox entry younger than this is being sent
MAX_OUTBOX_PAGES = 3  # per run: the first page, and rescans after a queue refused
FAST_PATH_WINDOW = timedelta(seconds=3)  # how long the timer leaves a new order to the fast path
FAST_PATH_BLOCK = 10  # slots the fast path takes at once (one write of the admission document)
# How long a fast path waits for another of its process to take a block (bounded:
# it holds its message's lock), before leaving its order to the timer.
FAST_PATH_WAIT = 1.0
# After a fast path found no room, this process's fast paths read no slots for this long.
NO_ROOM_PAUSE = timedelta(seconds=1)
SLOT_WRITE_TRIES = 3  # etag races lost in a row before a claimer gives up its slots for now


@dataclass
class StarterReport:
    pending: int = 0
    processing: int = 0
    examined: int = 0
    claimed: int = 0
    batches: int = 0
    started: list[str] = field(default_factory=list)
    lost: int = 0
    compensations: int = 0
    compensation_restarts: int = 0
    compensations_started: int = 0  # an attempt written but never started: started, not counted
    compensations_given_up: int = 0
    compensations_waiting: int = 0  # in a long retry of an unconfirmed undo, not yet due
    start_failures: int = 0
    first_sends_failed: int = 0  # attempts started whose first request the Starter could not send
    status_unknown: int = 0  # compensations whose instance status could not be read
    unreadable: int = 0  # documents skipped (and alerted) because this version cannot read them
    statuses_delivered: int = 0
    statuses_unsent: int = 0
    statuses_deferred: int = 0  # entries of a queue in back-off, left for a later run
    alerts_unsent: int = 0  # outbox alerts the alerts queue refused (their statuses sent)
    counted: bool = True  # False: pending/processing are the last count's (count_interval)
    limit: int | None = None  # the admission limit this run claimed under (None: not read)


async def start_attempt(client, instance_id: str, attempt_input: dict | None = None) -> None:
    """Start the attempt's orchestration (an existing instance is fine) with
    `attempt_input`, an AttemptStart's dump, or None."""
    try:
        await client.start_new(WORKFLOW_NAME, instance_id, attempt_input)
    except Exception:
        status = await client.get_status(instance_id)
        if status is None or getattr(status, "runtime_status", None) is None:
            raise
        log.info("instance %s already exists (%s)", instance_id, status.runtime_status)


class _Slots:
    """This process's door to the admission document (domain.admission): slots
    taken by conditional writes; without a slot nothing is claimed. The last
    document written is kept, so a batch costs one write, not a read too."""

    def __init__(self, store: StateStore, policy: StarterPolicy, clock: Clock) -> None:
        self._store = store
        self._policy = policy
        self._clock = clock
        self._known: tuple[Admission, str] | None = None
        self._no_room_until: datetime | None = None
        self._block: tuple[datetime, int] | None = None  # the fast path's (taken at, slots left)
        self._taken: asyncio.Event | None = None  # set when the block being taken is in

    def known(self) -> Admission | None:
        return self._known[0] if self._known is not None else None

    async def recount(self, counted: int, began: datetime) -> Admission | None:
        """Write a new COUNT of Processing (its query begun at `began`)."""
        p = self._policy
        budget = max(len(p.steps), 1) * p.step_timeout
        for _ in range(SLOT_WRITE_TRIES):
            current = await self._store.read_admission()
            if current is None:
                new = admission.first(p.max_processing, p.starter_batch_size, counted, began)
                etag = None
            else:
                new = admission.recount(
                    current[0],
                    counted,
                    began,
                    cap=p.max_processing,
                    floor=p.starter_batch_size,
                    attempt_budget=budget,
                )
                etag = current[1]
            try:
                self._known = (new, await self._store.write_admission(new, etag))
            except (StaleError, ConflictError):
                continue
            self._no_room_until = None
            return new
        return None

    async def take(self, want: int, now: datetime, retries: int = 0) -> int:
        """Up to `want` slots, taken at `now`; how many."""
        fresh = self._known is None
        for _ in range(SLOT_WRITE_TRIES):
            current = self._known if not fresh else await self._store.read_admission()
            if current is None:
                # Never written (before a deployment's first count): the floor.
                p = self._policy
                state, etag = admission.first(p.max_processing, p.starter_batch_size, 0, now), None
            else:
                state, etag = current
            new, granted = admission.take(state, want, now, retries)
            if granted == 0:
                if not fresh:
                    fresh = True  # what this process knew may be old: look again
                    continue
                self._known = current
                self._no_room_until = now + NO_ROOM_PAUSE
                return 0
            try:
                self._known = (new, await self._store.write_admission(new, etag))
            except (StaleError, ConflictError):
                fresh = True
                continue
            return granted
        return 0

    async def one(self) -> bool:
        """One slot for the fast path from this process's block of
        FAST_PATH_BLOCK. While one fast path takes a block the others wait for
        it (an event, once, up to FAST_PATH_WAIT): unused slots count as claims
        until they age out, and as completions in the rate the limit follows."""
        waited = False
        while True:
            now = self._clock.now()
            block = self._block
            if block is not None and block[1] > 0 and admission.usable(block[0], now):
                self._block = (block[0], block[1] - 1)
                return True
            if self._no_room_until is not None and now < self._no_room_until:
                return False
            taken = self._taken
            if taken is None:
                break
            if waited or not await self._clock.wait(taken, FAST_PATH_WAIT):
                return False  # the timer claims it
            waited = True
        self._taken = taken = asyncio.Event()
        try:
            granted = await self.take(FAST_PATH_BLOCK, now)
            if granted:
                self._block = (now, granted - 1)
        finally:
            self._taken = None
            taken.set()
        return granted > 0


class Starter:
    def __init__(
        self,
        settings: StarterPolicy | Settings,
        store: StateStore,
        index: DeadlineIndex | None = None,
        clock: Clock = SYSTEM_CLOCK,
        publisher: MessagePublisher | None = None,
        max_compensation_restarts: int = MAX_COMPENSATION_RESTARTS,
        status_grace: timedelta = STATUS_GRACE,
        status_scan_interval: timedelta | None = None,
        crash_point: CrashPoint = no_crash_point,
        alerts: Alerts | None = None,
        count_interval: timedelta | None = None,
        orders: OrdersRepository | None = None,
        requests: AgentRequests | None = None,
    ) -> None:
        """`settings`: the Starter's policy (orchestrators.policy); the app's
        Settings (tools, tests) read as one with the default catalog.
        `publisher`: for alerts and outbox deliveries (without one, no statuses
        are delivered and no compensation restarted). `orders`: where a timer
        claim's step payload is read. `status_grace`: how old an outbox entry
        must be before the Starter sends it (its writer sends it at once).
        `status_scan_interval`: the least time between two outbox scans
        (default: a third of the grace). `count_interval`: the least time
        between two runs that COUNT and scan compensations (None: every run);
        the runs between claim with the last counts plus what this process
        claimed since (never lowered: the cap errs on the safe side).
        `requests`: how the Starter sends an attempt's first request itself
        (ADR 021l); without it, the attempt sends every request."""
        self._settings = (
            settings
            if isinstance(settings, StarterPolicy)
            else StarterPolicy.from_settings(settings, DEFAULT_CATALOG.names)
        )
        self._store = store
        self._orders = orders
        self._requests = requests
        self._index = index or NoIndex()
        self._clock = clock
        self._crash_point = crash_point
        self._alerts = (
            alerts if alerts is not None else Alerts(publisher) if publisher is not None else None
        )
        self._outbox = (
            StatusOutbox(store, StatusReporter(publisher), clock) if publisher is not None else None
        )
        self._max_restarts = max_compensation_restarts
        # The Processing count this process last measured (run): the fast path
        # takes no slot when the last run saw the cap reached.
        self._last_processing: int | None = None
        self._slots = _Slots(store, self._settings, clock)
        self._status_grace = status_grace
        self._status_scan_interval = (
            status_grace / 3 if status_scan_interval is None else status_scan_interval
        )
        self._next_status_scan: datetime | None = None
        self._count_interval = count_interval
        self._next_count: datetime | None = None  # the next run that counts (None: the next one)
        self._counted: tuple[int, int] = (0, 0)  # (pending, processing) at the last count
        self._claimed_since_count = 0
        self._fast_path_used: datetime | None = None  # when Submit last called start_submitted here
        # The last id of the previous run's full page of Compensating records (None: from the start).
        self._compensating_after: str | None = None
        self._gauge_written: tuple[tuple[int, int], datetime] | None = (
            None  # this process's last gauge write
        )
        # Queues that refused a send (reply queues, and the alerts queue an
        # outbox alert went to): queue -> (skipped until, last back-off).
        self._refusing: dict[str, tuple[datetime, timedelta]] = {}
        # Per refusing queue: (first refusal of the spell, refusals in a row).
        self._refusals: dict[str, tuple[datetime, int]] = {}

    async def _start(
        self, client, instance_id: str, report: StarterReport, attempt_input: dict | None = None
    ) -> bool:
        """Start one attempt; a failure is counted and logged, never raised:
        the record keeps what it needs for a later run (or the Supervisor)."""
        try:
            await start_attempt(client, instance_id, attempt_input)
        except Exception:
            report.start_failures += 1
            log.exception("starter: could not start %s", instance_id)
            return False
        report.started.append(instance_id)
        return True

    async def _payload(self, order_id: str) -> dict | None:
        """The order's step payload for a won claim's input. A failed read does
        not hold the start up (the attempt's requests read it): not starting
        would cost the marked attempt its whole budget and a FailureCount."""
        if self._orders is None:
            return None
        try:
            return step_payload(await self._orders.get(order_id))
        except Exception:
            log.warning("starter: order %s not read; its attempt reads it", order_id, exc_info=True)
            return None

    async def _start_compensation(self, client, record: OrderState, report: StarterReport) -> bool:
        """Start the compensation `record` is claimed for, with its payload."""
        payload = await self._payload(record.id)
        given = AttemptStart(Payload=payload).dump() if payload else None
        return await self._start(client, _owner(record), report, given)

    async def _write_gauge(self, pending: int, processing: int, now: datetime) -> None:
        """Save the backlog gauge (ADR 008), unless this process saved the same
        figures within a quarter of `backlog_gauge_max_age`."""
        last = self._gauge_written
        if (
            last is not None
            and last[0] == (pending, processing)
            and now - last[1] < self._settings.backlog_gauge_max_age / 4
        ):
            return
        await self._store.write_backlog_gauge(pending, now, processing)
        self._gauge_written = ((pending, processing), now)

    async def _compensation_requests(self, client, now: datetime, report: StarterReport) -> None:
        """Claim and start the compensations operators flagged (etag: one winner)."""
        for record in await self._store.query_compensation_requests(
            self._settings.starter_batch_size
        ):
            if record.PendingStatus is not None:
                # Its terminal status first, so the client hears Failed before
                # Compensating; if the send fails the claim carries the entry.
                await self._deliver(record, None, report)
            try:
                claimed, _ = await self._store.update(
                    record.id, lambda r: claim_compensation(r, now), ANY_OWNER
                )
            except (StaleError, IllegalTransition):
                report.lost += 1
                continue
            report.compensations += 1
            await self._start_compensation(client, claimed, report)

    async def _resume_compensations(self, client, now: datetime, report: StarterReport) -> None:
        """Restart a Compensating record whose instance is gone as a new
        attempt, within the restart budget (ADR 003, 019e); one waiting for
        its long retry is left until its NotBefore (ADR 019a)."""
        batch = self._settings.starter_batch_size
        # Page by id across runs: with more live compensations than one page,
        # each run looks at the next page, so a dead one behind them is reached.
        page, self._compensating_after = await self._store.query_in_state_after(
            ProcessState.COMPENSATING, batch, self._compensating_after
        )
        for record in page:
            if record.LockedBy is None:
                continue
            if compensation_waits(record, now):
                report.compensations_waiting += 1
                continue
            try:
                status = await client.get_status(record.LockedBy)
            except Exception:  # noqa: BLE001 - the SDK raises bare Exception for a 5xx, aiohttp's for a lost connection
                # Not knowing is not "gone": the SDK answers an unknown instance
                # with a status whose runtime_status is None, not an exception.
                report.status_unknown += 1
                log.warning(
                    "starter: status of %s unknown; its compensation is checked again next run",
                    record.LockedBy,
                    exc_info=True,
                )
                continue
            missing = status is None or getattr(status, "runtime_status", None) is None
            if missing and _never_started(record):
                # Its writer died (or lost the write's answer) before start_new:
                # nothing ran under this id, so starting it counts no restart.
                if await self._start_compensation(client, record, report):
                    report.compensations_started += 1
                continue
            # A missing instance that wrote the record ran and was purged by the
            # task hub's retention (infra: durableRetentionDays*): restarted as
            # a dead one is, since its requests' ids are spent.
            runtime = (
                "Completed"
                if missing
                else getattr(getattr(status, "runtime_status", None), "name", None)
            )
            if runtime not in ("Failed", "Terminated", "Canceled", "Completed"):
                continue
            dead: str = record.LockedBy

            def restart(r: OrderState, dead: str = dead) -> OrderState:
                return restart_compensation(r, dead, now, self._max_restarts, self._settings.retry)

            try:
                restarted, etag = await self._store.update(record.id, restart, dead)
            except (StaleError, IllegalTransition, NotFoundError):
                continue  # it moved on since the query: nothing to restart
            if restarted.ProcessState is ProcessState.COMPENSATING:
                if compensation_waits(restarted, now):
                    # Its restarts spent: a long retry, not a verdict (ADR 019e).
                    report.compensations_waiting += 1
                    log.warning(
                        "starter: compensation of %s keeps dying; long retry at %s",
                        record.id,
                        restarted.NotBefore,
                        extra={"order_id": record.id},
                    )
                    continue
                report.compensation_restarts += 1
                await self._start_compensation(client, restarted, report)
                continue
            report.compensations_given_up += 1
            if self._outbox is None:
                await self._raise_alert(
                    "CompensationFailed", restarted.LastError or "", now, record.id
                )
            await self._deliver(restarted, etag, report)

    async def _raise_alert(self, kind: str, reason: str, now: datetime, order_id: str) -> None:
        if self._alerts is None:
            log.error("starter: %s for order %s (no alert channel): %s", kind, order_id, reason)
            return
        try:
            await self._alerts.raise_alert(kind, reason, now, order_id)
        except Exception:
            log.exception("starter: alert %s for order %s not sent", kind, order_id)

    async def _deliver(
        self, record: OrderState, etag: str | None, report: StarterReport, alert: bool = True
    ) -> Delivery | None:
        """Deliver `record`'s outbox entry (its alert too when `alert`): the
        Delivery, or None when there is no outbox or delivering raised."""
        if self._outbox is None or record.PendingStatus is None:
            return None
        try:
            delivery = await self._outbox.deliver(record, etag, alert=alert)
        except Exception:  # the send went out; clearing failed: re-sent (same id) next run
            log.exception("starter: clearing the outbox of order %s failed", record.id)
            report.statuses_unsent += 1
            return None
        if not delivery.status_sent:
            report.statuses_unsent += 1
        elif not record.PendingStatus.Sent:
            report.statuses_delivered += 1
        if delivery.alert == "refused":
            report.alerts_unsent += 1
        return delivery

    def _backing_off(self, queue: str, now: datetime) -> bool:
        return self._refusing.get(queue, (now, None))[0] > now

    def _back_off(self, queue: str, now: datetime) -> int:
        """Skip `queue` for the next back-off after a refused send; returns
        the refusals in a row."""
        previous = self._refusing.get(queue)
        delay = (
            STATUS_BACKOFF_FIRST if previous is None else min(previous[1] * 2, STATUS_BACKOFF_MAX)
        )
        self._refusing[queue] = (now + delay, delay)
        log.warning("starter: queue %s refused a send; skipping it for %s", queue, delay)
        since, count = self._refusals.get(queue, (now, 0))
        self._refusals[queue] = (since, count + 1)
        return count + 1

    def _took(self, queue: str) -> None:
        self._refusing.pop(queue, None)
        self._refusals.pop(queue, None)

    async def _reply_queue_refused(self, queue: str, now: datetime, order_id: str) -> None:
        count = self._back_off(queue, now)
        if count != STATUS_ALERT_AFTER or self._alerts is None:
            return
        since = self._refusals[queue][0]
        reason = (
            f"reply queue {queue} has refused {count} terminal statuses in a row since "
            f"{since.isoformat()}; they stay in the outbox and are sent once it takes them"
        )
        try:
            await self._alerts.raise_alert(
                "StatusUndeliverable",
                reason,
                now,
                order_id,
                queue=queue,
                alert_id=f"status-undeliverable/{queue}/{since.isoformat()}",
            )
        except Exception:
            log.exception("starter: alert StatusUndeliverable for %s not sent", queue)

    def _alerts_queue_refused(self, now: datetime) -> None:
        """The alerts queue refused an outbox entry's alert: probed as a reply
        queue is, with no alert (it would go to the queue that refuses); the
        statuses go on without their alerts meanwhile."""
        count = self._back_off(ALERTS_QUEUE, now)
        if count == STATUS_ALERT_AFTER:
            log.error(
                "starter: the alerts queue has refused %d operator alerts in a row since %s; "
                "they stay in the outbox, their statuses are sent",
                count,
                self._refusals[ALERTS_QUEUE][0].isoformat(),
            )

    async def _deliver_statuses(self, now: datetime, report: StarterReport) -> None:
        """Outbox entries past the grace, oldest first, leaving out reply
        queues in back-off (ADR 001). While the alerts queue is in back-off,
        statuses go without their alerts and entries left for an alert wait."""
        if self._outbox is None:
            return
        if self._next_status_scan is not None and now < self._next_status_scan:
            return
        # A tenth early still counts: ticks as long as the interval, arriving
        # a little early, must not skip every other scan.
        self._next_status_scan = now + self._status_scan_interval * 0.9
        batch = self._settings.starter_batch_size
        for _ in range(MAX_OUTBOX_PAGES):
            skip = sorted(
                q for q, (until, _) in self._refusing.items() if until > now and q != ALERTS_QUEUE
            )
            page = await self._store.query_unsent_statuses(
                batch, now - self._status_grace, skip, not self._backing_off(ALERTS_QUEUE, now)
            )
            refused = False
            for record, etag in page:
                alert = not self._backing_off(ALERTS_QUEUE, now)
                status_sent = record.PendingStatus is not None and record.PendingStatus.Sent
                if (not status_sent and self._backing_off(record.ReplyTo, now)) or (
                    status_sent and not alert
                ):
                    report.statuses_deferred += 1  # its queue refused earlier in this run
                    continue
                delivery = await self._deliver(record, etag, report, alert)
                if delivery is None or record.PendingStatus is None:
                    continue
                if not status_sent:  # only a status send tells of its reply queue
                    if delivery.status_sent:
                        self._took(record.ReplyTo)
                    else:
                        await self._reply_queue_refused(record.ReplyTo, now, record.id)
                        refused = True
                if delivery.alert == "refused":
                    self._alerts_queue_refused(now)
                elif delivery.alert == "sent":
                    self._took(ALERTS_QUEUE)
            if not refused or len(page) < batch:
                return

    async def run(self, client) -> StarterReport:
        now = self._clock.now()
        report = StarterReport()
        counts = self._counts_due(now)
        if counts:
            await self._count(report, now)
        else:
            report.pending, processing = self._counted
            report.processing = processing + self._claimed_since_count
            report.counted = False
        self._last_processing = report.processing

        if counts:
            await self._compensation_requests(client, now, report)
            await self._resume_compensations(client, now, report)
        await self._deliver_statuses(now, report)
        await self._claim_batches(client, now, report)
        self._claimed_since_count += report.claimed
        report.unreadable = await alert_unreadable(self._alerts, self._store.unreadable, now)
        log.info(
            "starter: pending=%d processing=%d claimed=%d batches=%d lost=%d",
            report.pending,
            report.processing,
            report.claimed,
            report.batches,
            report.lost,
            extra={
                "custom_dimensions": {k: v for k, v in report.__dict__.items() if k != "started"}
            },
        )
        return report

    def _counts_due(self, now: datetime) -> bool:
        """Whether this run counts the backlog (`count_interval`, a tenth early
        counting)."""
        if self._count_interval is None or self._next_count is None or now >= self._next_count:
            if self._count_interval is not None:
                self._next_count = now + self._count_interval * 0.9
            return True
        return False

    async def _count(self, report: StarterReport, now: datetime) -> None:
        """Count Pending and Processing, save the gauge, recount admission."""
        report.pending = await self._store.count_in_state(ProcessState.PENDING)
        began = self._clock.now()
        report.processing = await self._store.count_in_state(ProcessState.PROCESSING)
        try:
            await self._slots.recount(report.processing, began)
        except Exception:  # the claims go on under the document as it is
            log.exception("starter: the admission document was not updated")
        self._counted = (report.pending, report.processing)
        self._claimed_since_count = 0
        await self._write_gauge(report.pending, report.processing, now)
        telemetry.app_metrics().backlog.set(report.pending, {"state": "Pending"})
        telemetry.app_metrics().backlog.set(report.processing, {"state": "Processing"})

    async def _claim_batches(self, client, started: datetime, report: StarterReport) -> None:
        """Claim batch after batch while the last one was full, each within its
        slots, up to the batch count and the run's time budget."""
        if report.processing >= self._settings.max_processing:
            log.info("starter: %d processing, at the cap; nothing claimed", report.processing)
            return
        if report.pending == 0 and report.counted:
            return  # counted at the start of this run: nothing to query for
        now = started
        while report.batches < self._settings.starter_max_batches:
            known = self._slots.known()
            report.limit = known.limit if known is not None else None
            room = known.room() if known is not None else self._settings.starter_batch_size
            if room <= 0:
                return
            batch = min(self._settings.starter_batch_size, room)
            examined = report.examined
            await self._claim_and_start(client, now, batch, report)
            report.batches += 1
            if report.examined - examined < batch:
                return  # a short batch (or too few slots): nothing more to claim now
            now = self._clock.now()
            if now - started >= self._settings.starter_run_budget:
                return

    async def _claim_and_start(
        self, client, now: datetime, batch: int, report: StarterReport
    ) -> None:
        young = None
        if self._fast_path_used is not None and now - self._fast_path_used < FAST_PATH_WINDOW * 10:
            # Leave the fast path its young orders rather than race it (a lost
            # race costs a replace and an index entry); one it skipped ages out.
            young = now - FAST_PATH_WINDOW
        page = await self._store.query_claimable(batch, now, young)
        if not page:
            return
        # A record claimed before is a retry: an attempt that did not finish.
        retries = sum(1 for record, _ in page if record.Attempt > 0)
        # Taken at the time of taking, after this run's count began, so the
        # next count counts them as claims since it.
        granted = await self._slots.take(len(page), self._clock.now(), retries)
        for record, etag in page[:granted]:
            report.examined += 1
            if await self.claim_and_start(client, record, etag, now, report) is None:
                report.lost += 1  # another starter (or the fast path) won the etag

    def _marks(self, record: OrderState, now: datetime) -> tuple[list[str], datetime]:
        """The steps a claim marks and the attempt's one deadline (ADR 021a):
        a step timeout per step to do, one at least for the finishing write."""
        p = self._settings
        if not p.steps:
            raise ValueError("the Starter claims with a step catalog: its policy has no steps")
        todo = [
            name
            for name in p.steps
            if name not in record.Steps or record.Steps[name].Status is not StepStatus.COMPLETED
        ]
        # Whole seconds, rounded up: the deadline is written into the input,
        # every request and the finishing write (7 bytes of history each).
        deadline = now + max(len(todo), 1) * p.step_timeout
        return todo, deadline + (-deadline.microsecond % 1_000_000) * timedelta(microseconds=1)

    async def claim_and_start(
        self,
        client,
        record: OrderState,
        etag: str,
        now: datetime | None = None,
        report: StarterReport | None = None,
        order: OrderSubmitted | None = None,
        received_sent_at: datetime | None = None,
    ) -> str | None:
        """Claim `record` (as read at `etag`) with one conditional replace and
        start its attempt: its instance id, or None if not claimable or lost.
        `received_sent_at`: the claim also marks Received sent (the fast path's
        one write instead of two)."""
        now = now or self._clock.now()
        report = report or StarterReport()
        if received_sent_at is not None:
            record = mark_received_sent(record, received_sent_at)
        if not is_claimable(record, now):
            # No index entry either: one for an attempt never claimed would hold
            # the index Supervisor's cursor, and others' recoveries, until the
            # next claim.
            return None
        todo, deadline = self._marks(record, now)
        # The deadline is indexed before the record carries it (see
        # adapters.recovery_index): a claim lost to another claimer leaves an
        # extra entry for the attempt that claimer took, which is harmless.
        await self._index.add(record.id, deadline, record.Attempt + 1)
        won = await self._store.claim_known(
            record, etag, now, self._settings.retry, (todo, deadline)
        )
        if won is None:
            return None
        claimed, _ = won
        report.claimed += 1
        telemetry.app_metrics().attempts.add(1)
        self._crash_point("starter.after_claim")
        payload = step_payload(order) if order is not None else await self._payload(claimed.id)
        step_timeout = int(self._settings.step_timeout.total_seconds())
        # The first step's request is the Starter's when it is a remote one.
        sent = (
            todo[0]
            if self._requests is not None
            and todo
            and self._settings.step_modes.get(todo[0], "remote") != "inline"
            else None
        )
        attempt_input = AttemptStart(
            Payload=payload,
            Deadline=deadline,
            Plan=plan_for(
                claimed,
                claimed.Attempt,
                self._settings.steps,
                self._settings.step_modes,
                step_timeout,
                claimed.AppId in self._settings.progress_apps,
            ),
            # What no attempt had sent before this claim: what a failure may
            # make NotStarted again.
            Fresh=[
                n
                for n in todo
                if n not in record.Steps or record.Steps[n].Status is StepStatus.NOT_STARTED
            ],
            Trace=telemetry.start_attempt(
                claimed.id, _owner(claimed), claimed.Attempt, claimed.Trace
            ),
            Sent=sent,
        ).dump()
        if await self._start(client, _owner(claimed), report, attempt_input) and sent:
            self._crash_point("starter.after_start")
            await self._send_first(claimed, sent, deadline, payload, report, attempt_input)
        return _owner(claimed)

    async def _send_first(
        self,
        record: OrderState,
        step: str,
        deadline: datetime,
        payload: dict | None,
        report: StarterReport,
        attempt_input: dict,
    ) -> None:
        """Send the request of the attempt's first step, once the attempt has
        started: its reply can then never find the instance missing. A failure
        is counted and logged, never raised: the attempt waits for its reply
        until its deadline, as after a send whose answer was lost, and the
        Supervisor retries it then."""
        if self._requests is None:
            return
        instance = _owner(record)
        # In the attempt's trace, as the attempt's own sends are (its activities'
        # spans continue the input's `Trace`): the agent's span joins it.
        carrier = attempt_input.get("Trace")
        try:
            with telemetry.continue_from(
                "send first request",
                carrier if isinstance(carrier, dict) else None,
                **{telemetry.ORDER_ID: record.id, telemetry.INSTANCE_ID: instance},
            ):
                # Bounded by the publisher's send timeout, as an activity's send is.
                await self._requests.send(
                    SendRequest(
                        InstanceId=instance,
                        Step=step,
                        Deadline=deadline,
                        Payload=payload or {},
                        AppId=record.AppId,
                    )
                )
        except Exception:
            report.first_sends_failed += 1
            log.warning("starter: first request of %s not sent", instance, exc_info=True)

    async def start_submitted(
        self,
        client,
        record: OrderState,
        etag: str,
        order: OrderSubmitted | None = None,
        received_sent_at: datetime | None = None,
    ) -> str | None:
        """Submit's fast path: claim and start an order Submit has just written,
        in the timer's etag race. None (the timer claims it later) when the
        last run saw the cap reached, no slot is left, or it is not claimable;
        then nothing is known marked and Submit marks Received sent itself."""
        self._fast_path_used = self._clock.now()
        if (
            self._last_processing is not None
            and self._last_processing >= self._settings.max_processing
        ):
            return None
        try:
            if not await self._slots.one():
                return None  # no room under the limit: the timer claims it when there is
            return await self.claim_and_start(
                client, record, etag, order=order, received_sent_at=received_sent_at
            )
        except Exception:  # the timer run picks the record up; Submit must not fail for this
            log.exception(
                "fast start of order %s failed; the starter's timer will claim it", record.id
            )
            return None


# What Submit calls after creating the Pending record: (client, record, etag,
# order, received_sent_at) -> the instance started, or None (`fast_start`).
FastStart = Callable[
    [Any, OrderState, str, "OrderSubmitted | None", "datetime | None"], Awaitable[str | None]
]


def fast_start(starter: Callable[[], Awaitable[Starter]]) -> FastStart:
    """Submit's fast start over the process's Starter (Starter.start_submitted).
    Never raises; None means the timer Starter will claim the order."""

    async def start_submitted(
        client: Any,
        record: OrderState,
        etag: str,
        order: OrderSubmitted | None = None,
        received_sent_at: datetime | None = None,
    ) -> str | None:
        try:
            s = await starter()
        except Exception:
            log.exception("fast start of order %s: no starter; the timer will claim it", record.id)
            return None
        return await s.start_submitted(client, record, etag, order, received_sent_at)

    return start_submitted


def _never_started(record: OrderState) -> bool:
    """The attempt wrote nothing since the Starter (or an operator) moved the
    record to it: no undo outcome (At) and no transition since. Not UpdatedAt:
    others' bookkeeping (Received marks, outbox clears) moves it too, and a
    restart counted for that spends the budget on an attempt that never ran."""
    if not record.History:
        return False
    last = record.History[-1]
    return (
        last.To is ProcessState.COMPENSATING
        and last.By in ("starter", "operator")
        and not any(e.At is not None and e.At > last.At for e in record.Compensation)
    )


def _owner(record: OrderState) -> str:
    """The instance a record was just claimed for: every claim sets LockedBy."""
    if record.LockedBy is None:
        raise IllegalTransition(f"order {record.id} has no owner after its claim")
    return record.LockedBy
