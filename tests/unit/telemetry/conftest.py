"""An SDK tracer and meter provider that keep what they record in memory.

OpenTelemetry allows one global provider per process, so it is set once for
the session (if nothing set one before) and each test clears what it saw."""

from __future__ import annotations

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_spans = InMemorySpanExporter()
_reader = InMemoryMetricReader()


_ours: dict[str, bool] = {}


@pytest.fixture(scope="session")
def _providers():
    if not _ours:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(_spans))
        if not isinstance(metrics.get_meter_provider(), MeterProvider):
            metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
            _ours["metrics"] = True
        _ours["traces"] = True


@pytest.fixture
def spans(_providers) -> InMemorySpanExporter:
    _spans.clear()
    return _spans


@pytest.fixture
def metric_reader(_providers) -> InMemoryMetricReader:
    if not _ours.get("metrics"):
        pytest.skip("another meter provider was set globally before this session's")
    return _reader
