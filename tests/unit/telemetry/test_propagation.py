"""W3C trace context in and out of messages (adapters.telemetry): what a
message carries, what a receiver trusts, and how an attempt joins Submit's
trace or starts its own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from opentelemetry import trace

from adapters import telemetry

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def _ids(span) -> tuple[str, str]:
    ctx = span.get_span_context()
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def test_inject_extract_round_trip(spans):
    with telemetry.span("sender") as sender:
        carrier = telemetry.inject()
    trace_id, span_id = _ids(sender)
    assert carrier["traceparent"] == f"00-{trace_id}-{span_id}-{carrier['traceparent'][-2:]}"
    ctx = telemetry.extract(carrier)
    assert ctx is not None
    got = trace.get_current_span(ctx).get_span_context()
    assert (f"{got.trace_id:032x}", f"{got.span_id:016x}") == (trace_id, span_id)
    assert got.is_remote


def test_tracestate_survives_the_round_trip(spans):
    ctx = telemetry.extract({"traceparent": CLIENT_PARENT, "tracestate": "vendor=abc,other=1"})
    assert ctx is not None
    assert telemetry.inject(ctx) == {
        "traceparent": CLIENT_PARENT,
        "tracestate": "vendor=abc,other=1",
    }


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "garbage",
        "00-" + "0" * 32 + "-" + CLIENT_SPAN + "-01",  # all-zero trace id is invalid
        "00-" + CLIENT_TRACE + "-" + "0" * 16 + "-01",  # all-zero span id is invalid
        "ff-" + CLIENT_TRACE + "-" + CLIENT_SPAN + "-01",  # version ff is forbidden
        "00-" + CLIENT_TRACE.upper() + "-" + CLIENT_SPAN + "-01",  # upper-case hex is not W3C
        "00-" + CLIENT_TRACE[:-1] + "-" + CLIENT_SPAN + "-01",  # short trace id
        CLIENT_PARENT + "-extra",  # version 00 has no extra fields
    ],
)
def test_a_malformed_traceparent_is_not_trusted(bad):
    assert telemetry.extract({"traceparent": bad}) is None


def test_carrier_takes_only_short_printable_ascii_text():
    props = {
        b"traceparent": CLIENT_PARENT.encode(),
        b"tracestate": "\u202e".encode(),  # what the hostile-input tests send
        "Diagnostic-Id": "00-ok",
        "OrderID": "x",
    }
    assert telemetry.carrier_from_properties(props) == {"traceparent": CLIENT_PARENT}
    assert telemetry.carrier_from_properties({"traceparent": 5}) == {}
    assert telemetry.carrier_from_properties({"traceparent": "\u202e"}) == {}
    assert telemetry.carrier_from_properties({"traceparent": "0" * 500}) == {}
    assert telemetry.carrier_from_properties(None) == {}
    assert telemetry.carrier_from_properties(["traceparent"]) == {}


def test_message_properties_carry_the_current_context_under_the_sdk_spelling(spans):
    with telemetry.span("send") as sender:
        props = telemetry.message_properties({"OrderID": "O-1", "traceparent": "stale"})
    trace_id, span_id = _ids(sender)
    assert props["OrderID"] == "O-1"
    # bytes keys, as azure-servicebus sets them: its own tracing adds
    # b"traceparent" only if absent, so the AMQP map never has it twice
    assert "traceparent" not in props
    assert props[b"traceparent"].split("-")[1:3] == [trace_id, span_id]


def test_message_properties_without_a_span_add_nothing():
    assert telemetry.message_properties(None) == {}
    assert telemetry.message_properties({"Kind": "X"}) == {"Kind": "X"}


def test_a_consumer_continues_a_valid_client_trace(spans):
    message = SimpleNamespace(
        application_properties={b"traceparent": CLIENT_PARENT.encode()}, message_id="submit/O-1"
    )
    with telemetry.consume("submit", message) as consumer:
        pass
    trace_id, _ = _ids(consumer)
    assert trace_id == CLIENT_TRACE
    (finished,) = spans.get_finished_spans()
    assert f"{finished.parent.span_id:016x}" == CLIENT_SPAN
    assert finished.kind is trace.SpanKind.CONSUMER
    assert finished.attributes["messaging.message.id"] == "submit/O-1"


@pytest.mark.parametrize(
    "props",
    [
        {"traceparent": "00-" + CLIENT_TRACE + "-" + CLIENT_SPAN},  # flags missing
        {"traceparent": "\u202e"},
        {b"traceparent": b"\xff\xfe"},
        {},
        None,
    ],
)
def test_a_consumer_starts_a_new_trace_when_the_traceparent_is_malformed_or_absent(spans, props):
    message = SimpleNamespace(application_properties=props, message_id="m")
    with telemetry.consume("submit", message) as consumer:
        pass
    ctx = consumer.get_span_context()
    assert ctx.is_valid
    assert f"{ctx.trace_id:032x}" != CLIENT_TRACE
    (finished,) = spans.get_finished_spans()
    assert finished.parent is None


def test_an_attempt_started_inside_submit_continues_its_trace(spans):
    with telemetry.span("submit") as submit, telemetry.order_scope("O-1"):
        carrier = telemetry.start_attempt("O-1", "O-1:1")
    trace_id, submit_span = _ids(submit)
    assert carrier["traceparent"].split("-")[1] == trace_id
    start = next(s for s in spans.get_finished_spans() if s.name == "start attempt")
    assert f"{start.parent.span_id:016x}" == submit_span
    assert start.attributes[telemetry.ORDER_ID] == "O-1"


def test_an_attempt_claimed_elsewhere_starts_its_own_trace_linked_to_the_current(spans):
    with telemetry.span("starter run") as run, telemetry.order_scope("O-2"):
        carrier = telemetry.start_attempt("O-1", "O-1:2")
    run_trace, run_span = _ids(run)
    assert carrier["traceparent"].split("-")[1] != run_trace
    start = next(s for s in spans.get_finished_spans() if s.name == "start attempt")
    assert start.parent is None
    assert [
        (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in start.links
    ] == [(run_trace, run_span)]


def test_an_activity_continues_the_trace_its_input_carries(spans):
    from triggers.activities import _span

    with telemetry.span("start attempt") as start:
        carrier = telemetry.inject()
    spans.clear()
    with _span("write_state", {"InstanceId": "O-1:3", "Trace": carrier}):
        pass
    (activity,) = spans.get_finished_spans()
    trace_id, span_id = _ids(start)
    assert f"{activity.context.trace_id:032x}" == trace_id
    assert f"{activity.parent.span_id:016x}" == span_id
    assert activity.attributes[telemetry.ORDER_ID] == "O-1"
    assert activity.attributes[telemetry.INSTANCE_ID] == "O-1:3"


def test_an_activity_with_a_forged_trace_starts_a_new_one(spans):
    from triggers.activities import _span

    with _span("write_state", {"InstanceId": "O-1:3", "Trace": {"traceparent": "nonsense"}}):
        pass
    (activity,) = spans.get_finished_spans()
    assert activity.parent is None
    assert activity.context.is_valid


def test_a_first_attempt_the_timer_claims_continues_the_trace_submit_stored(spans):
    stored = {"traceparent": CLIENT_PARENT}
    with telemetry.span("starter run"):
        carrier = telemetry.start_attempt("O-1", "O-1:1", 1, stored)
    assert carrier["traceparent"].split("-")[1] == CLIENT_TRACE
    start = next(s for s in spans.get_finished_spans() if s.name == "start attempt")
    assert f"{start.parent.span_id:016x}" == CLIENT_SPAN


def test_a_retry_is_a_new_trace_linked_to_submits(spans):
    stored = {"traceparent": CLIENT_PARENT}
    carrier = telemetry.start_attempt("O-1", "O-1:2", 2, stored)
    assert carrier["traceparent"].split("-")[1] != CLIENT_TRACE
    start = next(s for s in spans.get_finished_spans() if s.name == "start attempt")
    assert start.parent is None
    assert [f"{link.context.trace_id:032x}" for link in start.links] == [CLIENT_TRACE]
    assert start.attributes["order.attempt"] == 2


def test_a_forged_stored_context_is_not_trusted(spans):
    carrier = telemetry.start_attempt("O-1", "O-1:1", 1, {"traceparent": "00-zz-zz-01"})
    start = next(s for s in spans.get_finished_spans() if s.name == "start attempt")
    assert start.parent is None
    assert not start.links
    assert carrier["traceparent"].split("-")[1] == f"{start.context.trace_id:032x}"
