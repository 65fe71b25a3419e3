"""The Scheduler's activities: the order workflow's side effects, each one
idempotent under Durable's at-least-once execution, with the clients the
composition root built (triggers/activities.py only decodes, calls, encodes).
`send_step` sends a step's request with no write (the claim marked it,
ADR 021a); `finish_attempt` is the attempt's one write, fenced on LockedBy.

A state write re-run after it landed is answered as success, not stale; an
agent request has a stable MessageId per (instance, step, action/try), sealed
here, where the keys may be read (ADR 017e); a terminal status goes out under
the id fixed in the record's outbox (ADR 001), or with the recovery index,
Processed from the record, its index entry marking it unsent (ADR 021k)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from activities.policy import ActivityPolicy
from adapters.clock import SYSTEM_CLOCK, Clock
from adapters.ports import DeadlineIndex, MessagePublisher, NoIndex, OrdersRepository, StateStore
from domain import state_machine as sm
from domain.errors import (
    InlineStepFailed,
    NotConfigured,
    NotFoundError,
    StaleError,
    StatusNotSent,
)
from domain.ids import (
    parse_attempt_instance_id,
)
from domain.models import (
    AgentReply,
    OrderState,
    ProcessState,
    StatusKind,
    mask_card_numbers,
)
from domain.steps import DEFAULT_CATALOG, StepCatalog
from orchestrators import commands
from orchestrators.contracts import (
    ActivityContract,
    AlertNote,
    FinishAll,
    LoadPlanInput,
    Plan,
    ReplyEvent,
    SendRequest,
    SendStep,
    StatusNote,
    WriteResult,
    Wrote,
    plan_for,
)
from orchestrators.hooks import CrashPoint, no_crash_point
from orchestrators.requests import AgentRequests
from reporting import Alerts, StatusOutbox, StatusReporter
from reporting.status import ALERT_OF_STATUS

log = logging.getLogger(__name__)


# The Durable activities SchedulerActivities.run answers (one trigger each).
ACTIVITY_NAMES = (
    "load_plan",
    "write_state",
    "send_agent_request",
    "run_inline_step",
    "report_status",
    "raise_alert",
    "send_step",
    "finish_attempt",
)

# The state each write leaves the record in, to recognise a re-run whose write
# already landed (the LockedBy guard would otherwise call it stale).
_TARGET_STATES: dict[type, tuple[ProcessState, ...]] = {
    commands.FinishCompensation: (ProcessState.COMPENSATED, ProcessState.COMPENSATION_FAILED),
    # Its long retry keeps the lock (no stale re-run); giving up lets it go.
    commands.DeferCompensation: (ProcessState.COMPENSATION_FAILED,),
}

# Records whose alert rides with their terminal status in the outbox.
_ALERTING_STATES = frozenset({ProcessState.ERROR, ProcessState.COMPENSATION_FAILED})
# Statuses that end an order: sent from the record's outbox, never lost.
_TERMINAL_STATUSES = frozenset(
    {
        StatusKind.PROCESSED,
        StatusKind.FAILED,
        StatusKind.COMPENSATED,
        StatusKind.COMPENSATION_FAILED,
    }
)


def _finishing(
    data: FinishAll, now: datetime, outbox: bool
) -> tuple[Callable[[OrderState], OrderState], Callable[[OrderState], bool]]:
    """The finishing write's transition, and how to tell it landed already
    (the record in its target state, last written by this instance)."""
    instance = data.InstanceId

    def mutate(record: OrderState) -> OrderState:
        sm.require_owner(record, instance)
        for step, reference in data.Done.items():
            record = sm.complete_step(record, instance, step, now, reference)
        if data.Failed is None:
            return sm.mark_processed(record, instance, now, outbox=outbox)
        record = sm.unmark_unsent(record, instance, data.Unsent)
        reason = data.Reason or "failed"
        if data.Compensate:
            return sm.begin_compensation(record, instance, reason, now, data.Failed)
        return sm.mark_failed(record, instance, data.Failed, reason, now)

    target = (
        ProcessState.PROCESSED
        if data.Failed is None
        else ProcessState.COMPENSATING
        if data.Compensate
        else ProcessState.ERROR
    )

    def landed(record: OrderState) -> bool:
        last = record.History[-1] if record.History else None
        return record.ProcessState is target and last is not None and last.By == instance

    return mutate, landed


class SchedulerActivities:
    def __init__(
        self,
        policy: ActivityPolicy,
        store: StateStore,
        orders: OrdersRepository,
        publisher: MessagePublisher,
        step_names: list[str] | tuple[str, ...],
        inline_agent=None,
        step_modes: dict[str, str] | None = None,
        index: DeadlineIndex | None = None,
        clock: Clock = SYSTEM_CLOCK,
        crash_point: CrashPoint = no_crash_point,
        alerts: Alerts | None = None,
        steps: StepCatalog = DEFAULT_CATALOG,
    ) -> None:
        """`crash_point`: the fault-injection hook (orchestrators.hooks), a no-op
        unless a fault test asks; `alerts`: by default an Alerts over `publisher`;
        `steps`: the app's catalog (the order fields each step's requests carry)."""
        self._settings = policy
        self._store = store
        self._orders = orders
        self._publisher = publisher
        self._status = StatusReporter(publisher)
        self._alerts = alerts if alerts is not None else Alerts(publisher)
        self._outbox = StatusOutbox(store, self._status, clock)
        self._step_names = list(step_names)
        self._inline_agent = inline_agent
        self._step_modes = step_modes or {}
        self._index = index or NoIndex()
        self._clock = clock
        self._crash_point = crash_point
        self._requests = AgentRequests(policy.scheduler_keys, publisher, orders, steps)

    async def run(self, name: str, data: Any) -> Any:
        """Run the activity `name` on its JSON input; its JSON result."""
        result: Any
        match name:
            case "load_plan":
                result = await self.load_plan(LoadPlanInput.model_validate(data))
            case "write_state":
                result = await self.write_state(commands.parse_state_write(data))
            case "send_agent_request":
                result = await self.send_agent_request(SendRequest.model_validate(data))
            case "run_inline_step":
                # The workflow reads the reply as the bridge raises it: the
                # outcome, error, reference and calls, not its identity.
                reply = await self.run_inline_step(SendRequest.model_validate(data))
                result = ReplyEvent.of(reply)
            case "report_status":
                await self.report_status(StatusNote.model_validate(data))
                result = None
            case "raise_alert":
                await self.raise_alert(AlertNote.model_validate(data))
                result = None
            case "send_step":
                await self.send_step(SendStep.model_validate(data))
                result = None
            case "finish_attempt":
                result = await self.finish_attempt(FinishAll.model_validate(data))
            case _:
                raise ValueError(f"unknown activity {name!r}")
        return result.dump() if isinstance(result, ActivityContract) else result

    # --- reading ------------------------------------------------------------------------

    async def load_plan(self, data: LoadPlanInput) -> Plan:
        _, attempt = parse_attempt_instance_id(data.InstanceId)
        owned = await self._owned(data.InstanceId)
        if isinstance(owned, str):
            return Plan(Stale=True, Reason=owned)
        return self._plan(owned[0], attempt)

    async def _owned(
        self, instance: str, known: tuple[OrderState, str] | None = None
    ) -> tuple[OrderState, str] | str:
        """The record (as `known`, else read) and its etag if `instance` owns
        it; otherwise why the attempt is stale."""
        order_id, _ = parse_attempt_instance_id(instance)
        if known is None:
            try:
                known = await self._store.read(order_id)
            except NotFoundError:
                return f"order {order_id} has no state record"
        if known[0].LockedBy != instance:
            return f"order {order_id} is locked by {known[0].LockedBy!r}"
        return known

    def _plan(self, record: OrderState, attempt: int) -> Plan:
        """Without the payload: the attempt's input carries it."""
        return plan_for(
            record,
            attempt,
            self._step_names,
            self._step_modes,
            int(self._settings.step_timeout.total_seconds()),
            record.AppId in self._settings.progress_apps,
        )

    # --- writing the record ---------------------------------------------------------------

    def _transition(
        self, write: commands.StateWrite, now: datetime
    ) -> Callable[[OrderState], OrderState]:
        """The state machine's transition for one command, by its type."""
        i = write.InstanceId
        match write:
            case commands.RecordTransient(Step=step, Reason=reason):
                return lambda r: sm.record_transient(r, i, step, reason or "transient failure", now)
            case commands.UndoDone(Step=step):
                return lambda r: sm.record_undo(r, i, step, True, now)
            case commands.UndoFailed(Step=step, Reason=reason):
                return lambda r: sm.record_undo(r, i, step, False, now, reason)
            case commands.UndoUnconfirmed(Step=step, Reason=reason):
                return lambda r: sm.record_undo_unconfirmed(r, i, step, now, reason)
            case commands.FinishCompensation():
                return lambda r: sm.finish_compensation(r, i, now)
            case commands.DeferCompensation():
                policy = self._settings.retry
                return lambda r: sm.defer_compensation(r, i, now, policy)
        raise TypeError(f"not a state command: {write!r}")

    async def write_state(self, write: commands.StateWrite) -> WriteResult:
        order_id, _ = parse_attempt_instance_id(write.InstanceId)
        now = self._clock.now()
        try:
            # The owner's own write: a refusal must not come from a lagging read.
            record, _ = await self._store.update(
                order_id, self._transition(write, now), write.InstanceId, confirm_refusal=True
            )
            return WriteResult(State=record.ProcessState)
        except (StaleError, sm.IllegalTransition) as exc:
            landed = await self._already_landed(order_id, write)
            if landed is not None:
                return WriteResult(State=landed)
            log.info(
                "stale write %s by %s: %s",
                write.Kind,
                write.InstanceId,
                exc,
                extra={"order_id": order_id},
            )
            return WriteResult(Stale=True, Reason=str(exc))

    async def _already_landed(
        self, order_id: str, write: commands.StateWrite
    ) -> ProcessState | None:
        targets = _TARGET_STATES.get(type(write))
        if targets is None:
            return None
        record, _ = await self._store.read(order_id)
        last = record.History[-1] if record.History else None
        if record.ProcessState in targets and last is not None and last.By == write.InstanceId:
            return record.ProcessState
        return None

    # --- the attempt: its requests and its one write ----------------------------------------

    async def send_step(self, data: SendStep) -> None:
        """The request of one step, no write; a retry re-sends under the same
        message id. An inline step sends nothing (its activity runs it)."""
        if self._step_modes.get(data.Step, "remote") == "inline":
            return
        await self.send_agent_request(
            SendRequest(
                InstanceId=data.InstanceId,
                Step=data.Step,
                Deadline=data.Deadline,
                Payload=data.Payload or {},
                AppId=data.AppId,
            )
        )

    async def finish_attempt(self, data: FinishAll) -> Wrote:
        """The attempt's one write (FinishAll), then the Processed status sent;
        with `Failed`, the compensation's plan returned. It lands only on a
        version on which LockedBy = this instance was checked."""
        order_id, attempt = parse_attempt_instance_id(data.InstanceId)
        marked = data.IndexedAt is not None and not isinstance(self._index, NoIndex)
        mutate, landed = _finishing(data, self._clock.now(), outbox=not marked)
        written = await self._write_on(order_id, data.InstanceId, mutate, landed)
        if isinstance(written, str):
            return Wrote(Stale=True, Reason=written)
        record, etag = written
        if data.Failed is not None:
            plan = None
            if data.Compensate:
                # The plan of the compensation, from the version just written
                # (a read after it could lag: the undo log would look empty).
                plan = self._plan(record, attempt)
            return Wrote(State=record.ProcessState, Plan=plan)
        if not await self._send_processed(record, etag, data.InstanceId, marked):
            # Durable retries this activity: the retry recognises its write
            # and sends again (same message id); the Starter, if every try fails.
            raise StatusNotSent(f"status Processed of order {order_id} not sent")
        if data.IndexedAt is not None:
            # Best effort: an entry left behind is discarded by the Supervisor.
            try:
                await self._index.discard(order_id, data.IndexedAt)
            except Exception:
                log.warning("index entry of %s not discarded", data.InstanceId, exc_info=True)
        return Wrote(State=record.ProcessState)

    async def _send_processed(self, record: OrderState, etag: str, iid: str, marked: bool) -> bool:
        """Processed from the outbox or, `marked` by the index entry (ADR 021k),
        from the record, parked in the outbox if refused: False if not even that."""
        pending = sm.unsent_processed(record, iid) if marked else None
        if pending is None:
            return (await self._outbox.deliver(record, etag)).status_sent
        try:
            await self._status.send_pending(record.ReplyTo, record.id, pending)
            return True
        except Exception as exc:  # any send failure: the outbox takes over
            log.warning("status Processed of %s not sent (%s); parked", record.id, exc)
        try:  # a Processed record is unlocked; on a lagging read nothing is parked
            got, _ = await self._store.update(record.id, lambda r: sm.park_processed(r, iid), None)
            return got.PendingStatus is not None
        except Exception:
            log.warning("status Processed of %s not parked", record.id, exc_info=True)
            return False

    async def _write_on(
        self,
        order_id: str,
        instance: str,
        mutate: Callable[[OrderState], OrderState],
        landed: Callable[[OrderState], bool],
    ) -> tuple[OrderState, str] | str:
        """`mutate` applied to the stored record (read once), or the record as
        it is when `landed` says a retried activity's write is there; the
        record and its etag, or why the attempt is stale. A status `mutate`
        puts in the outbox is sent only after the write landed (ADR 001)."""
        try:
            fresh, fresh_etag = await self._store.read(order_id)
        except NotFoundError:
            return f"order {order_id} has no state record"
        if landed(fresh):
            return fresh, fresh_etag
        try:
            fresh = mutate(fresh)
            return fresh, await self._store.replace(fresh, fresh_etag)
        except (StaleError, sm.IllegalTransition, NotFoundError) as exc:
            log.info("write by %s: %s; re-reading", instance, exc, extra={"order_id": order_id})
        try:
            return await self._store.update(order_id, mutate, instance, confirm_refusal=True)
        except (StaleError, sm.IllegalTransition, NotFoundError) as exc:
            log.info("stale write by %s: %s", instance, exc, extra={"order_id": order_id})
            return str(exc)

    # --- talking to agents ----------------------------------------------------------------

    async def send_agent_request(self, send: SendRequest) -> str:
        message_id = await self._requests.send(send)
        self._crash_point("workflow.after_send")
        return message_id

    async def run_inline_step(self, send: SendRequest) -> AgentReply:
        """The in-app agent path: the same Agent library, run in an activity."""
        if self._inline_agent is None:
            raise NotConfigured("no inline agent configured")
        send = await self._requests.with_payload(send)
        try:
            return await self._inline_agent.handle(self._requests.sealed(send))
        except Exception as exc:
            # The orchestration sees only this text (Durable's failure reason),
            # so it names the type; masked and not chained, since the history
            # keeps the details (a traceback quoting the original message).
            said = mask_card_numbers(f"{type(exc).__name__}: {exc}")
            log.warning("inline step %s of %s failed: %s", send.Step, send.InstanceId, said)
            raise InlineStepFailed(said) from None

    # --- telling people -------------------------------------------------------------------

    async def report_status(self, note: StatusNote) -> None:
        """Progress statuses are sent as they come; a terminal one from the
        record's outbox, a failed send raising for Durable to retry (ADR 001)."""
        order_id, attempt = parse_attempt_instance_id(note.InstanceId)
        if note.Status in _TERMINAL_STATUSES:
            try:
                record, etag = await self._store.read(order_id)
            except NotFoundError:
                record = None
            if record is not None and record.PendingStatus is not None:
                if (
                    record.PendingStatus.Status is note.Status
                    and not (await self._outbox.deliver(record, etag)).status_sent
                ):
                    raise StatusNotSent(f"status {note.Status.value} of order {order_id} not sent")
                return
            if record is not None and record.ProcessState.is_terminal:
                return  # already delivered from the outbox (by a retry or the Starter)
        # A terminal status sent here (a read lagging the terminal write) takes
        # the id its outbox entry has, so the two never both reach the queue.
        terminal = note.Status in _TERMINAL_STATUSES
        qualifier = f"{attempt}/{note.Step}" if note.Step and not terminal else str(attempt)
        await self._status.send(
            note.ReplyTo,
            order_id,
            note.Status,
            self._clock.now(),
            note.Detail,
            note.Step,
            qualifier,
        )

    async def raise_alert(self, note: AlertNote) -> None:
        """An alert that rides with its record's terminal status in the outbox
        is sent from there (reporting.StatusOutbox); any other is sent here."""
        order_id = note.OrderID
        try:
            record, _ = await self._store.read(order_id) if order_id else (None, None)
        except NotFoundError:
            record = None
        if record is not None and record.ProcessState in _ALERTING_STATES:
            pending = record.PendingStatus
            if pending is None or ALERT_OF_STATUS.get(pending.Status) == note.Kind:
                return  # sent with the status (or already sent from the outbox)
        reason = sm.short_text(note.Reason, 2000) or note.Kind
        await self._alerts.raise_alert(note.Kind, reason, self._clock.now(), note.OrderID)
