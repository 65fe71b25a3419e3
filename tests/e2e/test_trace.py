"""One order, one trace, through the local host: a client sends an order
with its own W3C `traceparent`, and Submit, the start of the attempt, the
workflow's activities, the agent, its remote call and the reply bridge all
record spans in that one trace (read back from the spans file the host
writes, as `python -m cli trace` does)."""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage
from rich.console import Console

from adapters import telemetry
from cli import trace as traces
from devstack.invariants import INGRESS_QUEUE
from devstack.stack import Stack
from domain.codec import encode
from domain.ids import order_key
from domain.models import ProcessState
from tests.e2e.conftest import E2E, E2E_SETTINGS

pytestmark = [pytest.mark.timeout(300)]

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Stack:
    run_dir = tmp_path_factory.mktemp("trace-stack")
    overrides = {
        **E2E_SETTINGS,
        # Generous deadlines: this test is about one attempt, not about retries.
        "STEP_TIMEOUT_SECONDS": "40",
        "CLAIM_TIMEOUT_SECONDS": "40",
        telemetry.TRACES_FILE: str(run_dir / "spans.jsonl"),
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    with Stack(Path(run_dir), overrides=overrides) as stack:
        yield stack


async def _spans_of(path: Path, order_id: str, needed: set[str], timeout: float = 30) -> dict:
    """The order's traces once every span name in `needed` is in the file
    (the host exports in batches a fraction of a second after a span ends)."""
    deadline = time.monotonic() + timeout
    while True:
        found = traces.load(path, order_id) if path.exists() else {}
        names = {s.name for spans in found.values() for s in spans}
        if needed <= names or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.5)


async def test_one_order_is_one_trace_across_submit_activities_agent_and_bridge(stack):
    spans_file = Path(stack.settings[telemetry.TRACES_FILE])
    async with E2E(stack) as e2e:
        (order,) = e2e.orders(1)
        oid = order.OrderID
        async with e2e.bus.get_queue_sender(INGRESS_QUEUE) as sender:
            await sender.send_messages(
                ServiceBusMessage(
                    encode(order),
                    message_id=f"submit/{oid}",
                    application_properties={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
                )
            )
        records = await e2e.wait_terminal({oid})
        assert records[oid].ProcessState is ProcessState.PROCESSED
        assert records[oid].Attempt == 1, (
            "a retry would be a second trace; this test wants one attempt"
        )

        needed = {
            "submit",
            "start attempt",
            "send first request",
            "activity send_step",
            "activity finish_attempt",
            "activity run_inline_step",
            "agent",
            "reply bridge",
            "send agent-requests",
            "send agent-responses",
            "send replies-webshop",
        }
        # Spans name the order by its key (what operators give `cli trace`).
        found = await _spans_of(spans_file, order_key("webshop", oid), needed)

    names = {s.name for spans in found.values() for s in spans}
    assert needed <= names, f"missing spans: {sorted(needed - names)}"
    # One trace, and it is the client's.
    assert list(found) == [CLIENT_TRACE]
    spans = found[CLIENT_TRACE]
    by_id = {s.span_id: s for s in spans}

    def parent(span):
        return by_id.get(span.parent_id)

    (submit,) = [s for s in spans if s.name == "submit"]
    assert submit.parent_id == CLIENT_SPAN
    assert submit.kind == "consumer"
    assert submit.attributes[telemetry.ORDER_ID] == order_key("webshop", oid)

    (start,) = [s for s in spans if s.name == "start attempt"]
    assert start.attributes[telemetry.INSTANCE_ID] == f"{order_key('webshop', oid)}:1"
    # Submit's fast path claimed the attempt inside Submit's span.
    assert parent(start) is submit
    activities = [s for s in spans if s.name.startswith("activity ")]
    assert activities
    assert all(parent(a) is start for a in activities)

    # Each agent continues the request an activity sent, or the first step's, which
    # the Starter sent in the attempt's trace (ADR 021l); each bridge the reply an
    # agent sent.
    agents = [s for s in spans if s.name == "agent"]
    assert len(agents) == 2  # two remote steps; arrange-shipment runs inline
    senders = []
    for agent in agents:
        sent = parent(agent)
        assert sent.name == "send agent-requests"
        sender = parent(sent)
        assert sender.name.startswith("activity ") or sender.name == "send first request"
        assert parent(sender) is start
        senders.append(sender.name)
        calls = [s for s in spans if s.parent_id == agent.span_id and s.name.startswith("POST ")]
        assert calls
        assert all(c.kind == "client" for c in calls)
    assert sorted(senders) == ["activity send_step", "send first request"]
    # Each agent's reply is bridged; a redelivered reply (its lock lost on a
    # starved machine) is bridged again under the same agent, at least once.
    bridges = [s for s in spans if s.name == "reply bridge"]
    assert {parent(parent(b)).span_id for b in bridges} == {a.span_id for a in agents}
    inline = [s for s in spans if s.name == "activity run_inline_step"]
    assert any(s.name.startswith("POST shipping/") and parent(s) in inline for s in spans)
    assert all(s.end >= s.start for s in spans)

    out = io.StringIO()
    traces.print_traces(Console(file=out, width=200, color_system=None), oid, found)
    assert f"trace {CLIENT_TRACE}" in out.getvalue()
