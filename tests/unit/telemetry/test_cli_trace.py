"""`python -m cli trace`: one order's spans from an OTLP/JSON-lines file as
written by the real file exporter, one tree per trace, with durations."""

from __future__ import annotations

import io
import re
import time

import pytest
from opentelemetry.exporter.otlp.json.file.trace_exporter import FileSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from rich.console import Console

from adapters import telemetry
from cli import trace as traces


def _write_spans(path):
    """Two traces of order O-1 (two attempts, the second linked to the
    first) and one of another order, through the exporter the app uses."""
    exporter = FileSpanExporter(path)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("submit", attributes={telemetry.ORDER_ID: "O-1"}) as submit:
        with tracer.start_as_current_span("start attempt", attributes={telemetry.ORDER_ID: "O-1"}):
            time.sleep(0.002)
        with tracer.start_as_current_span("send orders", attributes={}):
            pass
    from opentelemetry.trace import Link

    with (
        tracer.start_as_current_span(
            "start attempt",
            context=None,
            links=[Link(submit.get_span_context())],
            attributes={telemetry.ORDER_ID: "O-1"},
        ) as retry,
        tracer.start_as_current_span(
            "activity begin_attempt", attributes={telemetry.ORDER_ID: "O-1"}
        ),
    ):
        pass
    with tracer.start_as_current_span("submit", attributes={telemetry.ORDER_ID: "O-2"}):
        pass
    provider.shutdown()
    with open(path, "a") as f:
        f.write('{"resourceSpans": [')  # a torn line while the writer is busy
    return submit, retry


def test_one_tree_per_trace_of_the_order(tmp_path):
    path = tmp_path / "spans.jsonl"
    submit, retry = _write_spans(path)
    found = traces.load(path, "O-1")
    first = f"{submit.get_span_context().trace_id:032x}"
    second = f"{retry.get_span_context().trace_id:032x}"
    assert list(found) == [first, second]
    (root,) = traces.roots(found[first])
    assert root.name == "submit"
    assert [c.name for c in root.children] == ["start attempt", "send orders"]
    assert root.children[0].duration_ms >= 2
    assert root.kind == "internal"

    out = io.StringIO()
    traces.print_traces(Console(file=out, width=200, color_system=None), "O-1", found)
    text = out.getvalue()
    assert sum(int(n) for n in re.findall(r"(\d+) spans", text)) == 5
    assert f"trace {first}" in text
    assert f"trace {second}" in text
    assert f"linked to {first}" in text
    assert "activity begin_attempt" in text
    assert " ms" in text
    assert "O-2" not in text


def test_an_order_without_spans_finds_nothing(tmp_path):
    path = tmp_path / "spans.jsonl"
    _write_spans(path)
    assert traces.load(path, "O-404") == {}


def test_the_command_prints_the_tree(tmp_path, monkeypatch):
    import cli.__main__ as tool

    path = tmp_path / "spans.jsonl"
    _write_spans(path)
    out = io.StringIO()
    monkeypatch.setattr(tool, "console", Console(file=out, width=300, color_system=None))
    monkeypatch.setattr("sys.argv", ["cli", "trace", "O-1", "--file", str(path)])
    with pytest.raises(SystemExit) as done:
        tool.main()
    assert done.value.code == 0
    assert "start attempt" in out.getvalue()

    monkeypatch.setattr("sys.argv", ["cli", "trace", "O-404", "--file", str(path)])
    assert tool.main() == 1
    assert "no spans of order O-404" in out.getvalue()

    monkeypatch.delenv("OTEL_TRACES_FILE", raising=False)
    monkeypatch.setattr("sys.argv", ["cli", "trace", "O-1"])
    assert tool.main() == 1
    assert "no spans file" in out.getvalue()
