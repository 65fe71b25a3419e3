"""SDK tracer and meter providers that keep what they record in memory,
put in place of adapters.telemetry's for one test at a time: OpenTelemetry
allows one global provider per process, and the rest of the suite must not
record spans because these tests need to."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from adapters import telemetry


@pytest.fixture
def spans(monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry, "_tracer_provider", provider)
    yield exporter
    provider.shutdown()


@pytest.fixture
def metric_reader(monkeypatch):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(telemetry, "_metrics", telemetry.Metrics(provider.get_meter("orders")))
    yield reader
    provider.shutdown()
