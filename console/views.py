"""What each console page shows: reads from the stores, the durable client
and Service Bus (peek only), shaped for the templates. No HTTP here, so the
views are tested against the real servers without a host.

Every view's store reads are bounded: the table in docs/console.md lists the
requests each one makes, and tests/console/test_request_cost.py holds them to it."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from adapters.console_reads import ConsoleReads, OrderRow
from adapters.ports import ANY_OWNER
from adapters.servicebus import AGENT_REQUESTS_QUEUE, AGENT_RESPONSES_QUEUE, ALERTS_QUEUE
from adapters.settings import Settings
from adapters.state_store import CosmosStateStore
from console.peek import QueuePeeker
from console.security import in_azure, redact
from domain import state_machine as sm
from domain.errors import DomainError, NotFoundError
from domain.ids import attempt_instance_id, check_order_key, parse_attempt_instance_id
from domain.models import OrderState, ProcessState, StepStatus

log = logging.getLogger(__name__)

PAGE_SIZE = 50
PEEK_LIMIT = 50
STATUS_PEEK_LIMIT = 250
DETAIL_ATTEMPTS = 5  # orchestration statuses read per order (the latest attempts)
BUCKET = timedelta(minutes=5)
WORK_QUEUES = (AGENT_REQUESTS_QUEUE, AGENT_RESPONSES_QUEUE, ALERTS_QUEUE)
STATES = [s.value for s in ProcessState]
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass
class Deps:
    """What the views read from and act on (built per request by console.functions)."""

    settings: Settings
    store: CosmosStateStore
    reads: ConsoleReads
    orders: Any  # adapters.ports.OrdersRepository
    servicebus: QueuePeeker | None
    durable: Any | None = None  # a DurableOrchestrationClient, for the order detail
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    # In Azure the app's identity may not read reply queues (only the client
    # application may: docs/design.md §2, infra/app/rbac.bicep), so the console does
    # not peek them there; locally it does, and says the list is local only.
    azure: bool = field(default_factory=in_azure)

    def queues(self) -> list[str]:
        """The queues whose dead letters the console shows: the ones the app
        may read (each application's ingress queue, where Submit dead-letters,
        and the Scheduler's own), plus the reply queues when not in Azure."""
        ingress = sorted(self.settings.ingress_queues.values())
        replies = [] if self.azure else sorted(self.settings.reply_queues.values())
        return list(dict.fromkeys([*ingress, *WORK_QUEUES, *replies]))


# --- overview ---------------------------------------------------------------------------


async def overview(deps: Deps) -> dict[str, Any]:
    counts = dict(
        zip(
            STATES,
            await asyncio.gather(*(deps.store.count_in_state(s) for s in STATES)),
            strict=True,
        )
    )
    gauge = await deps.store.read_backlog_gauge()
    cfg = deps.settings
    since = _floor(deps.now - timedelta(hours=1), BUCKET)
    finished, finished_cut = await deps.reads.finished_since(since)
    decisions, decisions_cut = await deps.reads.supervisor_decisions(since)
    alerts = await peek(deps, ALERTS_QUEUE, limit=10)
    return {
        "counts": counts,
        "count_bars": _bars(counts),
        "gauge": gauge,
        "gauge_age": (deps.now - gauge.measured_at).total_seconds() if gauge else None,
        "admission": _admission(cfg, counts, gauge, deps.now),
        "throughput": _throughput(finished, since, deps.now),
        "throughput_cut": finished_cut,
        "decisions": decisions[:20],
        "decision_totals": _decision_totals(decisions),
        "decision_buckets": _decision_buckets(decisions, since),
        "decisions_cut": decisions_cut,
        "alerts": alerts["messages"],
    }


def _floor(at: datetime, step: timedelta) -> datetime:
    """`at` rounded down to a multiple of `step` (buckets start on the clock's 5 minutes)."""
    seconds = int(step.total_seconds())
    return at.replace(second=0, microsecond=0) - timedelta(minutes=at.minute % (seconds // 60))


def _bars(counts: dict[str, int]) -> list[dict[str, Any]]:
    top = max(counts.values(), default=0) or 1
    return [{"state": s, "count": n, "width": round(300 * n / top, 1)} for s, n in counts.items()]


def _admission(cfg: Settings, counts: dict[str, int], gauge, now: datetime) -> dict[str, Any]:
    stale = gauge is None or now - gauge.measured_at > cfg.backlog_gauge_max_age
    pending = gauge.pending if gauge else None
    rejecting = not stale and pending is not None and pending >= cfg.pending_backlog_limit
    return {
        "pending_limit": cfg.pending_backlog_limit,
        "max_processing": cfg.max_processing,
        "processing": counts.get(ProcessState.PROCESSING.value, 0),
        "gauge_stale": stale,
        "rejecting": rejecting,
        "processing_full": counts.get(ProcessState.PROCESSING.value, 0) >= cfg.max_processing,
    }


def _throughput(
    finished: list[tuple[str, datetime]], since: datetime, now: datetime
) -> dict[str, Any]:
    n = -(-(now - since) // BUCKET)  # the last bucket is the current, partial one
    buckets: list[dict[str, Any]] = [
        {"start": since + i * BUCKET, "Processed": 0, "Error": 0} for i in range(n)
    ]
    for state, at in finished:
        i = int((at - since) / BUCKET)
        if 0 <= i < n and state in ("Processed", "Error"):
            buckets[i][state] += 1
    top = max((b["Processed"] + b["Error"] for b in buckets), default=0) or 1
    width, height = 24, 100
    for i, b in enumerate(buckets):
        b["x"] = 30 + i * (width + 4)
        b["h_ok"] = round(height * b["Processed"] / top, 1)
        b["h_err"] = round(height * b["Error"] / top, 1)
        b["y_ok"] = 10 + height - b["h_ok"]
        b["y_err"] = b["y_ok"] - b["h_err"]
        b["label"] = b["start"].strftime("%H:%M")
    return {
        "buckets": buckets,
        "top": top,
        "total": {
            "Processed": sum(b["Processed"] for b in buckets),
            "Error": sum(b["Error"] for b in buckets),
        },
        "bar_width": width,
        "svg_width": 30 + n * (width + 4) + 24,
    }


def _decision_totals(decisions) -> dict[str, int]:
    totals = {"recovered": 0, "long-retry": 0, "failed": 0}
    for d in decisions:
        totals[d.kind] += 1
    return totals


def _decision_buckets(decisions, since: datetime) -> list[dict[str, Any]]:
    """Decisions per 5 minutes: the Supervisor runs on a timer, so this is its
    recent work run by run at the chart's resolution."""
    out: dict[int, dict[str, Any]] = {}
    for d in decisions:
        i = int((d.at - since) / BUCKET)
        b = out.setdefault(
            i, {"start": since + i * BUCKET, "recovered": 0, "long-retry": 0, "failed": 0}
        )
        b[d.kind] += 1
    return [out[i] for i in sorted(out, reverse=True)]


# --- orders -----------------------------------------------------------------------------


class BadRequest(ValueError):
    """A filter the console cannot use; the message is shown to the operator."""


def parse_filters(params: dict[str, str]) -> dict[str, Any]:
    state = params.get("state") or ProcessState.ERROR.value
    if state not in STATES:
        raise BadRequest(f"unknown state {state!r}")
    app = params.get("app") or None
    if app is not None and not app.replace("-", "").isalnum():
        raise BadRequest("an application id is letters, digits and '-'")
    older = params.get("older") or None
    try:
        older_minutes = int(older) if older else None
    except ValueError:
        raise BadRequest("age must be a whole number of minutes") from None
    return {"state": state, "app": app, "older": older_minutes, "page": params.get("page") or None}


async def orders(deps: Deps, filters: dict[str, Any]) -> dict[str, Any]:
    before = deps.now - timedelta(minutes=filters["older"]) if filters["older"] else None
    try:
        rows, token = await deps.reads.list_orders(
            filters["state"],
            PAGE_SIZE,
            app_id=filters["app"],
            created_before=before,
            page_token=filters["page"],
        )
    except DomainError as exc:
        raise BadRequest(str(exc)) from exc
    return {
        "rows": [_with_age(r, deps.now) for r in rows],
        "next_page": token,
        "filters": filters,
        "states": STATES,
        "apps": sorted(deps.settings.reply_queues),
    }


def _with_age(row: OrderRow, now: datetime) -> dict[str, Any]:
    age = now - row.created_at if row.created_at else None
    return {"row": row, "age": _human(age) if age is not None else ""}


def _human(delta: timedelta) -> str:
    s = int(delta.total_seconds())
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


async def stuck(deps: Deps, page: str | None) -> dict[str, Any]:
    """Processing records past their deadline (the Supervisor's next work), by
    the Supervisor's own bounded query."""
    try:
        found, token = await deps.store.query_expired(deps.now, _EPOCH, PAGE_SIZE, page)
    except DomainError as exc:
        raise BadRequest(str(exc)) from exc
    return {
        "records": [
            {"record": r, "late": _human(deps.now - r.CompleteBy) if r.CompleteBy else ""}
            for r, _ in found
        ],
        "next_page": token,
    }


# --- one order --------------------------------------------------------------------------


def valid_order_id(order_id: str) -> bool:
    """An order key (`{app}:{OrderID}`, or a record's bare OrderID from before keys named the application)."""
    try:
        check_order_key(order_id)
        return True
    except ValueError:
        return False


async def order_detail(deps: Deps, order_id: str) -> dict[str, Any] | None:
    if not valid_order_id(order_id):
        return None
    try:
        record, _ = await deps.store.read(order_id)
    except NotFoundError:
        return None
    order = None
    try:
        submitted = await deps.orders.get(order_id)
        order = redact(json.loads(submitted.model_dump_json()))
    except NotFoundError:
        pass
    statuses = await orchestration_statuses(deps, record)
    return {
        "record": record,
        "order": order,
        "attempts": timeline(record, statuses),
        "steps": record.Steps,
        "compensation": record.Compensation,
        "status_messages": await status_messages(deps, record),
        "can_resubmit": record.ProcessState is ProcessState.ERROR,
        "can_compensate": record.ProcessState
        in (ProcessState.ERROR, ProcessState.COMPENSATION_FAILED)
        and not record.CompensationRequested,
    }


async def orchestration_statuses(deps: Deps, record: OrderState) -> dict[int, dict[str, Any]]:
    """The durable client's status (with history) of the latest attempts."""
    out: dict[int, dict[str, Any]] = {}
    if deps.durable is None or record.Attempt < 1:
        return out
    for attempt in range(max(1, record.Attempt - DETAIL_ATTEMPTS + 1), record.Attempt + 1):
        instance = attempt_instance_id(record.id, attempt)
        try:
            status = await deps.durable.get_status(instance, show_history=True)
        except Exception as exc:  # noqa: BLE001 - the page still shows the record
            log.warning("console: status of %s unavailable: %s", instance, exc)
            out[attempt] = {"instance": instance, "error": "status unavailable"}
            continue
        if status is None or not getattr(status, "runtime_status", None):
            out[attempt] = {"instance": instance, "runtime_status": "not found"}
            continue
        out[attempt] = {
            "instance": instance,
            "runtime_status": getattr(status.runtime_status, "value", str(status.runtime_status)),
            "created": status.created_time,
            "updated": status.last_updated_time,
            "custom_status": redact(status.custom_status),
            "output": redact(status.output),
            # The extension answers `historyEvents`; the SDK keeps unknown keys as attributes.
            "events": _orchestration_events(
                getattr(status, "historyEvents", None) or status.history or []
            ),
        }
    return out


_SHOWN_EVENTS = {
    "ExecutionStarted",
    "TaskCompleted",
    "TaskFailed",
    "TimerCreated",
    "TimerFired",
    "EventRaised",
    "ExecutionCompleted",
    "ExecutionTerminated",
    "ExecutionFailed",
}
# Fields of activity inputs and replies worth showing; never payloads (which
# may carry payment references).
_INPUT_FIELDS = ("Kind", "Step", "Action", "Status", "Detail", "Reason", "Outcome", "Error")


def _fields(raw: Any) -> dict[str, Any]:
    value = raw
    for _ in range(2):  # event inputs arrive JSON-encoded, sometimes twice
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return {}
    if not isinstance(value, dict):
        return {}
    return {k: value[k] for k in _INPUT_FIELDS if value.get(k) not in (None, "")}


def _orchestration_events(history: list[Any]) -> list[dict[str, Any]]:
    events = []
    for e in history:
        if not isinstance(e, dict):
            continue
        kind = str(e.get("EventType") or "")
        if kind not in _SHOWN_EVENTS:
            continue
        fields = _fields(e.get("Input"))
        detail = " ".join(str(v) for v in fields.values())
        if kind in ("TaskCompleted", "TaskFailed"):
            what = f"{e.get('FunctionName') or ''} {detail}"
            if kind == "TaskFailed":
                what += f" failed: {e.get('Reason') or ''}"
        elif kind == "TimerCreated":
            what = f"deadline timer set for {e.get('FireAt', '')}"
        elif kind == "TimerFired":
            what = "deadline timer fired: the step's reply did not come in time"
        elif kind == "EventRaised":
            what = f"reply {e.get('Name') or ''}: {detail}"
        elif kind.startswith("Execution") and kind != "ExecutionStarted":
            what = f"finished: {e.get('OrchestrationStatus') or kind.removeprefix('Execution').lower()}"
        else:
            what = "started"
        tone = (
            "warn"
            if kind == "TimerFired" or fields.get("Outcome") == "transient"
            else (
                "bad"
                if kind in ("TaskFailed", "ExecutionFailed") or fields.get("Outcome") == "permanent"
                else ""
            )
        )
        events.append(
            {
                "at": _parse_time(e.get("Timestamp")),
                "kind": kind,
                "text": redact(what.strip())[:400],
                "tone": tone,
            }
        )
    return events


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def timeline(record: OrderState, statuses: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every attempt, oldest first, each with its events in time order: the
    record's History (claims, Supervisor decisions, operator actions), its
    steps' start, deadline and outcome, the compensation log, and the
    orchestration's own history (timers, replies, activities)."""
    events: dict[int, list[dict[str, Any]]] = {}

    def add(attempt: int, at: datetime | None, source: str, text: str, tone: str = "") -> None:
        events.setdefault(attempt, []).append(
            {"at": at, "source": source, "text": text, "tone": tone}
        )

    # History is bounded (oldest entries dropped), so attempts are counted back
    # from the record's current one: each claim started the attempt it names.
    attempt = record.Attempt
    for h in reversed(record.History):
        owner = _attempt_of(h.By)
        at_attempt = owner if owner is not None else attempt
        text = f"{h.From.value if h.From else '(new)'} → {h.To.value} by {h.By}"
        if h.Reason:
            text += f": {h.Reason}"
        tone = (
            "bad"
            if h.To in (ProcessState.ERROR, ProcessState.COMPENSATION_FAILED)
            else ("warn" if h.By == "supervisor" else "")
        )
        add(at_attempt, h.At, "state", text, tone)
        if h.To in (ProcessState.PROCESSING, ProcessState.COMPENSATING) and h.From in (
            ProcessState.PENDING,
            ProcessState.ERROR,
            ProcessState.COMPENSATION_FAILED,
        ):
            attempt = max(0, attempt - 1)
    for name, step in record.Steps.items():
        a = step.Attempt
        if step.StartedAt:
            add(a, step.StartedAt, "step", f"{name} started")
        if step.CompleteBy and not (step.CompletedAt and step.CompletedAt <= step.CompleteBy):
            add(a, step.CompleteBy, "deadline", f"{name} deadline", "muted")
        if step.CompletedAt:
            add(
                a,
                step.CompletedAt,
                "step",
                f"{name} {step.Status.value.lower()}",
                "good" if step.Status is StepStatus.COMPLETED else "",
            )
        elif step.Status in (StepStatus.FAILED, StepStatus.RUNNING):
            add(
                a,
                step.StartedAt,
                "step",
                f"{name} {step.Status.value.lower()}",
                "bad" if step.Status is StepStatus.FAILED else "",
            )
    for entry in record.Compensation:
        if entry.At is None:
            continue  # a planned undo, not yet tried
        text = f"undo {entry.Step}: {entry.Outcome}" + (f" ({entry.Error})" if entry.Error else "")
        add(
            record.Attempt,
            entry.At,
            "compensation",
            text,
            "bad" if entry.Outcome == "Failed" else "",
        )
    for a, status in statuses.items():
        for e in status.get("events", []):
            add(a, e["at"], "orchestration", e["text"], e["tone"])
    out = []
    for a in sorted(events):
        items = sorted(events[a], key=lambda e: (e["at"] is None, e["at"] or _EPOCH))
        out.append(
            {
                "attempt": a,
                "instance": attempt_instance_id(record.id, a) if a else None,
                "orchestration": statuses.get(a),
                "events": items,
            }
        )
    return out


def _attempt_of(by: str) -> int | None:
    try:
        return parse_attempt_instance_id(by)[1]
    except ValueError:
        return None


async def status_messages(deps: Deps, record: OrderState) -> dict[str, Any]:
    """Status messages for this order still on its reply queue (peeked: the
    application may already have received the earlier ones). Not in Azure,
    where the reply queue is the client application's alone to read."""
    if deps.azure:
        return {"queue": record.ReplyTo, "messages": [], "error": None, "local_only": False}
    peeked = await peek(deps, record.ReplyTo, limit=STATUS_PEEK_LIMIT, body_limit=600)
    mine = [m for m in peeked["messages"] if m["properties"].get("OrderID") == record.order_id]
    return {"queue": record.ReplyTo, "messages": mine, "error": peeked["error"], "local_only": True}


# --- Service Bus: peek, never receive ---------------------------------------------------


async def peek(
    deps: Deps,
    queue: str,
    limit: int = PEEK_LIMIT,
    dead_letter: bool = False,
    from_sequence: int | None = None,
    body_limit: int = 400,
) -> dict[str, Any]:
    """Up to `limit` messages of `queue` (or its dead-letter queue) without
    receiving them: nothing is locked, consumed or counted as a delivery."""
    if deps.servicebus is None:
        return {"messages": [], "error": "Service Bus not configured", "next": None}
    try:
        messages = await deps.servicebus.peek(
            queue, limit, dead_letter=dead_letter, from_sequence=from_sequence
        )
    except Exception as exc:  # noqa: BLE001 - one unreachable queue must not break the page
        log.warning("console: peek %s failed: %s", queue, exc)
        return {
            "messages": [],
            "error": f"could not peek {queue}: {type(exc).__name__}",
            "next": None,
        }
    out = [_message(m, body_limit) for m in messages]
    last = max((m["sequence"] for m in out if m["sequence"] is not None), default=None)
    return {
        "messages": out,
        "error": None,
        "next": last + 1 if last is not None and len(out) >= limit else None,
    }


def _message(m: Any, body_limit: int) -> dict[str, Any]:
    raw = b"".join(m.body) if not isinstance(m.body, bytes | str) else m.body
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    try:
        parsed = json.loads(text)
        body = json.dumps(redact(parsed), indent=1, ensure_ascii=False)
    except ValueError:
        parsed = None
        body = redact(text)
    props = {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else v
        )
        for k, v in (m.application_properties or {}).items()
    }
    return {
        "id": m.message_id,
        "sequence": m.sequence_number,
        "enqueued": m.enqueued_time_utc,
        "reason": m.dead_letter_reason,
        "description": redact(m.dead_letter_error_description or "") or None,
        "delivery_count": m.delivery_count,
        "properties": redact(props),
        "parsed": redact(parsed) if isinstance(parsed, dict) else None,
        "body": body[:body_limit] + ("…" if len(body) > body_limit else ""),
    }


async def alerts(deps: Deps, from_sequence: int | None) -> dict[str, Any]:
    return await peek(deps, ALERTS_QUEUE, from_sequence=from_sequence)


async def dead_letters(deps: Deps, queue: str | None, from_sequence: int | None) -> dict[str, Any]:
    queues = deps.queues()
    if queue is not None and queue not in queues:
        raise BadRequest(f"no queue {queue!r} here")
    replies_left_out = deps.azure and bool(deps.settings.reply_queues)
    if queue is None:
        # the summary: a few of each queue's dead letters
        peeked = await asyncio.gather(*(peek(deps, q, limit=5, dead_letter=True) for q in queues))
        return {
            "queues": queues,
            "per_queue": dict(zip(queues, peeked, strict=True)),
            "queue": None,
            "replies_left_out": replies_left_out,
        }
    return {
        "queues": queues,
        "queue": queue,
        "replies_left_out": replies_left_out,
        "peeked": await peek(deps, queue, dead_letter=True, from_sequence=from_sequence),
    }


# --- actions ----------------------------------------------------------------------------

ACTIONS = {
    "resubmit": (
        "Resubmit",
        "Put this Error order back to Pending with a fresh retry budget; "
        "completed steps stay completed and the next attempt resumes after them.",
    ),
    "compensate": (
        "Compensate",
        "Undo this order's completed steps in reverse order; the Starter "
        "runs the compensation as a new attempt.",
    ),
}


async def act(deps: Deps, order_id: str, action: str, who: str) -> OrderState:
    """The operator commands of cli/ (the same store call and transition),
    recorded in the order's history as done by `who`."""
    by = f"operator:{who}"[:100]
    if action == "resubmit":
        transition = sm.resubmit
    elif action == "compensate":
        transition = sm.request_compensation
    else:
        raise BadRequest(f"unknown action {action!r}")
    record, _ = await deps.store.update(
        order_id, lambda r: transition(r, datetime.now(UTC), by=by), ANY_OWNER
    )
    log.info("console: %s %s by %s", action, order_id, who)
    return record
