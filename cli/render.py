"""Printing what clients wrote, safely. Text a client chose (an OrderID, a
body) is printed as `rich.text.Text`, never parsed as markup (a "[/]" must
not crash the tool, a "[link=...]" not become a link); control, bidirectional
and zero-width characters print as `\\u202e`-style escapes; a message that
does not parse is shown as what it is, never an error."""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Co", "Cn"})


def visible(value: Any, limit: int | None = None) -> str:
    """`value` as a plain string with every invisible or terminal-active
    character escaped (and cut to `limit` characters, marked with …)."""
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    result = "".join(
        (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else ch.encode("unicode_escape").decode())
        if unicodedata.category(ch) in _ESCAPED
        else ch
        for ch in text
    )
    if limit is not None and len(result) > limit:
        result = result[: limit - 1] + "…"
    return result


def literal(value: Any, limit: int | None = None, style: str = "") -> Text:
    """A rich Text that prints `value` exactly as escaped by `visible`."""
    return Text(visible(value, limit), style=style)


def print_alerts(
    console: Console, messages: list[dict[str, Any]], newest_first: bool = True, limit: int = 50
) -> None:
    """One block per alert: kind, time, OrderID, the dead letter it is about,
    and the reason."""
    items = sorted(
        messages,
        key=lambda m: (m["enqueued"] is not None, m["enqueued"] or datetime.min),
        reverse=newest_first,
    )
    shown = items[:limit]
    if not shown:
        console.print(Text("0 alerts"))
        return
    order = "newest first" if newest_first else "oldest first"
    console.print(Text(f"{len(shown)} of {len(items)} alerts, {order}", style="bold"))
    for m in shown:
        data = m["parsed"]
        if data is None:
            unread = literal(m["id"] or "(no message id)", 140)
            console.print(Text.assemble(("(unreadable alert) ", "red"), unread))
            said = " ".join(x for x in (m["note"], m["body"]) if x)
            console.print(Text.assemble("  ", literal(said, 300)))
            continue
        head = Text.assemble(
            literal(data.get("Kind", "?"), 40, "bold red"),
            " ",
            literal(data.get("Timestamp", ""), 40),
            " order ",
            literal(data.get("OrderID") or "-", 80, "bold"),
        )
        if data.get("MessageId") or data.get("Queue"):
            head.append_text(
                Text.assemble(
                    " message ",
                    literal(data.get("MessageId") or "-", 140),
                    " on ",
                    literal(data.get("Queue") or "-", 60),
                )
            )
        count, last = data.get("Count"), data.get("Last")
        if isinstance(count, int) and count > 1:
            # An aggregate (docs/operations.md, "Alerts"): the fields above are its first alert.
            head.append_text(Text.assemble(" ", (f"x{count}", "bold")))
            if isinstance(last, dict):
                head.append_text(Text.assemble(" last ", literal(last.get("Timestamp", ""), 40)))
        console.print(head)
        console.print(Text.assemble("  ", literal(data.get("Reason", ""), 2000)))


BODY_LINES = 24  # lines of a dead letter's body printed; the console shows it whole


def _indented(console: Console, text: Text, indent: int) -> None:
    """`text` wrapped at word boundaries, every line (continuations too) indented."""
    console.print(Padding(text, (0, 0, 0, indent)))


def _dead_letter(console: Console, m: dict[str, Any], prefix: Text) -> None:
    """A dead letter after `prefix`: its id and reason, then its description
    and BODY_LINES of its body, indented and wrapped at word boundaries."""
    reason = literal(m["reason"] or "(no reason)", 200, "red")
    console.print(
        Text.assemble(prefix, literal(m["id"] or "(no message id)", 140, "bold"), " ", reason)
    )
    if m["description"]:
        _indented(console, literal(m["description"], 4096), 2)
    text = "\n".join(x for x in (m["note"], m["body"]) if x)
    lines = [visible(line) for line in text.splitlines()] or [""]
    shown = lines[:BODY_LINES]
    if len(lines) > BODY_LINES:
        shown.append(f"… {len(lines) - BODY_LINES} more lines")
    _indented(console, Text("\n".join(shown), style="dim"), 4)


def print_dead_letters(console: Console, queue: str, messages: list[dict[str, Any]]) -> None:
    """Each dead letter, its sequence number (what --resend takes) first."""
    if not messages:
        console.print(Text.assemble("no dead letters on ", literal(queue)))
        return
    console.print(Text.assemble(f"{len(messages)} dead letters on ", literal(queue), style="bold"))
    for m in messages:
        seq = m["sequence"]
        _dead_letter(console, m, Text(f"#{seq} " if seq is not None else "", "cyan"))


def print_counts(console: Console, title: str, counts: dict[str, int]) -> None:
    """`title` (`{total}` and `{names}` filled in), then a line per name, its
    count aligned: printed last, so that it stays on the screen."""
    total = sum(counts.values())
    console.print(Text(title.format(total=total, names=len(counts)), style="bold"))
    width = max((len(visible(k)) for k in counts), default=0)
    for name, n in counts.items():
        console.print(Text(f"  {visible(name):<{width}}  {n}"))


def print_parked(console: Console, parked: dict[str, Any]) -> None:
    """The parked statuses (console.views.parked_statuses), then the per-queue
    summary, last so it stays on the screen."""
    for r in parked["entries"]:
        p = r.PendingStatus
        console.print(Text.assemble(literal(r.id, style="bold"), f"  {p.Status.value}"))
        console.print(Text.assemble("  to ", literal(r.ReplyTo), f" since {_time(p.At)}"))
        console.print(Text(f"  refused {p.Tries} time{'' if p.Tries == 1 else 's'}"))
    queues = parked["queues"]
    total = f"{sum(q['count'] for q in queues.values())}{'+' if parked['cut'] else ''}"
    console.print(Text(f"{total} statuses parked on {len(queues)} reply queues", style="bold"))
    for name, q in queues.items():
        console.print(
            Text.assemble("  ", literal(name), f"  {q['count']}, most tries {q['tries']}")
        )
        console.print(Text(f"    oldest {_time(q['since'])}"))


def status_table(queue: str, latest: dict[str, str]) -> Table:
    """The watch view: the last 30 orders by OrderID, with counts per status."""
    table = Table(title=Text(f"{visible(queue)}: {len(latest)} orders"))
    table.add_column("OrderID")
    table.add_column("status")
    for oid, status in sorted(latest.items())[-30:]:
        table.add_row(literal(oid, 80), literal(status, 40))
    counts = Counter(latest.values())
    table.caption = Text("  ".join(f"{visible(k, 40)}: {v}" for k, v in sorted(counts.items())))
    return table


def read_status(m: dict[str, Any]) -> tuple[str, str] | None:
    """(OrderID, Status) from a status message (console.views.message_view),
    or None when it has neither."""
    data = m["parsed"] or {}
    oid, status = data.get("OrderID"), data.get("Status")
    if not isinstance(oid, str) or not isinstance(status, str):
        return None
    return oid, status


WIDE = 140  # below this many columns, records print one block each


def _time(value: Any) -> str:
    """A time in full (ISO 8601 with microseconds and offset): never cut."""
    return value.isoformat() if isinstance(value, datetime) else ""


def _next_try(record: Any) -> str:
    """When a Pending order is taken again: its NotBefore, saying when it is a
    long retry (the Supervisor's LongRetries), empty when it may go now."""
    at = getattr(record, "NotBefore", None)
    if not isinstance(at, datetime):
        return ""
    long = getattr(record, "LongRetries", 0)
    return _time(at) + (f" (long retry {long})" if long else "")


def records_table(title: str, records: Iterable[Any]) -> Table:
    """Records as a table whose cells wrap (fold), never cut: times and
    errors are shown whole at any width."""
    table = Table(title=Text(title))
    for col in (
        "OrderID",
        "attempt",
        "failures",
        "CompleteBy",
        "next try",
        "LockedBy",
        "LastError",
    ):
        table.add_column(col, overflow="fold")
    for r in records:
        table.add_row(
            literal(r.id, 200),
            Text(str(r.Attempt)),
            Text(str(r.FailureCount)),
            Text(_time(r.CompleteBy)),
            Text(_next_try(r)),
            literal(r.LockedBy or "", 200),
            literal(r.LastError or ""),
        )
    return table


def print_records(console: Console, title: str, records: list[Any]) -> None:
    """The table on a wide terminal; one block per record when narrower than
    WIDE columns (an 80-column terminal), every field whole and wrapped."""
    if console.width >= WIDE:
        console.print(records_table(title, records))
        return
    console.print(Text(title, style="bold"))
    for r in records:
        console.print(
            Text.assemble(
                literal(r.id, style="bold"), f"  attempt {r.Attempt}, failures {r.FailureCount}"
            )
        )
        if r.CompleteBy:
            console.print(Text(f"  deadline {_time(r.CompleteBy)}"))
        if getattr(r, "NotBefore", None):
            console.print(Text(f"  next try {_next_try(r)}"))
        if r.LockedBy:
            console.print(Text.assemble("  locked by ", literal(r.LockedBy)))
        if r.LastError:
            console.print(Text.assemble("  last error: ", literal(r.LastError)))


def print_action_target(
    console: Console, record: Any, title: str, explanation: str, who: str
) -> None:
    """What an operator is about to act on, before the confirmation: the
    order, its state and last error, what the action does and who acts."""
    state = getattr(record.ProcessState, "value", record.ProcessState)
    console.print(
        Text.assemble(
            (f"{title} ", "bold"),
            literal(record.id, style="bold"),
            f"  {state}, attempt {record.Attempt}, failures {record.FailureCount}",
        )
    )
    if record.LastError:
        _indented(console, Text.assemble(("last error: ", "red"), literal(record.LastError)), 2)
    _explained(console, explanation, who)


def _explained(console: Console, explanation: str, who: str) -> None:
    """Under the target of an action: what it does and who acts."""
    _indented(console, Text(explanation), 2)
    _indented(console, Text.assemble("recorded as done by ", literal(who, style="bold")), 2)


def print_dead_letter_target(
    console: Console, queue: str, m: dict[str, Any], title: str, explanation: str, who: str
) -> None:
    """A dead letter as console.views shows it, before an operator acts on it."""
    head = Text.assemble((f"{title} dead letter {m['sequence']} of ", "bold"), literal(queue))
    _dead_letter(console, m, Text.assemble(head, "  "))
    order = m.get("order_id") or m.get("unstored_order")
    if order:
        _indented(console, Text.assemble("order ", literal(order)), 2)
    _explained(console, explanation, who)


def print_record_json(console: Console, record: Any) -> None:
    """The whole record as JSON (`show --json`), non-ASCII and control
    characters escaped by JSON itself: safe on a terminal, still valid JSON."""
    text = json.dumps(json.loads(record.model_dump_json()), indent=2, ensure_ascii=True)
    console.print(Text(text), soft_wrap=True)


def print_summary(console: Console, record: Any) -> None:
    """`show`: the record in a few lines (state, times, last error, steps,
    compensation, history); nothing cut, long values wrap."""
    state = getattr(record.ProcessState, "value", record.ProcessState)
    console.print(
        Text.assemble(
            literal(record.id, style="bold"),
            "  ",
            (str(state), "bold"),
            "  app ",
            literal(record.AppId),
            ", replies to ",
            literal(record.ReplyTo),
        )
    )
    line = f"attempt {record.Attempt}, failures {record.FailureCount}"
    if record.LongRetries:
        line += f" ({record.LongRetries} long retries)"
    if record.CompensationRequested:
        line += ", compensation requested"
    console.print(Text(line))
    for name, value in (
        ("received", record.CreatedAt),
        ("updated", record.UpdatedAt),
        ("deadline", record.CompleteBy),
        ("next try", record.NotBefore),
    ):
        if value:
            console.print(Text(f"{name:<9} {_time(value)}"))
    if record.LockedBy:
        console.print(Text.assemble("locked by ", literal(record.LockedBy)))
    if record.LastError:
        console.print(Text.assemble(("last error: ", "red"), literal(record.LastError)))
    _print_steps(console, record)
    ran = [e for e in record.Compensation if e.At is not None]
    if ran:
        console.print(Text("compensation", style="bold"))
        for e in record.Compensation:
            console.print(Text.assemble("  ", literal(e.Step), f"  {e.Outcome}  {_time(e.At)}"))
            if e.Error:
                console.print(Text.assemble("    error: ", literal(e.Error)))
    console.print(Text("history", style="bold"))
    for h in record.History:
        frm = getattr(h.From, "value", h.From) or "(new)"
        to = getattr(h.To, "value", h.To)
        console.print(Text.assemble(f"  {_time(h.At)}  {frm} → {to}  by ", literal(h.By)))
        if h.Reason:
            console.print(Text.assemble("    ", literal(h.Reason)))
    console.print(Text("the whole record: python -m cli show ORDER_ID --json", style="dim"))


def _print_steps(console: Console, record: Any) -> None:
    """`show`'s steps: each with its status, attempt and duration, its times,
    reference and error under it."""
    console.print(Text("steps", style="bold"))
    for name, step in record.Steps.items():
        status = getattr(step.Status, "value", step.Status)
        head = Text.assemble("  ", literal(name), f"  {status}")
        if step.Attempt:
            head.append(f", attempt {step.Attempt}")
        if step.StartedAt and step.CompletedAt:
            took = (step.CompletedAt - step.StartedAt).total_seconds()
            head.append(f", took {took * 1000:.0f} ms" if took < 1 else f", took {took:.1f} s")
        console.print(head)
        for label, value in (("started", step.StartedAt), ("done   ", step.CompletedAt)):
            if value:
                console.print(Text(f"    {label} {_time(value)}"))
        if step.Reference:
            console.print(Text.assemble("    reference ", literal(step.Reference)))
        if step.Error:
            console.print(Text.assemble("    error: ", literal(step.Error)))
