"""`SchedulerActivities` receives its clients (state store, orders DB,
publisher, agent) so tests can build it with fakes or real adapters alike; the
Durable activity triggers in triggers/activities.py only decode, call, encode.

Workflow 2.0's `begin` and `advance` are each one guarded write (carrying
the etag of the previous write; re-read and decide on a precondition
failure) followed by the message it must be followed by; a retry recognises
its own write and sends again (docs/adr/004-lean-workflow.md).

Idempotency under at-least-once delivery:
- state writes: each transition is re-checked against the record as read; a
  re-run after the write landed is recognised (the record already shows this
  instance's transition) and answered as success rather than stale;
- agent requests: stable MessageId per (instance, step, action/try), so the
  request queue's duplicate detection drops a re-send; each is sealed here
  (a reply token and a signature, domain.signing: the keys are read where
  secrets are allowed, never by the replayed orchestrator), and the seal is a
  function of the request, so a re-send carries the same one (ADR 017e);
- status updates: stable MessageId per (order, status, qualifier); a terminal
  status is sent from the record's outbox with the id fixed there, and the
  outbox entry is cleared after the send (docs/adr/001-status-outbox.md)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from activities.policy import ActivityPolicy
from adapters.clock import SYSTEM_CLOCK, Clock
from adapters.ports import DeadlineIndex, MessagePublisher, NoIndex, OrdersRepository, StateStore
from adapters.servicebus import AGENT_REQUESTS_QUEUE
from domain import state_machine as sm
from domain.codec import encode
from domain.errors import (
    InlineStepFailed,
    NotConfigured,
    NotFoundError,
    StaleError,
    StatusNotSent,
    TransientError,
)
from domain.ids import (
    agent_request_message_id,
    fencing_token,
    idempotency_key,
    parse_attempt_instance_id,
    reply_event_name,
)
from domain.models import (
    AgentReply,
    AgentRequest,
    OrderState,
    ProcessState,
    StatusKind,
    StepStatus,
    mask_card_numbers,
)
from domain.signing import seal_request
from orchestrators import commands
from orchestrators.contracts import (
    Advance,
    Advanced,
    AlertNote,
    BeginWrite,
    FinishAll,
    FinishWrite,
    LoadPlanInput,
    Plan,
    SendRequest,
    SendStep,
    StatusNote,
    StepWrite,
    WriteResult,
    Wrote,
    parse_advance,
    plan_for,
    step_payload,
)
from orchestrators.hooks import CrashPoint, no_crash_point
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
    "begin_attempt",
    "advance_attempt",
    "send_step",
    "finish_attempt",
)

# The state each write leaves the record in, to recognise a re-run whose write
# already landed (the LockedBy guard would otherwise call it stale).
_TARGET_STATES: dict[type, tuple[ProcessState, ...]] = {
    commands.MarkProcessed: (ProcessState.PROCESSED,),
    commands.MarkFailed: (ProcessState.ERROR,),
    commands.BeginCompensation: (ProcessState.COMPENSATING,),
    commands.FinishCompensation: (ProcessState.COMPENSATED, ProcessState.COMPENSATION_FAILED),
    # Its long retry keeps the lock (no stale re-run); giving up lets it go.
    commands.DeferCompensation: (ProcessState.COMPENSATION_FAILED,),
}

# Statuses that end an order: sent from the record's outbox, never lost.
# Records whose alert rides with their terminal status in the outbox.
_ALERTING_STATES = frozenset({ProcessState.ERROR, ProcessState.COMPENSATION_FAILED})
_TERMINAL_STATUSES = frozenset(
    {
        StatusKind.PROCESSED,
        StatusKind.FAILED,
        StatusKind.COMPENSATED,
        StatusKind.COMPENSATION_FAILED,
    }
)


def _dump(record: OrderState) -> dict:
    return record.model_dump(mode="json")


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
    ) -> None:
        """`crash_point`: the fault-injection hook the composition root
        chooses (orchestrators.hooks); a no-op unless a fault test asks.
        `alerts`: where its alerts go (default: an Alerts over `publisher`)."""
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
        # 2.3: the last version of each record this process wrote, by order
        # id, with its etag (see _version_at); bounded, oldest dropped first.
        self._written: OrderedDict[str, tuple[OrderState, str]] = OrderedDict()
        # 2.3: each order's step payload, from its begin (see _payload).
        self._payloads: OrderedDict[str, dict] = OrderedDict()

    async def run(self, name: str, data: Any) -> Any:
        """Run the activity `name` on its JSON input and return its JSON
        result: what every activity trigger (triggers.activities) does
        between decoding and encoding, in one place."""
        result: Any
        match name:
            case "load_plan":
                result = await self.load_plan(LoadPlanInput.model_validate(data))
            case "write_state":
                result = await self.write_state(commands.parse_state_write(data))
            case "send_agent_request":
                result = await self.send_agent_request(SendRequest.model_validate(data))
            case "run_inline_step":
                result = await self.run_inline_step(SendRequest.model_validate(data))
            case "report_status":
                await self.report_status(StatusNote.model_validate(data))
                result = None
            case "raise_alert":
                await self.raise_alert(AlertNote.model_validate(data))
                result = None
            case "begin_attempt" | "advance_attempt":
                result = await self.advance_any(name, parse_advance(data))
            case "send_step":
                await self.send_step(SendStep.model_validate(data))
                result = None
            case "finish_attempt":
                result = await self.finish_attempt(FinishAll.model_validate(data))
            case _:
                raise ValueError(f"unknown activity {name!r}")
        if isinstance(result, Wrote):
            return result.dump()
        return result.model_dump(mode="json") if isinstance(result, BaseModel) else result

    # --- reading ------------------------------------------------------------------------

    async def load_plan(self, data: LoadPlanInput) -> Plan:
        _, attempt = parse_attempt_instance_id(data.InstanceId)
        owned = await self._owned(data.InstanceId)
        if isinstance(owned, str):
            return Plan(Stale=True, Reason=owned)
        return await self._plan(owned[0], attempt)

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

    async def _plan(self, record: OrderState, attempt: int, payload: dict | None = None) -> Plan:
        if not payload:
            payload = step_payload(await self._orders.get(record.id))
        return plan_for(
            record,
            attempt,
            payload,
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
            case commands.StartStep(Step=step, Deadline=deadline):
                return lambda r: sm.start_step(r, i, step, now, deadline)
            case commands.CompleteStep(Step=step, Reference=reference):
                deadline = self._next_deadline(write, now)
                return lambda r: sm.complete_step(r, i, step, now, reference, deadline)
            case commands.MarkProcessed():
                return lambda r: sm.mark_processed(r, i, now)
            case commands.MarkFailed(Step=failed, Reason=reason):
                return lambda r: sm.mark_failed(r, i, failed, reason or "failed", now)
            case commands.BeginCompensation(Step=failed, Reason=reason):
                return lambda r: sm.begin_compensation(r, i, reason or "compensation", now, failed)
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

    def _next_deadline(
        self, write: commands.StartStep | commands.CompleteStep, now: datetime
    ) -> datetime:
        """The record's CompleteBy after `write`: the orchestration's, or for
        a 1.0 complete_step, which sends none, one step timeout from now."""
        if write.Deadline is not None:
            return write.Deadline
        return now + timedelta(seconds=self._settings.step_timeout.total_seconds())

    async def write_state(self, write: commands.StateWrite) -> WriteResult:
        order_id, attempt = parse_attempt_instance_id(write.InstanceId)
        now = self._clock.now()
        if isinstance(write, commands.StartStep | commands.CompleteStep):
            # Indexed before the record carries it (adapters.recovery_index).
            await self._index.add(order_id, self._next_deadline(write, now), attempt)
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

    # --- version 2.0: one write and the message after it, per activity ---------------------

    async def begin(self, data: Advance) -> Advanced:
        """Plan the attempt and start its first unfinished step: one guarded
        write (on the claim's etag when the orchestration got it), then that
        step's request, then Processing if the application opted in."""
        order_id, attempt = parse_attempt_instance_id(data.InstanceId)
        given = None
        if data.Record is not None and data.Etag is not None:
            given = (OrderState.model_validate(data.Record), data.Etag)
        owned = await self._owned(data.InstanceId, given)
        if isinstance(owned, str):
            return Advanced(Stale=True, Reason=owned)
        record, etag = owned
        plan = await self._plan(record, attempt, data.Payload)
        start = next((s for s in plan.Steps if not s.Completed), None)
        if (
            record.ProcessState is not ProcessState.PROCESSING
            or start is None
            or data.Deadline is None
        ):
            # Compensating, or nothing left to start (finish next), or an
            # instance without input that must first learn its step timeout.
            return Advanced(State=record.ProcessState, Record=_dump(record), Etag=etag, Plan=plan)
        step = data.model_copy(
            update={"Start": start.Name, "Payload": plan.Payload, "Progress": plan.Progress}
        )
        written = await self._write_v2(step, record, etag)
        if written.Stale:
            return written
        await self._send_v2(step, start.Mode, record.AppId)
        if plan.Progress:
            await self._progress(
                plan.ReplyTo,
                order_id,
                StatusKind.PROCESSING,
                f"attempt {attempt}",
                None,
                str(attempt),
            )
        return written.model_copy(update={"Plan": plan, "Started": start.Name})

    async def _progress(
        self,
        reply_to: str,
        order_id: str,
        status: StatusKind,
        detail: str | None,
        step: str | None,
        qualifier: str,
    ) -> None:
        """A progress status after a write that landed: best effort. It has no
        outbox (the next status, and the terminal one from its outbox,
        supersede it), and failing the write activity for it would fail the
        attempt after its request went out, so a later attempt would ask the
        remote service again for a step it may have refused for good
        (simulation seeds 100067, 100255, 100381: a reply queue's link down)."""
        try:
            await self._status.send(
                reply_to, order_id, status, self._clock.now(), detail, step, qualifier
            )
        except TransientError as exc:
            log.warning(
                "progress status %s of %s not sent: %s",
                status.value,
                order_id,
                exc,
                extra={"order_id": order_id},
            )

    async def advance(self, data: Advance) -> Advanced:
        """Complete a step and start the next one (one write, then the next
        request), or complete the last and finish (one write that fills the
        status outbox, then Processed is sent and the outbox cleared)."""
        order_id, attempt = parse_attempt_instance_id(data.InstanceId)
        record = OrderState.model_validate(data.Record) if data.Record is not None else None
        written = await self._write_v2(data, record, data.Etag)
        if written.Stale:
            return written
        if data.Complete is not None and data.Progress:
            current = OrderState.model_validate(written.Record)
            await self._progress(
                current.ReplyTo,
                order_id,
                StatusKind.STEP_COMPLETED,
                None,
                data.Complete,
                f"{attempt}/{data.Complete}",
            )
        if data.Start is not None:
            app_id = OrderState.model_validate(written.Record).AppId if written.Record else None
            await self._send_v2(data, self._step_modes.get(data.Start, "remote"), app_id)
        if data.Finish:
            current = OrderState.model_validate(written.Record)
            sent = await self._outbox.deliver(current, written.Etag)
            if not sent:
                # Durable retries this activity: the retry recognises its
                # write and sends again (same message id). If every try
                # fails, the entry stays for the Starter.
                raise StatusNotSent(f"status Processed of order {order_id} not sent")
            if data.IndexedAt is not None:
                # The attempt is over: retire its recovery-index entry so the
                # Supervisor never has to visit it. Best effort: an entry left
                # behind is discarded by the Supervisor when it gets there.
                try:
                    await self._index.discard(order_id, data.IndexedAt)
                except Exception:
                    log.warning("index entry of %s not discarded", data.InstanceId, exc_info=True)
        return written

    def _v2_transition(self, data: Advance, now: datetime) -> Callable[[OrderState], OrderState]:
        instance = data.InstanceId

        def mutate(record: OrderState) -> OrderState:
            sm.require_owner(record, instance)
            if data.Complete is not None:
                record = sm.complete_step(record, instance, data.Complete, now, data.Reference)
            if data.Start is not None:
                if data.Deadline is None:
                    raise ValueError("a step is started with its deadline")
                record = sm.start_step(record, instance, data.Start, now, data.Deadline)
            if data.Finish:
                record = sm.mark_processed(record, instance, now)
            return record

        return mutate

    @staticmethod
    def _v2_landed(data: Advance, record: OrderState, attempt: int) -> bool:
        """Whether `record` already shows this write (a retried activity whose
        first try wrote and then failed to send)."""
        if data.Finish:
            last = record.History[-1] if record.History else None
            return (
                record.ProcessState is ProcessState.PROCESSED
                and last is not None
                and last.By == data.InstanceId
            )
        if data.Start is not None:
            step = record.Steps.get(data.Start)
            return (
                record.LockedBy == data.InstanceId
                and step is not None
                and step.Status is StepStatus.RUNNING
                and step.Attempt == attempt
                and step.CompleteBy == data.Deadline
            )
        return False

    async def _write_v2(
        self, data: Advance, record: OrderState | None, etag: str | None
    ) -> Advanced:
        """The guarded write, carrying the etag of the record as the previous
        write left it: no read first. On a precondition failure (or without
        a record to carry), re-read and decide: another owner -> stale; this
        write already there -> done; otherwise apply it to the fresh record
        (store.update re-checks LockedBy on every version it replaces)."""
        order_id, attempt = parse_attempt_instance_id(data.InstanceId)
        now = self._clock.now()
        mutate = self._v2_transition(data, now)
        if record is not None and etag is not None:
            try:
                updated = mutate(record)
                return Advanced(
                    State=updated.ProcessState,
                    Record=_dump(updated),
                    Etag=await self._store.replace(updated, etag),
                )
            except (StaleError, sm.IllegalTransition, NotFoundError) as exc:
                log.info(
                    "write by %s: %s; re-reading",
                    data.InstanceId,
                    exc,
                    extra={"order_id": order_id},
                )
        try:
            fresh, fresh_etag = await self._store.read(order_id)
        except NotFoundError:
            return Advanced(Stale=True, Reason=f"order {order_id} has no state record")
        if self._v2_landed(data, fresh, attempt):
            return Advanced(State=fresh.ProcessState, Record=_dump(fresh), Etag=fresh_etag)
        try:
            updated, new_etag = await self._store.update(
                order_id, mutate, data.InstanceId, confirm_refusal=True
            )
        except (StaleError, sm.IllegalTransition, NotFoundError) as exc:
            log.info("stale write by %s: %s", data.InstanceId, exc, extra={"order_id": order_id})
            return Advanced(Stale=True, Reason=str(exc))
        return Advanced(State=updated.ProcessState, Record=_dump(updated), Etag=new_etag)

    async def _send_v2(self, data: Advance, mode: str, app_id: str | None) -> None:
        """The request for the step just started (an inline step runs in its
        own activity instead). Stable message id: a retry's re-send is dropped."""
        if mode == "inline":
            return
        await self.send_agent_request(
            SendRequest(
                InstanceId=data.InstanceId,
                Step=data.Start,
                Deadline=data.Deadline,
                Payload=data.Payload,
            ),
            app_id=app_id,
        )

    # --- version 2.3: ids and etags in, the new etag out ----------------------------------

    async def advance_any(
        self, name: str, data: Advance | BeginWrite | StepWrite | FinishWrite
    ) -> Advanced | Wrote:
        """begin_attempt / advance_attempt (`name`): 2.3's union by its
        `Kind`, or 2.2's and older one-model `Advance` (the instances in
        flight), by the activity's name as before."""
        match data:
            case BeginWrite():
                return await self.begin_v3(data)
            case StepWrite() | FinishWrite():
                return await self.advance_v3(data)
        if name == "begin_attempt":
            return await self.begin(data)
        return await self.advance(data)

    _WRITTEN_MAX = 1024

    def _remember(self, written: Advanced) -> Wrote:
        """`written` as 2.3 answers it (no record), keeping the record it
        wrote for this process's next write of the order (_version_at)."""
        if written.Record is not None and written.Etag is not None:
            record = OrderState.model_validate(written.Record)
            self._written[record.id] = (record, written.Etag)
            self._written.move_to_end(record.id)
            while len(self._written) > self._WRITTEN_MAX:
                self._written.popitem(last=False)
        return Wrote(
            Stale=written.Stale,
            Reason=written.Reason,
            State=written.State,
            Etag=written.Etag,
            StatusSent=written.StatusSent,
            Plan=written.Plan,
            Started=written.Started,
        )

    def _keep_payload(self, order_id: str, payload: dict) -> None:
        self._payloads[order_id] = payload
        self._payloads.move_to_end(order_id)
        while len(self._payloads) > self._WRITTEN_MAX:
            self._payloads.popitem(last=False)

    async def _payload(self, order_id: str) -> dict:
        """The order's step payload: this process's copy from the attempt's
        begin (an order never changes: Submit never overwrites one), else
        read from the orders DB."""
        payload = self._payloads.get(order_id)
        if payload is None:
            payload = step_payload(await self._orders.get(order_id))
            self._keep_payload(order_id, payload)
        return payload

    async def _version_at(self, order_id: str, etag: str | None) -> tuple[OrderState, str] | None:
        """The record as the orchestration's last write left it (`etag`):
        this process's own copy when it wrote that very version (the etag
        proves the copy is the version stored then, and the replace on it
        that nothing changed since), else one read (the stored version,
        whatever its etag: the write re-checks LockedBy on it). None when
        there is no record."""
        known = self._written.get(order_id)
        if known is not None and etag is not None and known[1] == etag:
            return known
        try:
            return await self._store.read(order_id)
        except NotFoundError:
            return None

    async def begin_v3(self, data: BeginWrite) -> Wrote:
        """2.3's begin: 2.2's (plan, one write, the first request), on the
        version the claim's etag names."""
        order_id, _ = parse_attempt_instance_id(data.InstanceId)
        known = await self._version_at(order_id, data.Etag)
        if known is None:
            return Wrote(Stale=True, Reason=f"order {order_id} has no state record")
        record, etag = known
        if etag != data.Etag:
            again = await self._begun_before(data, record, etag)
            if again is not None:
                return again
        written = await self.begin(
            Advance(
                InstanceId=data.InstanceId,
                Begin=True,
                Record=_dump(record),
                Etag=etag,
                Deadline=data.Deadline,
                Payload=data.Payload or {},
                Trace=data.Trace,
            )
        )
        if written.Plan is not None:
            self._keep_payload(order_id, written.Plan.Payload)
            if data.Payload:
                # The orchestration has the payload it gave: no second copy.
                written = written.model_copy(
                    update={"Plan": written.Plan.model_copy(update={"Payload": {}})}
                )
        return self._remember(written)

    async def _begun_before(self, data: BeginWrite, record: OrderState, etag: str) -> Wrote | None:
        """A begin that finds the record moved on since the claim (a retry
        after its write landed, or a duplicate run after the attempt went
        further): 2.2's begin planned from the claim's version, and so must
        this one, or it would start a later step with the first step's
        deadline. The first step this attempt started is the begin's; still
        Running with this deadline: the write landed, send its request again
        (duplicate detection drops it); moved on: nothing to do, answered as
        2.2's refused write was (stale). None: this attempt began nothing yet."""
        order_id, attempt = parse_attempt_instance_id(data.InstanceId)
        if record.LockedBy != data.InstanceId:
            return None  # the ordinary begin answers stale
        first = next(
            (
                name
                for name in self._step_names
                if (step := record.Steps.get(name)) is not None
                and step.Attempt == attempt
                and step.Status in (StepStatus.RUNNING, StepStatus.COMPLETED)
            ),
            None,
        )
        if first is None:
            return None
        state = record.Steps[first]
        if state.Status is not StepStatus.RUNNING or state.CompleteBy != data.Deadline:
            return Wrote(
                Stale=True,
                Reason=f"begin of {data.InstanceId} ran again after the attempt moved past {first}",
            )
        plan = await self._plan(record, attempt, data.Payload)
        self._keep_payload(order_id, plan.Payload)
        resend = Advance(
            InstanceId=data.InstanceId,
            Start=first,
            Deadline=data.Deadline,
            Payload=plan.Payload,
        )
        await self._send_v2(resend, self._step_modes.get(first, "remote"), record.AppId)
        if plan.Progress:  # as 2.2's begin does after its write (a stable id)
            await self._progress(
                plan.ReplyTo,
                order_id,
                StatusKind.PROCESSING,
                f"attempt {attempt}",
                None,
                str(attempt),
            )
        if data.Payload:
            plan = plan.model_copy(update={"Payload": {}})
        return Wrote(State=record.ProcessState, Etag=etag, Plan=plan, Started=first)

    async def advance_v3(self, data: StepWrite | FinishWrite) -> Wrote:
        """2.3's step and finish: 2.2's advance (one write, then the next
        request, or Processed and the outbox cleared), on the version the
        previous write's etag names; whether the application gets progress
        statuses is read from that record, not carried."""
        order_id, _ = parse_attempt_instance_id(data.InstanceId)
        known = await self._version_at(order_id, data.Etag)
        if known is None:
            return Wrote(Stale=True, Reason=f"order {order_id} has no state record")
        record, etag = known
        if isinstance(data, StepWrite):
            then: dict[str, Any] = {
                "Start": data.Start,
                "Deadline": data.Deadline,
                "Payload": await self._payload(order_id),
            }
        else:
            then = {"Finish": True, "IndexedAt": data.IndexedAt}
        written = await self.advance(
            Advance(
                InstanceId=data.InstanceId,
                Record=_dump(record),
                Etag=etag,
                Complete=data.Complete,
                Reference=data.Reference,
                Progress=record.AppId in self._settings.progress_apps,
                Trace=data.Trace,
                **then,
            )
        )
        return self._remember(written)

    # --- version 2.4: the claim marked the steps; one write at the end -------------------

    async def send_step(self, data: SendStep) -> None:
        """2.4: the request of one step, no write (the claim marked it
        Running until the attempt's deadline). A retry re-sends with the
        same message id, which duplicate detection drops."""
        order_id, _ = parse_attempt_instance_id(data.InstanceId)
        if data.Payload:
            self._keep_payload(order_id, data.Payload)
        await self._send_v2(
            Advance(
                InstanceId=data.InstanceId,
                Start=data.Step,
                Deadline=data.Deadline,
                Payload=data.Payload or await self._payload(order_id),
            ),
            self._step_modes.get(data.Step, "remote"),
            data.AppId,
        )

    async def finish_attempt(self, data: FinishAll) -> Wrote:
        """2.4's one write of an attempt, on the version the claim's etag
        names (this process's copy, else one read): every step done
        Completed, then Processed with its status in the outbox (sent and
        cleared here, as 2.3's finish), or with `Failed` the compensation
        begun. Fenced like every write: it lands only on a version that
        LockedBy = this instance was checked on."""
        order_id, _ = parse_attempt_instance_id(data.InstanceId)
        instance = data.InstanceId
        now = self._clock.now()

        def mutate(record: OrderState) -> OrderState:
            sm.require_owner(record, instance)
            for step, reference in data.Done.items():
                record = sm.complete_step(record, instance, step, now, reference)
            if data.Failed is None:
                return sm.mark_processed(record, instance, now)
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

        known = await self._version_at(order_id, data.Etag)
        if known is None:
            return Wrote(Stale=True, Reason=f"order {order_id} has no state record")
        written = await self._write_on(order_id, instance, mutate, landed, known)
        if written.Stale or data.Failed is not None:
            if not written.Stale and data.Compensate and written.Record is not None:
                # The plan of the compensation, from the version just written
                # (a read after it could lag: the undo log would look empty).
                _, attempt = parse_attempt_instance_id(instance)
                begun = OrderState.model_validate(written.Record)
                plan = await self._plan(begun, attempt, await self._payload(order_id))
                written = written.model_copy(update={"Plan": plan})
            return self._remember(written)
        current = OrderState.model_validate(written.Record)
        if not await self._outbox.deliver(current, written.Etag):
            # Durable retries this activity: the retry recognises its write
            # and sends again (same message id); the Starter, if every try fails.
            raise StatusNotSent(f"status Processed of order {order_id} not sent")
        if data.IndexedAt is not None:
            try:
                await self._index.discard(order_id, data.IndexedAt)
            except Exception:
                log.warning("index entry of %s not discarded", instance, exc_info=True)
        return self._remember(written)

    async def _write_on(
        self,
        order_id: str,
        instance: str,
        mutate: Callable[[OrderState], OrderState],
        landed: Callable[[OrderState], bool],
        known: tuple[OrderState, str],
    ) -> Advanced:
        """`mutate` replaced on `known` (no read); on a refusal, re-read and
        decide as 2.2's write does: this write there already -> done (a
        retried activity), else applied to the fresh version, whose LockedBy
        store.update checks (another owner -> stale)."""
        record, etag = known
        if not landed(record):
            try:
                updated = mutate(record)
                return Advanced(
                    State=updated.ProcessState,
                    Record=_dump(updated),
                    Etag=await self._store.replace(updated, etag),
                )
            except (StaleError, sm.IllegalTransition, NotFoundError) as exc:
                log.info("write by %s: %s; re-reading", instance, exc, extra={"order_id": order_id})
        try:
            fresh, fresh_etag = await self._store.read(order_id)
        except NotFoundError:
            return Advanced(Stale=True, Reason=f"order {order_id} has no state record")
        if landed(fresh):
            return Advanced(State=fresh.ProcessState, Record=_dump(fresh), Etag=fresh_etag)
        try:
            updated, new_etag = await self._store.update(
                order_id, mutate, instance, confirm_refusal=True
            )
        except (StaleError, sm.IllegalTransition, NotFoundError) as exc:
            log.info("stale write by %s: %s", instance, exc, extra={"order_id": order_id})
            return Advanced(Stale=True, Reason=str(exc))
        return Advanced(State=updated.ProcessState, Record=_dump(updated), Etag=new_etag)

    # --- talking to agents ----------------------------------------------------------------

    def _request(self, send: SendRequest, app_id: str | None) -> AgentRequest:
        """The request `send` describes, sealed: its reply token and signature
        (domain.signing) under the app's keys; SettingsError when they are not set."""
        order_id, attempt = parse_attempt_instance_id(send.InstanceId)
        request = AgentRequest(
            InstanceId=send.InstanceId,
            OrderID=order_id,
            Step=send.Step,
            Action=send.Action,
            Attempt=attempt,
            AppId=app_id,
            IdempotencyKey=idempotency_key(order_id, send.Step),
            FencingToken=fencing_token(attempt),
            Deadline=send.Deadline,
            ReplyEvent=reply_event_name(send.Step, attempt, send.label),
            Payload=send.Payload,
            ListenUntil=send.ListenUntil,
        )
        return seal_request(self._settings.scheduler_keys(), request)

    async def send_agent_request(self, send: SendRequest, app_id: str | None = None) -> str:
        """`app_id`: the order's application, from the record when the caller
        has it (workflow 2.x's begin and advance), else the plan's (SendRequest.AppId)."""
        request = self._request(send, app_id or send.AppId)
        message_id = agent_request_message_id(send.InstanceId, send.Step, send.label)
        await self._publisher.send(
            AGENT_REQUESTS_QUEUE,
            encode(request),
            message_id,
            {"OrderID": request.OrderID, "Step": request.Step, "Action": request.Action},
        )
        self._crash_point("workflow.after_send")
        return message_id

    async def run_inline_step(self, send: SendRequest) -> AgentReply:
        """The in-app agent path: the same Agent library, run in an activity."""
        if self._inline_agent is None:
            raise NotConfigured("no inline agent configured")
        if not send.Payload and send.Action == "do":
            # 2.4's plan carries no payload unless the fast path gave it.
            order_id, _ = parse_attempt_instance_id(send.InstanceId)
            send = send.model_copy(update={"Payload": await self._payload(order_id)})
        try:
            return await self._inline_agent.handle(self._request(send, send.AppId))
        except Exception as exc:
            # The orchestration sees only this text (Durable's failure
            # reason): give it the type, which str(exc) alone leaves out.
            # Masked, and not chained: the history keeps the reason and the
            # details (a traceback quoting the original message).
            said = mask_card_numbers(f"{type(exc).__name__}: {exc}")
            log.warning("inline step %s of %s failed: %s", send.Step, send.InstanceId, said)
            raise InlineStepFailed(said) from None

    # --- telling people -------------------------------------------------------------------

    async def report_status(self, note: StatusNote) -> None:
        """Progress statuses are sent as they come. A terminal one is sent
        from the record's outbox (same message id as any later retry) and
        cleared; a failed send raises, so Durable retries it, and the entry
        stays for the Starter if every try fails."""
        order_id, attempt = parse_attempt_instance_id(note.InstanceId)
        if note.Status in _TERMINAL_STATUSES:
            try:
                record, etag = await self._store.read(order_id)
            except NotFoundError:
                record = None
            if record is not None and record.PendingStatus is not None:
                if record.PendingStatus.Status is note.Status and not await self._outbox.deliver(
                    record, etag
                ):
                    raise StatusNotSent(f"status {note.Status.value} of order {order_id} not sent")
                return
            if record is not None and record.ProcessState.is_terminal:
                return  # already delivered from the outbox (by a retry or the Starter)
        # A terminal status sent here (the record read showed no outbox entry
        # yet: a 1.0 record, or a read lagging the terminal write) takes the id
        # its outbox entry has (domain.state_machine: the attempt), so the two
        # can never both reach the reply queue.
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
        """An alert whose record is Error or CompensationFailed goes out with
        that terminal status from the record's outbox (reporting.StatusOutbox),
        which retries it until sent; only other alerts are sent here."""
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
