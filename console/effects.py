"""What each step did at its service (the effects table of docs/console.md,
"Reading an order"), from the agents' answers in the attempts' histories
(console.timeline), and from the record only where no history says more.
Pure: tested on recorded histories."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from console.timeline import Call, duration, label
from domain.models import OrderState, ProcessState, StepStatus

_TEXT = 300

APPLIED = "applied"
REFUSED = "refused"
UNDONE = "undone"
UNDO_REFUSED = "undo refused"
NOT_CALLED = "not called"
IN_FLIGHT = "in flight"
UNKNOWN = "unknown"

_TONES = {
    APPLIED: "good",
    REFUSED: "muted",
    UNDONE: "good",
    UNDO_REFUSED: "bad",
    NOT_CALLED: "muted",
    IN_FLIGHT: "warn",
    UNKNOWN: "warn",
}


@dataclass
class Verdict:
    state: str
    detail: str | None = None
    call: Call | None = None  # the do call whose answer decided it
    reference: str | None = None
    undo: Call | None = None  # the undo call whose answer decided it, if any


def _reply(call: Call) -> dict[str, Any]:
    return call.reply or {}


def _reason(call: Call) -> str:
    error = _reply(call).get("Error")
    text = error if isinstance(error, str) and error else "no reason given"
    return text if len(text) <= _TEXT else text[: _TEXT - 1] + "…"


def _result(call: Call) -> dict[str, Any]:
    result = _reply(call).get("Result")
    return result if isinstance(result, dict) else {}


def _calls_verdict(
    calls: list[tuple[int, Call]], action: str, running_attempt: int | None
) -> Verdict | None:
    """The verdict of a step's `action` calls (do, or undo) by their answers:
    done if any was answered ok (a repeat is under the same idempotency key),
    else what the last one was told."""
    tried = [(a, c) for a, c in calls if c.action == action]
    if not tried:
        return None
    do = action == "do"
    for _, c in tried:
        if _reply(c).get("Outcome") == "ok":
            if not do and _result(c).get("Status") == "nothing-to-undo":
                return Verdict(UNDONE, "the service had no effect to reverse", c)
            ref = _result(c).get("Reference")
            return Verdict(
                APPLIED if do else UNDONE, None, c, ref if isinstance(ref, str) else None
            )
    attempt, last = tried[-1]
    if _reply(last).get("Outcome") == "permanent":
        return Verdict(REFUSED if do else UNDO_REFUSED, _reason(last), last)
    if last.reply is not None:
        said = "the agent gave up without a clear answer" if do else "its undo got no clear answer"
        return Verdict(UNKNOWN, f"{said}: {_reason(last)}", last)
    # No reply: in flight while its attempt runs and its deadline has not passed.
    what = "asked" if do else "its undo"
    if attempt == running_attempt and not last.missed:
        return Verdict(IN_FLIGHT, f"{what} requested, no answer yet", last)
    return Verdict(UNKNOWN, f"{what}: no answer came back before the deadline", last)


def _from_record(record: OrderState, name: str, read: set[int]) -> Verdict:
    """Without a call in the histories read: what the record says. A step the
    record marks Running in an attempt whose history was read, and which that
    history never asked, was not called (a claim marks every step it plans)."""
    step = record.Steps[name]
    entry = next((e for e in record.Compensation if e.Step == name and e.At is not None), None)
    if entry is not None and entry.Outcome == "Failed":
        return Verdict(UNDO_REFUSED, entry.Error or "no reason recorded", None, step.Reference)
    status = step.Status
    if status is StepStatus.COMPLETED:
        return Verdict(APPLIED, None, None, step.Reference)
    if status is StepStatus.COMPENSATED:
        if step.CompletedAt is None:
            return Verdict(REFUSED, step.Error or "refused before taking effect")
        return Verdict(UNDONE, None, None, step.Reference)
    if status is StepStatus.FAILED:
        return Verdict(REFUSED, step.Error or "no reason recorded")
    if status is StepStatus.RUNNING:
        if step.Attempt in read:
            return Verdict(NOT_CALLED)
        if step.Attempt == _running_attempt(record):
            return Verdict(IN_FLIGHT, "asked, no answer recorded yet")
        return Verdict(UNKNOWN, "asked; no answer was recorded")
    return Verdict(NOT_CALLED)


def _running_attempt(record: OrderState) -> int | None:
    live = (ProcessState.PROCESSING, ProcessState.COMPENSATING)
    return record.Attempt if record.ProcessState in live else None


def verdict(
    record: OrderState,
    name: str,
    calls: list[tuple[int, Call]],
    read: frozenset[int] | set[int] = frozenset(),
) -> Verdict:
    """`name`'s effect from its calls (`calls`, with their attempts), the
    record where they say nothing; `read`: the attempts whose history was read."""
    running = _running_attempt(record)
    do = _calls_verdict(calls, "do", running)
    if do is None:
        base = _from_record(record, name, set(read))
        if base.state not in (APPLIED, UNKNOWN) or not any(c.action == "undo" for _, c in calls):
            return base
        do = base
    undo = _calls_verdict(calls, "undo", running)
    if do.state in (REFUSED, NOT_CALLED) or undo is None:
        return do
    # it took (or may have taken) effect: its undo calls' verdict
    return Verdict(undo.state, undo.detail, do.call, do.reference, undo.call)


def _times(v: Verdict, calls: list[tuple[int, Call]], step: Any) -> dict[str, Any]:
    """The step's start, end and duration, from the first request of the do
    call that decided it to its answer (else the record's own times), and
    the undo's answer separately."""
    if v.state == NOT_CALLED:
        return {"started": None, "completed": None, "took": None, "undo_answered": None}
    if v.call is not None:
        attempt = next(a for a, c in calls if c is v.call)
        first = next(
            (
                c.requested_at
                for a, c in calls
                if a == attempt and c.action == "do" and c.requested_at
            ),
            v.call.requested_at,
        )
        started, ended = first, v.call.replied_at
    else:
        started, ended = step.StartedAt, step.CompletedAt
    took = duration((ended - started).total_seconds()) if started and ended else None
    undo = v.undo
    return {
        "started": started,
        "completed": ended,
        "took": took,
        "undo_answered": undo.replied_at if undo is not None else None,
    }


def side_effects(record: OrderState, attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step of the record: its effect at the service, why, and its own times."""
    by_step: dict[str, list[tuple[int, Call]]] = {}
    for a in attempts:
        for c in a.get("calls") or []:
            by_step.setdefault(c.step, []).append((a["attempt"], c))
    read = {a["attempt"] for a in attempts if a.get("has_history")}
    out = []
    for name, step in record.Steps.items():
        calls = by_step.get(name, [])
        v = verdict(record, name, calls, read)
        out.append(
            {
                "step": name,
                "label": label(name),
                "state": v.state,
                "tone": _TONES[v.state],
                "detail": v.detail,
                "reference": v.reference or step.Reference,
                "attempt": step.Attempt,
                "deadline": v.call.deadline if v.call else step.CompleteBy,
                "undo_label": label(name, "undo"),
                **_times(v, calls, step),
            }
        )
    return out


def still_held(record: OrderState, effects: list[dict[str, Any]]) -> dict[str, str] | None:
    """One line for the top of an order that is not Processed: what its
    services still hold, what may be held, and what is in flight (`text`),
    and `tone` warn when anything is or may be."""
    if record.ProcessState is ProcessState.PROCESSED:
        return None
    held = [
        e["label"] if e["state"] == APPLIED else f"{e['label']} ({e['undo_label']} refused)"
        for e in effects
        if e["state"] in (APPLIED, UNDO_REFUSED)
    ]
    said = {
        "still held": held,
        "perhaps held (no clear answer)": [e["label"] for e in effects if e["state"] == UNKNOWN],
        "in flight": [e["label"] for e in effects if e["state"] == IN_FLIGHT],
    }
    parts = [f"{what}: {', '.join(names)}" for what, names in said.items() if names]
    if not parts:
        return {"text": "Nothing is held at the services.", "tone": ""}
    line = "; ".join(parts)
    return {"text": line[0].upper() + line[1:] + ".", "tone": "warn"}
