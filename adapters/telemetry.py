"""OpenTelemetry for the app: set-up once per process (`configure`), W3C trace
context in and out of messages, the spans and the metrics
(docs/adr/015-trace-per-attempt.md)."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)

SERVICE_NAME = "order-processing"
TRACES_FILE = "OTEL_TRACES_FILE"
METRICS_FILE = "OTEL_METRICS_FILE"
TRACE_PROPERTIES = ("traceparent", "tracestate")

# Span attributes every part sets where it knows them; `cli trace` selects on ORDER_ID.
ORDER_ID = "order.id"
INSTANCE_ID = "order.instance_id"

_TRACER_NAME = "orders"
_propagator = TraceContextTextMapPropagator()
_configured = False
_configure_lock = threading.Lock()
# The order whose Submit span is current: an attempt claimed inside it joins that trace.
_ORDER_KEY = otel_context.create_key("orders.order_id")
# Longest header values accepted from a message; W3C's are far shorter.
_MAX_TRACEPARENT = 128
_MAX_TRACESTATE = 512
_ASCII_PRINTABLE = re.compile(r"^[\x20-\x7e]*$")


# --- set-up ------------------------------------------------------------------------------


def configure(env: Mapping[str, str] | None = None) -> str:
    """Set up the process's tracer and meter providers, once; returns what was
    chosen ("azure-monitor", "existing", "file", "console" or "none")."""
    global _configured
    with _configure_lock:
        if _configured:
            return "configured"
        _configured = True
        env = os.environ if env is None else env
        apply_log_level(env)
        try:
            return _configure(env)
        except Exception:  # telemetry must never stop the app from starting
            log.exception("telemetry could not be configured; running without it")
            return "none"


# APP_LOG_LEVEL takes host.json's level names (the Bicep sets both from hostLogLevel).
_LOG_LEVELS = {"information": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def apply_log_level(env: Mapping[str, str]) -> int | None:
    """The process's root logger at APP_LOG_LEVEL (Information, Warning,
    Error), when set: a record under it is never made, so neither the host's
    forwarding nor the Azure Monitor exporter sends (and bills) it."""
    name = (env.get("APP_LOG_LEVEL") or "").strip().lower()
    if not name:
        return None
    level = _LOG_LEVELS.get(name)
    if level is None:
        log.warning("APP_LOG_LEVEL=%r is not one of %s; ignored", name, ", ".join(_LOG_LEVELS))
        return None
    logging.getLogger().setLevel(level)
    return level


def _sdk_provider_set() -> bool:
    from opentelemetry.sdk.trace import TracerProvider

    return isinstance(trace.get_tracer_provider(), TracerProvider)


def _configure(env: Mapping[str, str]) -> str:
    if _sdk_provider_set():
        # The Functions worker configured the distro itself before loading us.
        return "existing"
    if env.get("APPLICATIONINSIGHTS_CONNECTION_STRING"):
        from azure.monitor.opentelemetry import configure_azure_monitor

        kwargs: dict[str, Any] = {}
        client_id = env.get("AZURE_CLIENT_ID")
        if client_id and (env.get("IDENTITY_ENDPOINT") or env.get("MSI_ENDPOINT")):
            # Local auth is off on the component: export with the app's
            # user-assigned identity (Monitoring Metrics Publisher).
            from azure.identity import ManagedIdentityCredential

            kwargs["credential"] = ManagedIdentityCredential(client_id=client_id)
        configure_azure_monitor(**kwargs)
        return "azure-monitor"

    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or SERVICE_NAME})
    chosen = _configure_traces(env, resource)
    if _configure_metrics(env, resource) and chosen == "none":
        chosen = "file" if env.get(METRICS_FILE) else "console"
    return chosen


def _configure_traces(env: Mapping[str, str], resource: Any) -> str:
    """The local tracer provider, exporting to the OTLP/JSON file or the
    console when asked; which one ("none" without)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    chosen = "none"
    span_exporter: SpanExporter | None = None
    if env.get(TRACES_FILE) and _file_exporter_installed(TRACES_FILE):
        from opentelemetry.exporter.otlp.json.file.trace_exporter import FileSpanExporter

        span_exporter, chosen = FileSpanExporter(env[TRACES_FILE]), "file"
    elif env.get("OTEL_TRACES_EXPORTER") == "console":
        span_exporter, chosen = ConsoleSpanExporter(), "console"
    provider = TracerProvider(resource=resource)
    if span_exporter is not None:
        # Exported from the processor's own thread; a short delay locally.
        delay = int(env.get("OTEL_BSP_SCHEDULE_DELAY") or 1000)
        provider.add_span_processor(BatchSpanProcessor(span_exporter, schedule_delay_millis=delay))
    # Set even without an exporter: the API's no-op tracer makes no trace ids (ADR 015).
    trace.set_tracer_provider(provider)
    return chosen


def _configure_metrics(env: Mapping[str, str], resource: Any) -> bool:
    """The local meter provider, when metrics are to go to the file or the
    console; whether one was set."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        MetricExporter,
        PeriodicExportingMetricReader,
    )

    metric_exporter: MetricExporter | None = None
    if env.get(METRICS_FILE) and _file_exporter_installed(METRICS_FILE):
        from opentelemetry.exporter.otlp.json.file.metric_exporter import FileMetricExporter

        metric_exporter = FileMetricExporter(env[METRICS_FILE])
    elif env.get("OTEL_METRICS_EXPORTER") == "console":
        metric_exporter = ConsoleMetricExporter()
    if metric_exporter is None:
        return False
    interval = int(env.get("OTEL_METRIC_EXPORT_INTERVAL") or 10000)
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=interval)
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))
    return True


def _file_exporter_installed(setting: str) -> bool:
    """The OTLP/JSON file exporter is a local-only package: a file setting
    without it is said once and ignored."""
    import importlib.util

    try:
        if importlib.util.find_spec("opentelemetry.exporter.otlp.json.file") is not None:
            return True
    except ModuleNotFoundError:  # a parent package is missing too
        pass
    log.warning(
        "%s is set but opentelemetry-exporter-otlp-json-file is not installed "
        "(requirements-dev.txt): no telemetry file is written",
        setting,
    )
    return False


def flush(timeout_millis: int = 5000) -> None:
    """Export what is buffered (tests, and a worker before it exits)."""
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        force = getattr(provider, "force_flush", None)
        if force is not None:
            force(timeout_millis)


# Set only by tests: a provider that is not the process's global one.
_tracer_provider: Any = None


def tracer() -> trace.Tracer:
    return trace.get_tracer(_TRACER_NAME, tracer_provider=_tracer_provider)


# --- W3C trace context in application properties -----------------------------------------


def _text(value: Any, limit: int) -> str | None:
    """A header value as text, or None if it is not short printable ASCII
    (clients can put anything in application properties)."""
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeError:
            return None
    if not isinstance(value, str) or len(value) > limit or not _ASCII_PRINTABLE.match(value):
        return None
    return value


def carrier_from_properties(properties: Any) -> dict[str, str]:
    """`traceparent`/`tracestate` from a message's application properties
    (str or bytes keys), checked as text; the propagator checks the rest."""
    carrier: dict[str, str] = {}
    if not isinstance(properties, Mapping):
        return carrier
    for key, value in properties.items():
        name = key.decode("utf-8", "replace") if isinstance(key, bytes | bytearray) else key
        if name == "traceparent":
            text = _text(value, _MAX_TRACEPARENT)
        elif name == "tracestate":
            text = _text(value, _MAX_TRACESTATE)
        else:
            continue
        if text is not None:
            carrier[name] = text
    return carrier


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context | None:
    """The context `carrier` names, or None when it holds no valid W3C trace
    context (absent or malformed: never trusted, a new trace starts)."""
    if not carrier or not isinstance(carrier, Mapping):
        return None
    clean = {k: v for k, v in carrier.items() if k in TRACE_PROPERTIES and isinstance(v, str)}
    ctx = _propagator.extract(clean, context=otel_context.Context())
    span_context = trace.get_current_span(ctx).get_span_context()
    return ctx if span_context.is_valid else None


def inject(ctx: otel_context.Context | None = None) -> dict[str, str]:
    """The W3C carrier (`traceparent`, maybe `tracestate`) of `ctx` or the
    current context; empty when there is no valid span."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=ctx)
    return carrier


def message_properties(properties: Mapping[Any, Any] | None) -> dict[Any, Any]:
    """`properties` plus the current trace context, for a message to send.
    Bytes keys, as azure-servicebus spells them: with SDK tracing on it adds
    b"traceparent" only if absent, so the AMQP map never holds the key twice."""
    out = dict(properties or {})
    for name, value in inject().items():
        out.pop(name, None)
        out[name.encode("ascii")] = value
    return out


# --- spans -------------------------------------------------------------------------------


@contextmanager
def consume(name: str, message: Any, **attributes: Any) -> Iterator[trace.Span]:
    """A CONSUMER span for one received message, continuing the trace its
    `traceparent` names (when valid) or the current one, else a new trace."""
    parent = extract(carrier_from_properties(getattr(message, "application_properties", None)))
    attrs = {"messaging.system": "servicebus", **_clean(attributes)}
    message_id = getattr(message, "message_id", None)
    if isinstance(message_id, str):
        attrs["messaging.message.id"] = message_id[:128]
    with tracer().start_as_current_span(
        name, context=parent, kind=SpanKind.CONSUMER, attributes=attrs
    ) as span:
        yield span


@contextmanager
def continue_from(
    name: str, carrier: Mapping[str, str] | None, **attributes: Any
) -> Iterator[trace.Span]:
    """A span continuing the context in `carrier` (an activity's `Trace`),
    or the current context when the carrier has none."""
    with tracer().start_as_current_span(
        name, context=extract(carrier), attributes=_clean(attributes)
    ) as span:
        yield span


@contextmanager
def span(name: str, kind: SpanKind = SpanKind.INTERNAL, **attributes: Any) -> Iterator[trace.Span]:
    with tracer().start_as_current_span(name, kind=kind, attributes=_clean(attributes)) as current:
        yield current


@contextmanager
def order_scope(order_id: str) -> Iterator[None]:
    """Marks the current trace as order `order_id`'s (Submit): an attempt of
    that order claimed inside it continues it."""
    token = otel_context.attach(otel_context.set_value(_ORDER_KEY, order_id))
    try:
        yield
    finally:
        otel_context.detach(token)


def start_attempt(
    order_id: str, instance_id: str, attempt: int = 1, submitted: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """Open (and close) the "start attempt" span of a claimed attempt and
    return its W3C carrier for the orchestration input, or None when nothing
    records spans. `submitted`: the context Submit stored on the record. The
    first attempt joins Submit's trace; a later one starts a trace linked to
    it (docs/adr/015-trace-per-attempt.md)."""
    stored = extract(submitted) if isinstance(submitted, Mapping) else None
    links: list[Link] = []
    if otel_context.get_value(_ORDER_KEY) == order_id:
        parent = None
    elif attempt <= 1 and stored is not None:
        parent = stored
    else:
        parent = otel_context.Context()
        candidates = [trace.get_current_span().get_span_context()]
        if stored is not None:
            candidates.insert(0, trace.get_current_span(stored).get_span_context())
        links = [Link(c) for c in candidates if c.is_valid]
    with tracer().start_as_current_span(
        "start attempt",
        context=parent,
        links=links,
        kind=SpanKind.PRODUCER,
        attributes={ORDER_ID: order_id, INSTANCE_ID: instance_id, "order.attempt": attempt},
    ):
        carrier = inject()
    return carrier or None


def annotate(**attributes: Any) -> None:
    """Add attributes to the current span (e.g. the OrderID once decoded)."""
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(_clean(attributes))


def failed(error: str) -> None:
    """Mark the current span as failed with a short reason."""
    current = trace.get_current_span()
    if current.is_recording():
        current.set_status(Status(StatusCode.ERROR, error[:300]))


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute names use dots (`order_id` -> `order.id`); None is dropped."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        name = key if "." in key else key.replace("_", ".")
        out[name] = value if isinstance(value, bool | int | float | str) else str(value)
    return out


# --- metrics -----------------------------------------------------------------------------


class Metrics:
    """The app's instruments, made from the global meter provider on first use
    (before `configure` they bind to the provider once it is set)."""

    def __init__(self, meter: metrics.Meter) -> None:
        counter, gauge, histogram = meter.create_counter, meter.create_gauge, meter.create_histogram
        self.received = counter("orders.received", "{order}", "orders Submit accepted or rejected")
        self.processed = counter("orders.processed", "{order}", "Processed statuses sent")
        self.failed = counter(
            "orders.failed", "{order}", "Failed and CompensationFailed statuses sent"
        )
        self.compensated = counter("orders.compensated", "{order}", "Compensated statuses sent")
        self.attempts = counter(
            "orders.attempts", "{attempt}", "attempts claimed (Starter and fast path)"
        )
        self.recoveries = counter(
            "orders.recoveries", "{attempt}", "expired attempts the Supervisor handled, by outcome"
        )
        self.backlog = gauge(
            "orders.backlog", "{order}", "Pending and Processing records, per Starter run"
        )
        self.scan_charge = histogram(
            "supervisor.scan.request_charge", "RU", "Cosmos request charge of one Supervisor run"
        )
        self.scan_read = histogram(
            "supervisor.scan.items", "{item}", "candidates one Supervisor run read"
        )


_metrics: Metrics | None = None


def app_metrics() -> Metrics:
    global _metrics
    if _metrics is None:
        _metrics = Metrics(metrics.get_meter(_TRACER_NAME))
    return _metrics


_TERMINAL = {
    "Processed": "processed",
    "Failed": "failed",
    "CompensationFailed": "failed",
    "Compensated": "compensated",
}


def count_terminal_status(status: str) -> None:
    """One terminal status sent to a client (reporting.status)."""
    which = _TERMINAL.get(status)
    if which is not None:
        getattr(app_metrics(), which).add(1, {"status": status})
