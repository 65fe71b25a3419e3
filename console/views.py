"""What each console page shows: reads from the stores, the durable client
and Service Bus (peek only), shaped for the templates; no HTTP here. Each
view's reads are bounded as docs/console.md's cost table says."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from adapters.console_reads import FINISHED_STATES, ConsoleReads, decode_page_token
from adapters.ports import ANY_OWNER, MessagePublisher
from adapters.servicebus import AGENT_REQUESTS_QUEUE, AGENT_RESPONSES_QUEUE, ALERTS_QUEUE
from adapters.settings import Settings, in_azure
from adapters.state_store import CosmosStateStore, decode_cursor
from console import actions, effects
from console import timeline as story
from console.peek import QueuePeeker
from console.security import Forbidden, record_version, redact
from domain import state_machine as sm
from domain.boundary import json_depth
from domain.errors import DomainError, NotFoundError
from domain.ids import attempt_instance_id, check_order_key, order_key
from domain.models import OrderState, ProcessState
from orchestrators.starter import STATUS_GRACE
from reporting import StatusOutbox, StatusReporter

log = logging.getLogger(__name__)

PAGE_SIZE = 50
PEEK_LIMIT = 50
STATUS_PEEK_LIMIT = 250
DETAIL_ATTEMPTS = 5  # orchestration statuses read per order (the latest attempts)
BUCKET = timedelta(minutes=5)
WORK_QUEUES = (AGENT_REQUESTS_QUEUE, AGENT_RESPONSES_QUEUE, ALERTS_QUEUE)
STATES = [s.value for s in ProcessState]
Copy = Callable[[Any], Any] | None  # a message to send in place of one taken
ANY_STATE = "any"  # the orders list's filter for every state
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # where a stuck list starts: before any deadline


@dataclass
class Deps:
    """What the views read from and act on (built per request by the root: bootstrap.App.console_deps)."""

    settings: Settings
    store: CosmosStateStore
    reads: ConsoleReads
    orders: Any  # adapters.ports.OrdersRepository
    servicebus: QueuePeeker
    durable: Any | None = None  # a DurableOrchestrationClient, for the order detail
    publisher: MessagePublisher | None = None  # for resending a parked status
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    # In Azure only the client application may read its reply queue
    # (infra/app/rbac.bicep): the console peeks them locally only.
    azure: bool = field(default_factory=in_azure)

    def queues(self) -> list[str]:
        """The queues whose dead letters the console shows: the ingress queues,
        the Scheduler's own, and the reply queues when not in Azure."""
        ingress = sorted(self.settings.ingress_queues.values())
        replies = [] if self.azure else sorted(self.settings.reply_queues.values())
        return list(dict.fromkeys([*ingress, *WORK_QUEUES, *replies]))


# --- overview ---------------------------------------------------------------------------


async def overview(deps: Deps) -> dict[str, Any]:
    counts = await state_counts(deps.store)
    gauge = await deps.store.read_backlog_gauge()
    cfg = deps.settings
    since = _floor(deps.now - timedelta(hours=1), BUCKET)
    finished, finished_cut = await deps.reads.finished_since(since)
    decisions, decisions_cut = await deps.reads.supervisor_decisions(since)
    alerts = await peek(deps, ALERTS_QUEUE, limit=10)
    await link_stored(deps, alerts["messages"])
    dead = await dead_letter_counts(deps)
    return {
        "dead_letters": dead,
        "dead_total": sum(c["count"] for c in dead.values()),
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


async def state_counts(store: CosmosStateStore) -> dict[str, int]:
    """How many orders are in each state: one count query per state."""
    found = await asyncio.gather(*(store.count_in_state(s) for s in STATES))
    return dict(zip(STATES, found, strict=True))


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
    # as Submit decides: it turns orders away above the limit, not at it
    rejecting = not stale and pending is not None and pending > cfg.pending_backlog_limit
    return {
        "pending_limit": cfg.pending_backlog_limit,
        "max_processing": cfg.max_processing,
        "processing": counts.get(ProcessState.PROCESSING.value, 0),
        "gauge_stale": stale,
        "rejecting": rejecting,
        "processing_full": counts.get(ProcessState.PROCESSING.value, 0) >= cfg.max_processing,
    }


FINISHED = [s.value for s in FINISHED_STATES]  # stacked in this order, bottom first


def _throughput(
    finished: list[tuple[str, datetime]], since: datetime, now: datetime
) -> dict[str, Any]:
    """Orders that reached each final state per 5 minutes, as stacked SVG bars."""
    n = -(-(now - since) // BUCKET)  # the last bucket is the current, partial one
    buckets: list[dict[str, Any]] = [
        {"start": since + i * BUCKET, **dict.fromkeys(FINISHED, 0)} for i in range(n)
    ]
    for state, at in finished:
        i = int((at - since) / BUCKET)
        if 0 <= i < n and state in FINISHED:
            buckets[i][state] += 1
    top = max((sum(b[s] for s in FINISHED) for b in buckets), default=0) or 1
    width, height = 24, 100
    for i, b in enumerate(buckets):
        b["x"] = 30 + i * (width + 4)
        y = 10 + height
        b["bars"] = []
        for state in FINISHED:
            h = round(height * b[state] / top, 1)
            y = round(y - h, 1)
            b["bars"].append({"state": state, "count": b[state], "y": y, "h": h})
        b["label"] = b["start"].strftime("%H:%M")
    return {
        "buckets": buckets,
        "top": top,
        "total": {s: sum(b[s] for b in buckets) for s in FINISHED},
        "bar_width": width,
        "svg_width": 30 + n * (width + 4) + 24,
    }


DECISION_KINDS = ("recovered", "long-retry", "failed")  # adapters.console_reads


def _decision_totals(decisions) -> dict[str, int]:
    return {kind: sum(d.kind == kind for d in decisions) for kind in DECISION_KINDS}


def _decision_buckets(decisions, since: datetime) -> list[dict[str, Any]]:
    """The Supervisor's decisions per 5 minutes, newest first."""
    out: dict[int, dict[str, Any]] = {}
    for d in decisions:
        i = int((d.at - since) / BUCKET)
        bucket = {"start": since + i * BUCKET, **dict.fromkeys(DECISION_KINDS, 0)}
        out.setdefault(i, bucket)[d.kind] += 1
    return [out[i] for i in sorted(out, reverse=True)]


# --- orders -----------------------------------------------------------------------------


class BadRequest(ValueError):
    """A parameter the console cannot use; the message is shown to the operator (400)."""


class NotFound(BadRequest):
    """A path naming nothing the console shows (404)."""


MAX_OLDER_MINUTES = 10 * 366 * 24 * 60  # ten years: older than that is any order
MAX_SEQUENCE = 2**63 - 1  # Service Bus sequence numbers are signed 64-bit
MAX_TOKEN = 512  # characters of a page token
_ASCII_DIGITS = re.compile(r"[0-9]{1,19}")
_APP_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_ORDER_ID_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _whole(raw: str | None, low: int, high: int, refused: str) -> int | None:
    """A number parameter from `low` to `high`, or None when absent; ASCII
    digits only (`²` and other Unicode digits are refused, not read)."""
    if raw is None or raw == "":
        return None
    if not _ASCII_DIGITS.fullmatch(raw) or not low <= int(raw) <= high:
        raise BadRequest(f"{refused} from {low} to {high}")
    return int(raw)


def parse_sequence(raw: str | None) -> int | None:
    """`from=`: a Service Bus sequence number to start a page at, or None."""
    return _whole(raw, 0, MAX_SEQUENCE, "'from' must be a sequence number")


def parse_minutes(raw: str | None, name: str) -> int | None:
    return _whole(raw, 1, MAX_OLDER_MINUTES, f"'{name}' must be a whole number of minutes")


def parse_page_token(raw: str | None, decode: Any) -> str | None:
    """A page token, checked by `decode` (which raises on a bad one) before
    any query uses it."""
    if raw is None or raw == "":
        return None
    if len(raw) > MAX_TOKEN:
        raise BadRequest("the page token is too long; start again from the first page")
    try:
        decode(raw)
    except Exception:  # noqa: BLE001 - any token that does not decode is the caller's mistake
        raise BadRequest(
            "the page token is not one this console made; start again from the first page"
        ) from None
    return raw


def parse_filters(params: dict[str, str]) -> dict[str, Any]:
    """The orders list's query parameters, each checked and bounded: a
    refused one raises BadRequest naming it (400), never reaches a query."""
    state = params.get("state") or ProcessState.ERROR.value
    if state not in STATES and state != ANY_STATE:
        raise BadRequest(f"unknown state {state[:40]!r}; one of {', '.join(STATES)} or {ANY_STATE}")
    app = params.get("app") or None
    if app is not None and not _APP_ID.fullmatch(app):
        raise BadRequest("an application id is lowercase letters, digits and '-' (at most 64)")
    prefix = (params.get("prefix") or "").strip() or None
    if prefix is not None and not _ORDER_ID_PREFIX.fullmatch(prefix):
        raise BadRequest(
            "an OrderID prefix is letters, digits, '.', '_' or '-' (at most 64), as OrderIDs are"
        )
    customer = (params.get("customer") or "").strip() or None
    if customer is not None and (len(customer) > 64 or not customer.isprintable()):
        raise BadRequest("a customer id is at most 64 printable characters")
    return {
        "state": state,
        "app": app,
        "customer": customer,
        "older": parse_minutes(params.get("older"), "older"),
        "newer": parse_minutes(params.get("newer"), "newer"),
        "prefix": prefix,
        "page": parse_page_token(params.get("page"), decode_page_token),
    }


async def orders(deps: Deps, filters: dict[str, Any]) -> dict[str, Any]:
    before = deps.now - timedelta(minutes=filters["older"]) if filters["older"] else None
    after = deps.now - timedelta(minutes=filters["newer"]) if filters.get("newer") else None
    try:
        ids = (
            await deps.orders.keys_of_customer(filters["customer"])
            if filters.get("customer")
            else None
        )
        rows, token = await deps.reads.list_orders(
            None if filters["state"] == ANY_STATE else filters["state"],
            PAGE_SIZE,
            app_id=filters["app"],
            created_before=before,
            page_token=filters["page"],
            id_prefix=filters.get("prefix"),
            created_after=after,
            ids=ids,
        )
    except DomainError as exc:
        raise BadRequest(str(exc)) from exc
    return {
        "rows": [
            {"row": r, "age": _human(deps.now - r.created_at) if r.created_at else ""} for r in rows
        ],
        "next_page": token,
        "filters": filters,
        "states": [*STATES, ANY_STATE],
        "apps": sorted(deps.settings.reply_queues),
    }


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
    page = parse_page_token(page, decode_cursor)
    try:
        found, token = await deps.store.query_expired(deps.now, EPOCH, PAGE_SIZE, page)
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
    attempts = story.timeline(record, statuses)
    step_effects = effects.side_effects(record, attempts)
    return {
        "record": record,
        "order": order,
        "attempts": attempts,
        "effects": step_effects,
        "held": effects.still_held(record, step_effects),
        # planned undos are shown only once a compensation ran
        "compensation": record.Compensation
        if any(e.At is not None for e in record.Compensation)
        else [],
        "status_messages": await status_messages(deps, record),
        "can_resubmit": record.ProcessState is ProcessState.ERROR,
        "can_retry": record.ProcessState is ProcessState.PENDING
        and record.NotBefore is not None
        and record.NotBefore > deps.now,
        "can_compensate": record.ProcessState
        in (ProcessState.ERROR, ProcessState.COMPENSATION_FAILED)
        and not record.CompensationRequested,
    }


async def orchestration_statuses(deps: Deps, record: OrderState) -> dict[int, dict[str, Any]]:
    """The durable client's status, with history and activity results, of the
    latest attempts (console.timeline reads them; nothing is shown raw)."""
    out: dict[int, dict[str, Any]] = {}
    if deps.durable is None or record.Attempt < 1:
        return out
    for attempt in range(max(1, record.Attempt - DETAIL_ATTEMPTS + 1), record.Attempt + 1):
        instance = attempt_instance_id(record.id, attempt)
        try:
            status = await deps.durable.get_status(
                # The input names the request the Starter sent (ADR 021l).
                instance,
                show_history=True,
                show_history_output=True,
                show_input=True,
            )
        except Exception as exc:  # noqa: BLE001 - the page still shows the record
            log.warning("console: status of %s unavailable: %s", instance, exc)
            out[attempt] = {"instance": instance, "error": "status unavailable"}
            continue
        if status is None or not getattr(status, "runtime_status", None):
            out[attempt] = {"instance": instance, "runtime_status": "not found"}
            continue
        # The extension answers `historyEvents`; the SDK keeps unknown keys as attributes.
        history = getattr(status, "historyEvents", None) or status.history or []
        out[attempt] = {
            "instance": instance,
            "runtime_status": getattr(status.runtime_status, "value", str(status.runtime_status)),
            "output": status.output,
            "history": history if isinstance(history, list) else [],
        }
    return out


async def status_messages(deps: Deps, record: OrderState) -> dict[str, Any]:
    """This order's status messages still on its reply queue (peeked); none
    in Azure, where only the client application reads it (Deps.azure)."""
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
    try:
        messages = await deps.servicebus.peek(
            queue, limit, dead_letter=dead_letter, from_sequence=from_sequence
        )
    except Exception as exc:  # noqa: BLE001 - one unreachable queue must not break the page
        log.warning("console: peek %s failed: %s", queue, exc)
        said = f"could not peek {queue}: {type(exc).__name__}"
        return {"messages": [], "error": said, "next": None}
    apps = queue_apps(deps.settings)
    out = [message_view(m, body_limit, queue, apps) for m in messages]
    last = max((m["sequence"] for m in out if m["sequence"] is not None), default=None)
    return {
        "messages": out,
        "error": None,
        "next": last + 1 if last is not None and len(out) >= limit else None,
    }


MAX_DEPTH = 32  # nesting of a body's JSON the console parses; deeper is shown as text
_SCAN_BYTES = 256 * 1024  # of a body the console reads at most


def _short(value: Any, limit: int = 200) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        text = bytes(value[:limit]).decode("utf-8", "replace")
    else:
        text = value if isinstance(value, str) else repr(value)
    return text[:limit]


def body_text(m: Any) -> tuple[str, str | None]:
    """(the body as text, a note on what kind it is) for any AMQP body:
    data sections (bytes), a value (null, number, string, list, map) or a
    sequence. Never raises."""
    kind = str(getattr(getattr(m, "body_type", None), "value", "") or "data").lower()
    try:
        body = m.body
        if kind == "value" or isinstance(body, dict | int | float | bool) or body is None:
            if isinstance(body, bytes | str):
                return _short(body, _SCAN_BYTES) or "", "AMQP value body"
            return _short(body, _SCAN_BYTES) or "None", f"AMQP value body ({type(body).__name__})"
        if isinstance(body, bytes | bytearray | memoryview | str):
            sections: list[Any] = [body]
        else:
            sections = []
            for section in body:
                sections.append(section)
                if len(sections) > 64:
                    break
        if kind == "sequence" or any(
            not isinstance(x, bytes | bytearray | memoryview | str) for x in sections
        ):
            return _short(sections, _SCAN_BYTES) or "", "AMQP sequence body"
        raw = b"".join(x.encode() if isinstance(x, str) else bytes(x) for x in sections)
        return raw[:_SCAN_BYTES].decode("utf-8", "replace"), None
    except Exception as exc:  # noqa: BLE001 - a body the SDK cannot even hand over
        return "", f"body unreadable ({type(exc).__name__})"


def message_view(
    m: Any, body_limit: int, queue: str | None = None, apps: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """One peeked message as the console's templates and the CLI show it,
    whatever it holds. Never raises: what cannot be read is shown as such."""
    try:
        return _read_message(m, body_limit, queue, apps or {})
    except Exception as exc:  # noqa: BLE001 - one message must not break a page
        log.warning("console: a message could not be shown: %s", exc)
        return {
            "id": _safe(lambda: _short(m.message_id)),
            "sequence": _safe(lambda: _int(m.sequence_number)),
            "enqueued": None,
            "reason": _safe(lambda: _short(m.dead_letter_reason)),
            "description": None,
            "properties": {},
            "parsed": None,
            "note": f"message unreadable ({type(exc).__name__})",
            "body": "",
        }


def _order_of(
    parsed: Any, props: dict[str, Any], queue: str | None, apps: Mapping[str, str]
) -> str | None:
    """The order key a message names (its OrderID in the body, else in the
    properties), when valid: a bare OrderID on an application's own queue
    (`apps`; for an alert, its dead letter's queue) is that application's
    order, elsewhere taken as it is (docs/adr/017f-order-keys.md)."""
    oid = parsed.get("OrderID") if isinstance(parsed, dict) else None
    oid = oid if isinstance(oid, str) else props.get("OrderID")
    if not isinstance(oid, str) or not valid_order_id(oid):
        return None
    if ":" in oid:
        return oid
    if queue == ALERTS_QUEUE:
        queue = parsed.get("Queue") if isinstance(parsed, dict) else None
    app = apps.get(queue) if isinstance(queue, str) else None
    try:
        return order_key(app, oid) if app else oid
    except ValueError:  # an AppId the settings should have refused
        return oid


def queue_apps(settings: Settings) -> dict[str, str]:
    """Which application each of its own queues (ingress, reply) belongs to;
    a queue two applications share names neither."""
    owners: dict[str, set[str]] = {}
    for mapping in (settings.ingress_queues, settings.reply_queues):
        for app, q in mapping.items():
            owners.setdefault(q, set()).add(app)
    return {q: next(iter(a)) for q, a in owners.items() if len(a) == 1}


def _safe(read: Any) -> Any:
    try:
        return read()
    except Exception:  # noqa: BLE001
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _read_message(
    m: Any, body_limit: int, queue: str | None, apps: Mapping[str, str]
) -> dict[str, Any]:
    text, note = body_text(m)
    parsed: Any = None
    if note is None and text:
        if json_depth(text, MAX_DEPTH) > MAX_DEPTH:
            note = f"JSON nested deeper than {MAX_DEPTH} levels, shown as text"
        else:
            try:
                parsed = json.loads(text)
            except (ValueError, RecursionError):
                parsed = None
    if parsed is not None:
        body = json.dumps(redact(parsed), indent=1, ensure_ascii=False, default=str)
    else:
        body = redact(text)
    props: dict[str, Any] = {}
    for k, v in list((m.application_properties or {}).items())[:64]:
        key = _short(k.decode("utf-8", "replace") if isinstance(k, bytes) else k, 100) or ""
        value = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        props[key] = value if isinstance(value, str | int | float | bool) else _short(value)
    enqueued = m.enqueued_time_utc
    return {
        "id": _short(m.message_id),
        "sequence": _int(m.sequence_number),
        "enqueued": enqueued if isinstance(enqueued, datetime) else None,
        "reason": _short(m.dead_letter_reason),
        "description": redact(_short(m.dead_letter_error_description, 1024) or "") or None,
        "properties": redact(props),
        "parsed": redact(parsed) if isinstance(parsed, dict) else None,
        "note": note,
        "data_body": note is None or note.startswith("JSON nested"),
        "order_id": _order_of(parsed, props, queue, apps),
        "body": body[:body_limit] + ("…" if len(body) > body_limit else ""),
    }


async def link_stored(deps: Deps, messages: list[dict[str, Any]]) -> None:
    """Keep a message's order link only when the order is stored: one Submit
    refused (invalid, or turned away) never was, so its link would 404. Such
    a message keeps the id as `unstored_order`, shown without a link."""
    named = [m["order_id"] for m in messages if m.get("order_id")]
    if not named or deps.reads is None:
        return
    try:
        stored = await deps.reads.stored(named)
    except DomainError as exc:  # the links stay: a 404 is better than no page
        log.warning("console: could not check which orders are stored: %s", exc)
        return
    for m in messages:
        if m.get("order_id") and m["order_id"] not in stored:
            m["unstored_order"], m["order_id"] = m["order_id"], None


async def alerts(deps: Deps, from_sequence: int | None) -> dict[str, Any]:
    page = await peek(deps, ALERTS_QUEUE, from_sequence=from_sequence)
    await link_stored(deps, page["messages"])
    return page


COUNT_CAP = 500  # dead letters counted per queue at most (peeked page by page)
ALERT_SCAN = 250  # alerts peeked to link dead letters to theirs
RESENDABLE = ("RetriesExhausted", "ProcessingFailed")


async def dead_letter_counts(deps: Deps) -> dict[str, dict[str, Any]]:
    """Per queue the console shows: how many dead letters (up to COUNT_CAP),
    whether there are more, or why it could not count."""
    queues = deps.queues()

    async def one(queue: str) -> dict[str, Any]:
        try:
            n, more = await deps.servicebus.count(queue, COUNT_CAP)
        except Exception as exc:  # noqa: BLE001 - one queue must not break the page
            log.warning("console: counting %s failed: %s", queue, exc)
            return {"count": 0, "more": False, "error": f"could not count: {type(exc).__name__}"}
        return {"count": n, "more": more, "error": None}

    counted = await asyncio.gather(*(one(q) for q in queues))
    return dict(zip(queues, counted, strict=True))


async def _alert_index(deps: Deps) -> dict[tuple[str, str], int]:
    """(dead letter's MessageId, queue) -> the sequence number of its alert."""
    peeked = await peek(deps, ALERTS_QUEUE, limit=ALERT_SCAN)
    out: dict[tuple[str, str], int] = {}
    for m in peeked["messages"]:
        p = m["parsed"] or {}
        if m["sequence"] is not None and isinstance(p.get("MessageId"), str):
            out.setdefault((p["MessageId"], str(p.get("Queue") or "")), m["sequence"])
    return out


def _links(queue: str, messages: list[dict[str, Any]], alerts: dict, replies: set[str]) -> None:
    """Each dead letter's order (when it names a valid OrderID), its alert
    (joined on MessageId and queue) and whether it may be resent."""
    for m in messages:
        m["alert"] = alerts.get((m["id"] or "", queue))
        m["can_resend"] = (
            m["reason"] in RESENDABLE
            and m.get("data_body", False)
            and queue not in replies
            and m["sequence"] is not None
        )


async def dead_letters(deps: Deps, queue: str | None, from_sequence: int | None) -> dict[str, Any]:
    queues = deps.queues()
    if queue is not None and queue not in queues:
        raise NotFound(f"no queue {queue[:100]!r} here")
    left_out = deps.azure and bool(deps.settings.reply_queues)
    counts = await dead_letter_counts(deps)
    alerts = await _alert_index(deps)
    replies = set(deps.settings.reply_queues.values())
    shown = {"queues": queues, "counts": counts, "queue": queue, "replies_left_out": left_out}
    if queue is None:
        # the summary: a few of each non-empty queue's dead letters; empty ones collapsed
        busy = [q for q in queues if counts[q]["count"] or counts[q]["error"]]
        peeked = await asyncio.gather(*(peek(deps, q, limit=5, dead_letter=True) for q in busy))
        for q, p in zip(busy, peeked, strict=True):
            _links(q, p["messages"], alerts, replies)
        await link_stored(deps, [m for p in peeked for m in p["messages"]])
        return {
            **shown,
            "total": sum(c["count"] for c in counts.values()),
            "per_queue": dict(zip(busy, peeked, strict=True)),
            "empty": [q for q in queues if q not in busy],
        }
    page = await peek(deps, queue, dead_letter=True, from_sequence=from_sequence)
    _links(queue, page["messages"], alerts, replies)
    await link_stored(deps, page["messages"])
    return {**shown, "peeked": page}


DEAD_LETTER_ACTIONS = {
    "resend": (
        "Resend",
        "Send this message again to its queue (as a new message with the same body and "
        "properties) and remove the dead letter. For a failure that is fixed now: an order "
        "resent to Submit is taken once (Submit is idempotent).",
    ),
    "discard": ("Discard", "Remove this dead letter for good; nothing is sent."),
}


async def _one_message(
    deps: Deps, queue: str, sequence: int, dead_letter: bool, gone: str
) -> dict[str, Any]:
    """Message `sequence` of `queue` (or of its dead letters) as peeked, for
    a confirmation page; NotFound saying `gone` when it is not there."""
    page = await peek(deps, queue, limit=1, dead_letter=dead_letter, from_sequence=sequence)
    found = [m for m in page["messages"] if m["sequence"] == sequence]
    if not found:
        raise NotFound(gone)
    await link_stored(deps, found)
    return found[0]


async def _take(
    deps: Deps, queue: str, shown: dict[str, Any], dead_letter: bool, copy: Copy, said: str
) -> None:
    """Complete the message `shown` (of `queue`, or of its dead letters),
    first sending `copy(message)` to `queue` when there is one; `said` is
    logged. NotFound when someone else took it first."""
    bus = deps.servicebus

    async def act(message: Any) -> None:
        if copy is not None:
            await bus.send(queue, copy(message))

    if not await bus.take(queue, shown["sequence"], act, dead_letter=dead_letter):
        raise NotFound(f"message {shown['sequence']} of {queue} is gone (acted on already?)")
    log.warning("console: %s", said, extra={"order_id": shown.get("order_id")})


async def dead_letter(deps: Deps, queue: str, sequence: int) -> dict[str, Any]:
    """One dead letter (for the confirmation page), or NotFound."""
    if queue not in deps.queues():
        raise NotFound(f"no queue {queue[:100]!r} here")
    gone = f"no dead letter {sequence} on {queue} (already resent or discarded?)"
    shown = await _one_message(deps, queue, sequence, True, gone)
    _links(queue, [shown], {}, set(deps.settings.reply_queues.values()))
    return shown


async def act_on_dead_letter(
    deps: Deps, queue: str, sequence: int, action: str, who: str, reason: str
) -> None:
    """Resend or discard one dead letter, logged with who did it and why (and
    the resent copy says so in its properties). NotFound when it is gone."""
    reason = _reason(reason)
    shown = await dead_letter(deps, queue, sequence)
    if action == "resend" and not shown["can_resend"]:
        raise BadRequest(
            f"only {' and '.join(RESENDABLE)} dead letters with a data body are resent; discard it"
        )
    resend = action == "resend"
    copy = (lambda m: _resent_copy(m, queue, sequence, who, reason)) if resend else None
    done = "resent" if resend else "discarded"
    said = f"dead letter {sequence} of {queue} ({shown['id']}) {done} by operator {who}: {reason}"
    await _take(deps, queue, shown, True, copy, said)


def _resent_copy(message: Any, queue: str, sequence: int, who: str, reason: str) -> Any:
    from adapters.settlement import RETRY_PROPERTY

    marks = {
        "ResentBy": actions.by(who),
        "ResentReason": reason,
        "ResentFrom": f"{queue}/$deadletterqueue/{sequence}",
    }
    return _copy(message, f"resent-{sequence}", marks, f"{queue}-{sequence}", RETRY_PROPERTY)


def _copy(
    message: Any, suffix: str, marks: dict[str, str], fallback_id: str, drop: str = ""
) -> Any:
    """`message`'s data body and headers, its properties with `marks` (less
    `drop`), under the id `{first id}/{suffix}`, the first id carried over
    from copy to copy (ORIGINAL_ID_PROPERTY). BadRequest for a non-data body."""
    from azure.servicebus import ServiceBusMessage

    from adapters.settlement import MAX_MESSAGE_ID, ORIGINAL_ID_PROPERTY

    props: dict[str | bytes, Any] = {
        (k.decode() if isinstance(k, bytes) else str(k)): v
        for k, v in (message.application_properties or {}).items()
        if k not in (drop, drop.encode())
    }
    original = props.get(ORIGINAL_ID_PROPERTY)
    original = original.decode() if isinstance(original, bytes) else original
    first_id = str(original or message.message_id or fallback_id)
    props.update({ORIGINAL_ID_PROPERTY: first_id, **marks})
    try:
        body = b"".join(bytes(x) for x in message.body)
    except TypeError:  # not a data body: nothing the app sent
        raise BadRequest("only a message with a data body is copied; remove it instead") from None
    return ServiceBusMessage(
        body,
        message_id=f"{first_id}/{suffix}"[:MAX_MESSAGE_ID],
        content_type=message.content_type,
        correlation_id=message.correlation_id,
        subject=message.subject,
        application_properties=props,
    )


# --- actions ----------------------------------------------------------------------------


def _reason(raw: str) -> str:
    """The operator's reason, as console.actions records it; BadRequest when it cannot be."""
    try:
        return actions.check_reason(raw)
    except actions.RefusedInput as exc:
        raise BadRequest(str(exc)) from None


ACTIONS = actions.ORDER_ACTIONS


async def act(
    deps: Deps,
    order_id: str,
    action: str,
    who: str,
    reason: str,
    expected_version: str | None = None,
) -> OrderState:
    """An order action (console.actions), recorded as done by `who` for
    `reason`. With `expected_version` (the record's version the confirmation
    showed) it is refused inside the etag-guarded update when the record is
    another version: a confirmation acts once, even when two POSTs race."""
    if action not in ACTIONS:
        raise BadRequest(f"unknown action {action!r}")
    reason = _reason(reason)

    def change(r: OrderState) -> OrderState:
        if expected_version is not None and record_version(r) != expected_version:
            raise Forbidden(
                "the order changed since it was shown (or this confirmation was used already); "
                "nothing done: look at it again"
            )
        return actions.apply(r, action, who, reason, datetime.now(UTC))

    record, _ = await deps.store.update(order_id, change, ANY_OWNER)
    log.info("console: %s %s by %s: %s", action, order_id, who, reason)
    return record


# --- terminal statuses a reply queue refused ------------------------------------------

PARKED_LIMIT = 200  # outbox entries read at most, oldest first
STATUS_ACTIONS = {
    "resend": (
        "Resend",
        "Send the terminal status now (and the operator alert a Failed or CompensationFailed "
        "one carries), with the message id it was written with, so the application gets it "
        "once; it leaves the outbox when the queue takes it. The Starter also resends parked "
        "statuses by itself once their queue takes sends again.",
    ),
}


async def _parked(
    deps: Deps, queue: str | None, order_id: str | None
) -> list[tuple[OrderState, str]]:
    """(record, etag) of each terminal status still in its outbox after the
    Starter's grace, oldest first, by the Starter's own query; with
    `order_id`, that order's entry for `queue` whatever its age."""
    if order_id is None:
        return await deps.store.query_unsent_statuses(PARKED_LIMIT, deps.now - STATUS_GRACE)
    try:
        record, etag = await deps.store.read(order_id)
    except NotFoundError:
        raise NotFound(f"no order {order_id}") from None
    return [(record, etag)] if record.PendingStatus and waits_for(record) == queue else []


def waits_for(record: OrderState) -> str:
    """The queue a parked outbox entry waits for: its reply queue, or the
    alerts queue once its status is sent and only its alert is left."""
    pending = record.PendingStatus
    return ALERTS_QUEUE if pending is not None and pending.Sent else record.ReplyTo


async def parked_statuses(
    deps: Deps, queue: str | None = None, order_id: str | None = None
) -> dict[str, Any]:
    """The parked terminal statuses (`_parked`): per reply queue how many,
    since when and the most tries of one, and the entries of `queue` (of
    every queue when None)."""
    page = await _parked(deps, queue, order_id)
    queues: dict[str, dict[str, Any]] = {}
    for record, _ in page:
        pending = record.PendingStatus
        assert pending is not None  # the query's filter
        q = queues.setdefault(waits_for(record), {"count": 0, "since": pending.At, "tries": 0})
        q["count"] += 1
        q["tries"] = max(q["tries"], pending.Tries)
    return {
        "queues": queues,
        "entries": [r for r, _ in page if queue is None or waits_for(r) == queue],
        "queue": queue,
        "cut": len(page) >= PARKED_LIMIT,
        "limit": PARKED_LIMIT,
        "resend_limit": PAGE_SIZE,
        "grace": int(STATUS_GRACE.total_seconds()),
    }


async def resend_statuses(
    deps: Deps, queue: str, order_id: str | None, who: str, reason: str
) -> dict[str, int]:
    """Send `queue`'s PAGE_SIZE oldest parked statuses (or `order_id`'s) now
    through reporting.StatusOutbox, as the Starter does, stopping at the
    first the queue refuses. For the alerts queue, the alerts left in
    entries whose status went. Returns `sent` and `refused` (0 or 1)."""
    if deps.publisher is None:
        raise BadRequest("Service Bus not configured")
    reason = _reason(reason)
    page = [(r, etag) for r, etag in await _parked(deps, queue, order_id) if waits_for(r) == queue]
    if order_id is not None and not page:
        raise NotFound(f"order {order_id} has no status waiting for {queue} (sent already?)")
    outbox = StatusOutbox(deps.store, StatusReporter(deps.publisher))
    sent = refused = 0
    for record, etag in page[:PAGE_SIZE]:
        delivery = await outbox.deliver(record, etag)
        if not (delivery.done if queue == ALERTS_QUEUE else delivery.status_sent):
            refused = 1
            break
        sent += 1
    log.warning(
        "console: %d parked statuses of %s resent by operator %s (%s): %s",
        sent,
        queue,
        who,
        "the queue refused" if refused else "all sent",
        reason,
        extra={"order_id": order_id},
    )
    return {"sent": sent, "refused": refused}


# --- bulk actions -------------------------------------------------------------------------

BULK_LIMIT = 50  # orders one bulk confirmation acts on at most


def bulk_ids(pairs: list[tuple[str, str]]) -> list[str]:
    """The order keys a bulk form names (`id=` repeated), checked, each once."""
    ids = list(dict.fromkeys(v.strip() for k, v in pairs if k == "id" and v.strip()))
    if not ids:
        raise BadRequest("choose at least one order")
    if len(ids) > BULK_LIMIT:
        raise BadRequest(f"at most {BULK_LIMIT} orders at once; you chose {len(ids)}")
    bad = [i for i in ids if not valid_order_id(i)]
    if bad:
        raise BadRequest(f"not an order key: {bad[0][:80]!r}")
    return ids


async def bulk_targets(deps: Deps, ids: list[str], action: str) -> list[dict[str, Any]]:
    """Each chosen order for the bulk confirmation: its record and version
    (the form's token is bound to them), or why it is left out."""
    if action not in ACTIONS:
        raise NotFound(f"no bulk action {action[:40]!r}")
    out: list[dict[str, Any]] = []
    for order_id in ids:
        try:
            record, _ = await deps.store.read(order_id)
        except NotFoundError:
            out.append({"id": order_id, "record": None, "version": "", "why": "no such order"})
            continue
        try:
            actions.apply(record, action, "check", "-", deps.now)
            why = None
        except sm.IllegalTransition as exc:
            why = str(exc)
        version = record_version(record)
        out.append({"id": order_id, "record": record, "version": version, "why": why})
    return out


async def bulk_act(
    deps: Deps, targets: list[tuple[str, str]], action: str, who: str, reason: str
) -> list[dict[str, Any]]:
    """`action` on each (order key, version shown), one by one, each refused on
    its own when it changed since the confirmation; what became of each."""
    done = []
    for order_id, version in targets:
        try:
            await act(deps, order_id, action, who, reason, expected_version=version)
            done.append({"id": order_id, "ok": True, "said": "done"})
        except (Forbidden, sm.IllegalTransition, DomainError) as exc:
            done.append({"id": order_id, "ok": False, "said": str(exc)[:300]})
    return done


# --- alerts: acknowledge, close -------------------------------------------------------------

ALERT_ACTIONS = {
    "acknowledge": (
        "Acknowledge",
        "Mark this alert as seen and being handled: it stays on the alerts queue, as a copy "
        "that names you, your reason and when (at the end of the queue), and the original goes.",
    ),
    "close": ("Close", "Remove this alert from the alerts queue for good: it is resolved."),
}
ACK_BY, ACK_REASON, ACK_AT = "AcknowledgedBy", "AcknowledgedReason", "AcknowledgedAt"


async def alert(deps: Deps, sequence: int) -> dict[str, Any]:
    """One alert (for the confirmation page), or NotFound."""
    gone = f"no alert {sequence} (already acknowledged or closed?)"
    return await _one_message(deps, ALERTS_QUEUE, sequence, False, gone)


async def act_on_alert(deps: Deps, sequence: int, action: str, who: str, reason: str) -> None:
    """Acknowledge (a marked copy replaces it) or close (it is completed) one
    alert, logged with who and why. NotFound when it is gone."""
    if action not in ALERT_ACTIONS:
        raise NotFound(f"no action {action[:40]!r} for an alert")
    reason = _reason(reason)
    shown = await alert(deps, sequence)
    ack = action == "acknowledge"
    marks = {ACK_BY: actions.by(who), ACK_REASON: reason, ACK_AT: deps.now.isoformat()}
    copy = (lambda m: _copy(m, f"ack-{m.sequence_number}", marks, "alert")) if ack else None
    done = "acknowledged" if ack else "closed"
    said = f"alert {sequence} ({shown['id']}) {done} by operator {who}: {reason}"
    await _take(deps, ALERTS_QUEUE, shown, False, copy, said)
