"""An order's story for the operator: per attempt, what happened in causal
order and in the domain's words. Pure functions of the state record and the
orchestration statuses (with history) the durable client returned, tested on
recorded histories; the rules (causal order kept, each error once, domain
words, deadlines on the call they bound) are docs/console.md's "Reading an
order"."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from agents.config import load_step_catalog
from console.security import redact
from domain.ids import parse_attempt_instance_id
from domain.models import OrderState, ProcessState
from domain.steps import UnknownStep

_MAX_TEXT = 400


@dataclass
class Event:
    at: datetime | None
    kind: str  # request, reply, state, deadline, note
    text: str
    tone: str = ""
    detail: str | None = None  # the one place an error's text is shown
    calls: list[dict[str, Any]] = field(default_factory=list)
    raw: str | None = None  # the request's input or the reply as sent, redacted


RAW_LIMIT = 4000  # characters of a raw input or output shown


def raw_text(value: Any) -> str | None:
    """An activity's input or a reply as the operator may read it: payment
    data dropped and card numbers masked (console.security.redact), indented
    JSON, cut at RAW_LIMIT characters."""
    if not value:
        return None
    text = json.dumps(redact(value), indent=1, ensure_ascii=False, default=str)
    return text if len(text) <= RAW_LIMIT else text[: RAW_LIMIT - 1] + "…"


@dataclass
class Call:
    """One request of a step (do, or one undo try) and what became of it."""

    step: str
    action: str
    requested_at: datetime | None
    deadline: datetime | None = None
    reply: dict[str, Any] | None = None
    replied_at: datetime | None = None
    missed: bool = False


def parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def _data(raw: Any) -> dict[str, Any]:
    """An event's input or result as a dict: they arrive as objects or JSON,
    sometimes JSON-encoded twice. Anything else is an empty dict."""
    value = raw
    for _ in range(3):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                return {}
        else:
            break
    return value if isinstance(value, dict) else {}


def _text(value: Any, limit: int = _MAX_TEXT) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- domain words ---------------------------------------------------------------------


_catalog = cache(load_step_catalog)  # the catalog this process runs (STEP_CATALOG_FILE)


def label(step: str | None, action: str = "do") -> str:
    """A step call in the domain's words, the operation then the service of
    its catalog entry: `charge payment`, `refund payment`. A step the
    catalog does not know shows as its name (`undo <name>` for its undo)."""
    if not step:
        return "a step"
    try:
        entry = _catalog().step_named(step)
    except UnknownStep:
        return step if action == "do" else f"undo {step}"
    return f"{entry.do_operation if action == 'do' else entry.undo_operation} {entry.service}"


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def outcome(status: dict[str, Any] | None) -> tuple[str, str]:
    """An attempt's badge: its outcome in words, and a tone."""
    if not status:
        return "history not available", "muted"
    if status.get("error"):
        return "status unavailable", "muted"
    runtime = str(status.get("runtime_status") or "")
    if runtime in ("Running", "Pending"):
        return "running", "warn"
    if runtime == "not found":
        return "history not available", "muted"
    output = _data(status.get("output"))
    kind, step = output.get("Outcome"), output.get("Step")
    if kind == "processed":
        return "Processed", "good"
    if kind == "compensated":
        return "compensated: every requested step undone", "warn"
    if kind == "compensation_failed":
        return "compensation failed", "bad"
    if kind == "compensation_deferred":  # ADR 019a
        return "undo unconfirmed: the compensation waits for a long retry", "warn"
    if kind == "failed":
        return f"failed at {label(step)}", "bad"
    if kind == "timed_out":
        detail = str(output.get("Detail") or "")
        if detail == "deadline passed":
            return f"timed out at {label(step)}: no reply by the deadline", "warn"
        if "no answer within" in detail or "deadline reached" in detail:
            return f"timed out at {label(step)}: the service did not answer in time", "warn"
        return f"gave up at {label(step)} for now (transient)", "warn"
    if kind == "stale":
        return "superseded by a later attempt", "muted"
    if kind == "unconfirmed":
        return "finished, final write unconfirmed", "warn"
    if runtime in ("Failed", "Terminated"):
        return f"orchestration {runtime.lower()}", "bad"
    return (runtime.lower() or "unknown"), "muted"


def _reply_words(call: Call) -> tuple[str, str, str | None]:
    """(what the reply said, tone, the error's text if any)."""
    reply = call.reply or {}
    said = str(reply.get("Outcome") or "")
    raw_result = reply.get("Result")
    result: dict[str, Any] = raw_result if isinstance(raw_result, dict) else {}
    what = label(call.step, call.action)
    if said == "ok":
        if call.action == "undo" and result.get("Status") == "nothing-to-undo":
            return f"{what}: nothing to undo (the service had no effect to reverse)", "good", None
        ref = result.get("Reference")
        return f"{what}: done" + (f" ({_text(ref, 80)})" if ref else ""), "good", None
    error = _text(reply.get("Error")) or None
    if said == "permanent":
        return f"{what}: refused (permanent)", "bad", error
    if said == "transient":
        return f"{what}: the agent gave up for now (transient)", "warn", error
    return f"{what}: answered {said or 'nothing'}", "", error


def _calls(reply: dict[str, Any] | None) -> list[dict[str, Any]]:
    raw = (reply or {}).get("Calls")
    if not isinstance(raw, list):
        return []
    out: list[dict[str, Any]] = []
    first: datetime | None = None
    for c in raw[:32]:
        if not isinstance(c, dict):
            continue
        at = parse_time(c.get("At"))
        ms = c.get("Ms") if isinstance(c.get("Ms"), int) else None
        if first is None:
            first = at
        out.append(
            {
                "at": at,
                "after": duration((at - first).total_seconds()) if at and first else None,
                "took": duration(ms / 1000) if ms is not None else "?",
                "outcome": _text(c.get("Outcome"), 20),
            }
        )
    return out


def _deadline_words(call: Call) -> tuple[str, str]:
    if call.deadline is None:
        return "", ""
    if call.replied_at is None:
        return ("deadline missed" if call.missed else "deadline pending"), (
            "bad" if call.missed else ""
        )
    spare = (call.deadline - call.replied_at).total_seconds()
    if spare >= 0:
        return f"deadline met ({duration(spare)} to spare)", ""
    return f"deadline missed by {duration(-spare)}", "bad"


# --- one attempt's orchestration history ---------------------------------------------


# What finish_attempt wrote, by the state it left the record in.
_FINISHED = {
    ProcessState.PROCESSED.value: ("order Processed", "good"),
    ProcessState.COMPENSATING.value: (
        "compensating: every requested step is undone, newest first",
        "warn",
    ),
    ProcessState.ERROR.value: ("order failed (Error): nothing to undo", "bad"),
}


class _Walk:
    """One attempt's history read in order: its events and its step calls."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.calls: list[Call] = []
        self.awaiting_timer: Call | None = None

    def request(
        self,
        step: Any,
        action: str,
        at: datetime | None,
        attempt_try: Any = None,
        raw: Any = None,
    ) -> Call | None:
        if not step:
            return None
        call = Call(step=step, action=action, requested_at=at)
        self.calls.append(call)
        self.awaiting_timer = call
        what = label(step, action)
        if action == "undo" and isinstance(attempt_try, int) and attempt_try > 0:
            what += f" (try {attempt_try + 1})"
        self.events.append(Event(at, "request", f"{what}: requested", raw=raw_text(raw)))
        return call

    def answered(self, call: Call, reply: dict[str, Any], at: datetime | None) -> None:
        call.reply, call.replied_at = reply, at
        text, tone, error = _reply_words(call)
        took = (
            f" after {duration((at - call.requested_at).total_seconds())}"
            if at and call.requested_at
            else ""
        )
        deadline, deadline_tone = _deadline_words(call)
        detail = " · ".join(x for x in (deadline, error) if x) or None
        self.events.append(
            Event(
                at,
                "reply",
                text + took,
                tone or deadline_tone,
                detail,
                _calls(reply),
                raw_text(reply),
            )
        )

    def open_call(self, step: Any, action: Any) -> Call | None:
        for c in reversed(self.calls):
            if c.step == step and c.action == action and c.reply is None:
                return c
        return None

    def event(self, raw: Any) -> None:
        if not isinstance(raw, dict):
            return
        kind = str(raw.get("EventType") or "")
        at = parse_time(raw.get("Timestamp"))
        if kind == "ExecutionStarted":
            self.events.append(Event(at, "state", "attempt began"))
            self.sent_by_starter(_data(raw.get("Input")), at)
        elif kind == "TaskCompleted":
            self.task_completed(raw, at)
        elif kind == "TaskFailed":
            fn = str(raw.get("FunctionName") or "")
            what = f"{_ACTIVITY_WORDS.get(fn, 'a workflow step')} failed"
            self.events.append(Event(at, "state", what, "bad", _text(raw.get("Reason"))))
        elif kind == "TimerCreated":
            if self.awaiting_timer is not None and self.awaiting_timer.deadline is None:
                self.awaiting_timer.deadline = parse_time(raw.get("FireAt"))
                self.awaiting_timer = None
        elif kind == "TimerFired":
            self.timer_fired(parse_time(raw.get("FireAt")), at)
        elif kind == "EventRaised":
            reply = _data(raw.get("Input"))
            step, action = _answered_call(raw.get("Name"), self.calls)
            call = self.open_call(step, action)
            if call is None:
                # an answer to a try whose deadline already passed (ADR 005) or unknown
                call = Call(step=str(step or "?"), action=action, requested_at=None)
                self.calls.append(call)
            self.answered(call, reply, at)

    def sent_by_starter(self, given: dict[str, Any], at: datetime | None) -> None:
        """The first step's request, which the Starter sends as it starts the
        attempt (ADR 021l): the attempt's input names it (`Sent`)."""
        sent = given.get("Sent")
        if not isinstance(sent, str) or not sent:
            return
        deadline = given.get("Deadline")
        shown = {"Step": sent, "Deadline": deadline, "SentBy": "starter"}
        call = self.request(sent, "do", at, raw=shown)
        if call is not None:
            call.deadline = parse_time(deadline)

    def timer_fired(self, fire: datetime | None, at: datetime | None) -> None:
        for c in self.calls:
            if c.reply is None and c.deadline is not None and c.deadline == fire:
                c.missed = True
                what = f"{label(c.step, c.action)}: no answer by its deadline: deadline missed"
                self.events.append(Event(at, "deadline", what, "bad"))

    def task_completed(self, raw: dict[str, Any], at: datetime | None) -> None:
        fn = str(raw.get("FunctionName") or "")
        inp = _data(raw.get("Input"))
        res = _data(raw.get("Result"))
        if res.get("Stale"):
            self.events.append(
                Event(at, "state", "superseded: another attempt owns the order", "muted")
            )
        elif fn == "send_agent_request":
            step, action = inp.get("Step"), str(inp.get("Action") or "do")
            self.request(step, action, at, inp.get("Try"), raw=inp)
        elif fn == "send_step":  # a request, no write (the claim marked the step)
            call = self.request(inp.get("Step"), "do", at, raw=inp)
            if call is not None:  # the attempt's one deadline bounds each step
                call.deadline = parse_time(inp.get("Deadline"))
        elif fn == "finish_attempt":
            end = _FINISHED.get(str(res.get("State") or ""))
            if end is not None:
                self.events.append(Event(at, "state", *end))
        elif fn == "write_state" and inp.get("Kind") == "finish_compensation":
            state = res.get("State")
            tone = "good" if state == ProcessState.COMPENSATED.value else "bad"
            self.events.append(Event(at, "state", f"order {state}", tone))
        elif fn == "run_inline_step":
            # the write that started the step already "requested" it
            action = str(inp.get("Action") or "do")
            call = self.open_call(inp.get("Step"), action) or self.request(
                inp.get("Step"), action, parse_time(raw.get("ScheduledTime")) or at, raw=inp
            )
            if call is not None and res:
                call.deadline = parse_time(inp.get("Deadline"))
                self.answered(call, res, at)
        elif fn == "report_status":
            told = f"client told: {_text(inp.get('Status'), 40)}"
            self.events.append(Event(at, "note", told, "muted"))
        elif fn == "raise_alert":
            raised = f"operator alert raised ({_text(inp.get('Kind'), 40)})"
            self.events.append(Event(at, "note", raised, "warn"))
        # the other writes (transient, undo_*, defer_compensation): the reply said it


_ATTEMPT_SUFFIX = re.compile(r"-\d+$")
_UNDO_TRY = re.compile(r"^(?P<step>.+)-undo-\d+$")


def _answered_call(name: Any, calls: list[Call]) -> tuple[Any, str]:
    """(step, action) a raised reply answers, as its event's name says
    (`domain.ids.reply_event_name`: `reply-{step}[-undo-{try}]-{attempt}`;
    the reply itself names neither, ADR 021h). The name is matched against
    the steps requested so far, newest first, so a step named like a suffix
    cannot be misread."""
    if not isinstance(name, str) or not name.startswith("reply-"):
        return None, "do"
    stem = _ATTEMPT_SUFFIX.sub("", name[len("reply-") :])
    for c in reversed(calls):
        if stem == c.step:
            return c.step, "do"
        if stem.startswith(f"{c.step}-undo-") and stem[len(c.step) + 6 :].isdigit():
            return c.step, "undo"
    undo = _UNDO_TRY.match(stem)
    return (undo["step"], "undo") if undo else (stem or None, "do")


_ACTIVITY_WORDS = {
    "write_state": "recording the order's state",
    "send_agent_request": "sending the request",
    "send_step": "sending the request",
    "finish_attempt": "recording the attempt's end",
    "report_status": "telling the client",
    "raise_alert": "raising the alert",
    "load_plan": "reading the order",
    "run_inline_step": "the in-app step",
}


# --- the record's history -------------------------------------------------------------


def _attempt_of(by: str) -> int | None:
    try:
        return parse_attempt_instance_id(by)[1]
    except ValueError:
        return None


def _record_events(record: OrderState) -> dict[int, list[tuple[Event, str]]]:
    """The record's History per attempt, each with who made it. Attempts are
    counted back from the record's current one (History drops its oldest
    entries): each claim started the attempt it names."""
    out: dict[int, list[tuple[Event, str]]] = {}
    attempt = record.Attempt
    for h in reversed(record.History):
        owner = _attempt_of(h.By)
        at_attempt = owner if owner is not None else attempt
        out.setdefault(at_attempt, []).append((_history_event(h), h.By))
        if h.To in (ProcessState.PROCESSING, ProcessState.COMPENSATING) and h.From in (
            ProcessState.PENDING,
            ProcessState.ERROR,
            ProcessState.COMPENSATION_FAILED,
        ):
            attempt = max(0, attempt - 1)
    for events in out.values():
        events.reverse()
    return out


def _history_event(h: Any) -> Event:
    to = h.To.value
    reason = h.Reason or ""
    if h.By == "submit":
        return Event(h.At, "state", "order received (Pending)")
    if h.By == "starter" and h.To is ProcessState.PROCESSING:
        return Event(h.At, "state", "claimed by the Starter")
    if h.To is ProcessState.COMPENSATING and h.From is not ProcessState.PROCESSING:
        return Event(
            h.At, "state", "claimed by the Starter to compensate, as an operator asked", "warn"
        )
    if h.By.startswith("operator"):
        who = h.By.partition(":")[2]
        actor = f"operator {who}" if who else "an operator"  # the CLI before names were asked
        return Event(h.At, "state", f"{actor}: {reason or to}", "warn")
    if h.By == "supervisor":
        tone = "bad" if h.To is ProcessState.ERROR else "warn"
        # The Supervisor quotes the step's error; the reply above already says it.
        said = reason.split(" (step ", 1)[0]
        then = {
            ProcessState.PENDING.value: "another attempt follows",
            ProcessState.ERROR.value: "order Error: retry budget spent",
        }.get(to, to)
        return Event(h.At, "state", f"Supervisor: {said}; {then}", tone)
    return Event(
        h.At,
        "state",
        f"{h.From.value if h.From else '(new)'} → {to} by {h.By}",
        "bad" if h.To in (ProcessState.ERROR, ProcessState.COMPENSATION_FAILED) else "",
        _text(reason) or None,
    )


def _before(a: datetime | None, b: datetime | None) -> bool:
    return a is not None and b is not None and a < b


def _merge(record_events: list[Event], history_events: list[Event]) -> list[Event]:
    """Both lists keep their own order (each is causal); the record's
    entries go in by time between the orchestration's."""
    out: list[Event] = []
    i = 0
    for e in history_events:
        while i < len(record_events) and _before(record_events[i].at, e.at):
            out.append(record_events[i])
            i += 1
        out.append(e)
    out.extend(record_events[i:])
    return out


def _fallback_events(record: OrderState, attempt: int) -> list[Event]:
    """Without the orchestration's history (purged, or no durable client):
    what the record knows of this attempt's steps."""
    out: list[Event] = []
    for name, step in record.Steps.items():
        if step.Attempt != attempt:
            continue
        if step.StartedAt:
            out.append(Event(step.StartedAt, "request", f"{label(name)}: requested"))
        if step.CompletedAt:
            call = Call(name, "do", step.StartedAt, step.CompleteBy, replied_at=step.CompletedAt)
            met = _deadline_words(call)[0] or None
            out.append(Event(step.CompletedAt, "reply", f"{label(name)}: done", "good", met))
        elif step.Error:
            out.append(
                Event(step.StartedAt, "reply", f"{label(name)}: failed", "warn", _text(step.Error))
            )
    out.sort(key=lambda e: (e.at is None, e.at or datetime.min))
    return out


def timeline(record: OrderState, statuses: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every attempt, oldest first: its badge, its events in causal order and
    its step calls."""
    by_attempt = _record_events(record)
    attempts = sorted(set(by_attempt) | set(statuses))
    out = []
    for a in attempts:
        status = statuses.get(a)
        history = (status or {}).get("history") or []
        instance = status.get("instance") if status else None
        own = [(e, by) for e, by in by_attempt.get(a, [])]
        if history:
            walk = _Walk()
            for raw in history:
                walk.event(raw)
            calls = walk.calls
            # the attempt's own writes are in its history already, in its words
            others = [e for e, by in own if by != instance]
            events = _merge(others, walk.events)
        else:
            calls = []
            events = sorted(
                [e for e, _ in own] + _fallback_events(record, a),
                key=lambda e: (e.at is None, e.at or datetime.min),
            )
        badge, tone = outcome(status) if a else ("before the first attempt", "muted")
        if not history and a and status is None:
            badge, tone = _badge_from_record(record, a)
        out.append(
            {
                "attempt": a,
                "instance": instance,
                "badge": badge,
                "tone": tone,
                "events": events,
                "calls": calls,
                "has_history": bool(history),
            }
        )
    return out


def _badge_from_record(record: OrderState, attempt: int) -> tuple[str, str]:
    if attempt == record.Attempt:
        state = record.ProcessState
        if state is ProcessState.PROCESSED:
            return "Processed", "good"
        if state in (ProcessState.PROCESSING, ProcessState.COMPENSATING):
            return "running", "warn"
        return state.value, "bad" if state is ProcessState.ERROR else "warn"
    return "history not available", "muted"
