"""SDK tracer and meter providers that keep what they record in memory,
used through adapters.telemetry.use for one test at a time: OpenTelemetry
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
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with telemetry.use(tracer_provider=provider):
        yield exporter
    provider.shutdown()


@pytest.fixture
def metric_reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with telemetry.use(meter_provider=provider):
        yield reader
    provider.shutdown()
