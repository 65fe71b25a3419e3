"""`python -m cli trace ORDER_ID`: one order's spans from the local spans file
(OTEL_TRACES_FILE), one tree per trace (per attempt), with durations. The
file is read a line at a time, keeping only the traces that name the order."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from cli import render

ORDER_ID = "order.id"
_KINDS = {0: "", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
# Attributes worth a glance in the tree (the rest are in the file).
_SHOWN = (
    "messaging.destination.name",
    "order.instance_id",
    "step",
    "step.action",
    "reply.outcome",
    "http.response.status_code",
    "settlement",
)


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str
    start: int
    end: int
    attributes: dict[str, Any]
    error: str | None = None
    links: list[str] = field(default_factory=list)
    children: list[Span] = field(default_factory=list)

    @property
    def duration_ms(self) -> float:
        return (self.end - self.start) / 1e6


def _value(v: dict[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    return None


def _span(raw: dict[str, Any]) -> Span:
    status = raw.get("status") or {}
    return Span(
        trace_id=raw["traceId"],
        span_id=raw["spanId"],
        parent_id=raw.get("parentSpanId") or None,
        name=str(raw.get("name", "?")),
        kind=_KINDS.get(raw.get("kind", 0), ""),
        start=int(raw.get("startTimeUnixNano", 0)),
        end=int(raw.get("endTimeUnixNano", 0)),
        attributes={a["key"]: _value(a.get("value", {})) for a in raw.get("attributes", [])},
        error=status.get("message") or ("error" if status.get("code") == 2 else None),
        links=[link["traceId"] for link in raw.get("links", []) if "traceId" in link],
    )


def read_spans(lines: Iterable[str]) -> Iterator[Span]:
    """Every span in OTLP/JSON lines; a line that is not (a torn last line
    while the writer is busy) is skipped."""
    for line in lines:
        try:
            batch = json.loads(line)
        except ValueError:
            continue
        for resource in batch.get("resourceSpans", []):
            for scope in resource.get("scopeSpans", []):
                for raw in scope.get("spans", []):
                    try:
                        yield _span(raw)
                    except (KeyError, TypeError, ValueError):
                        continue


def order_traces(spans: Iterable[Span], order_id: str) -> dict[str, list[Span]]:
    """trace id -> its spans, for every trace with a span of `order_id`,
    oldest trace first."""
    by_trace: dict[str, list[Span]] = {}
    wanted: set[str] = set()
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
        if s.attributes.get(ORDER_ID) == order_id:
            wanted.add(s.trace_id)
    found = {t: by_trace[t] for t in wanted}
    return dict(sorted(found.items(), key=lambda item: min(s.start for s in item[1])))


def load(path: Path, order_id: str) -> dict[str, list[Span]]:
    with open(path, encoding="utf-8", errors="replace") as lines:
        return order_traces(read_spans(lines), order_id)


def roots(spans: list[Span]) -> list[Span]:
    """Link each span under its parent; spans whose parent is not in the file
    (the client's own span, or one still buffered) are roots."""
    by_id = {s.span_id: s for s in spans}
    for s in spans:
        s.children = []
    top: list[Span] = []
    for s in sorted(spans, key=lambda s: s.start):
        parent = by_id.get(s.parent_id) if s.parent_id else None
        (parent.children if parent is not None and parent is not s else top).append(s)
    return top


def _label(s: Span, origin: int) -> Text:
    text = Text.assemble(
        render.literal(s.name, 80, "bold"),
        (f"  {s.duration_ms:.1f} ms", "cyan"),
        (f"  +{(s.start - origin) / 1e6:.0f} ms", "dim"),
        (f"  {s.kind}" if s.kind else "", "dim"),
    )
    extras = [f"{k}={s.attributes[k]}" for k in _SHOWN if k in s.attributes]
    if extras:
        text.append("  ")
        text.append_text(render.literal(" ".join(extras), 200, "dim"))
    if s.error:
        text.append("  error: ", "red")
        text.append_text(render.literal(s.error, 200))
    return text


def _add(node: Tree, span: Span, origin: int) -> None:
    child = node.add(_label(span, origin))
    for c in sorted(span.children, key=lambda c: c.start):
        _add(child, c, origin)


def print_traces(console: Console, order_id: str, traces: dict[str, list[Span]]) -> None:
    """One tree per trace."""
    for trace_id, spans in traces.items():
        origin = min(s.start for s in spans)
        total = (max(s.end for s in spans) - origin) / 1e6
        head = Text.assemble(
            ("trace ", "bold"),
            (trace_id, "yellow"),
            f"  {len(spans)} spans, {total:.0f} ms, order ",
            render.literal(order_id, 100),
        )
        linked = sorted({t for s in spans for t in s.links if t != trace_id})
        if linked:
            head.append(f"  (linked to {', '.join(linked)})", "dim")
        tree = Tree(head)
        for root in roots(spans):
            _add(tree, root, origin)
        console.print(tree)
