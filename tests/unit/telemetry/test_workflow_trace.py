"""The attempt's trace context rides from the claim, through the
orchestration's input, into every activity's input, replayed by the Durable
SDK (tests/unit/orchestrators/driver.py): the orchestrator opens no span, it
only copies a value from its input, so replays see the same inputs."""

from __future__ import annotations

import json
from typing import ClassVar

from adapters import telemetry
from orchestrators import order_workflow as wf
from tests.unit.orchestrators.driver import Driver, World


def ok(send):
    return ("ok", {"Reference": f"ref-{send.Step}"})


async def test_every_activity_of_a_fast_started_attempt_carries_submits_trace(spans):
    world = World()
    with telemetry.span("submit") as submit, telemetry.order_scope("webshop:A1"):
        instance_id, attempt_input = await world.fast_started("A1")
    trace_id = f"{submit.get_span_context().trace_id:032x}"
    carrier = attempt_input["Trace"]
    assert carrier["traceparent"].split("-")[1] == trace_id

    driver = Driver(world, instance_id, ok, input=attempt_input)
    assert await driver.run() == "completed"
    # The first request is the Starter's (ADR 021l), the rest the attempt's.
    assert [name for name, _ in driver.calls] == ["send_step"] * 2 + ["finish_attempt"]
    # every replay gave every activity the same carrier (a traceparent alone: its string)
    assert list(carrier) == ["traceparent"]
    assert all(data["Trace"] == carrier["traceparent"] for _, data in driver.calls)
    # and the Starter sent its request in the attempt's trace too
    starters = [s for s in spans.get_finished_spans() if s.name == "send first request"]
    assert [f"{s.context.trace_id:032x}" for s in starters] == [trace_id]


async def test_the_timer_starters_attempt_has_a_trace_of_its_own(spans):
    world = World()
    record, etag = await world.submitted("A2")
    with telemetry.span("starter run") as run:
        instance_id = await world.starter().claim_and_start(_Client(), record, etag)
    carrier = _Client.last["Trace"]
    assert carrier["traceparent"].split("-")[1] != f"{run.get_span_context().trace_id:032x}"
    assert instance_id == "webshop:A2:1"


async def test_an_instance_without_a_trace_sends_none():
    world = World()
    instance_id = await world.claimed("A3")
    given = {k: v for k, v in world.inputs[instance_id].items() if k != "Trace"}
    driver = Driver(world, instance_id, ok, input=given)
    assert await driver.run() == "completed"
    assert all(data.get("Trace") is None for _, data in driver.calls)


def test_traced_ignores_inputs_that_are_not_a_carrier():
    class Ctx:
        def __init__(self, value):
            self.value = value

        def get_input(self):
            return self.value

    data = {"InstanceId": "webshop:A:1"}
    assert wf._traced(Ctx(None), data) == data
    assert wf._traced(Ctx("not json"), data) == data
    assert wf._traced(Ctx({"Trace": {"traceparent": 5}}), data) == data
    assert wf._traced(Ctx({"Trace": "x"}), data) == data
    assert wf._traced(Ctx('{"Trace": {"traceparent": "t"}}'), data) == {**data, "Trace": "t"}
    both = {"traceparent": "t", "tracestate": "k=v"}
    assert wf._traced(Ctx({"Trace": both}), data) == {**data, "Trace": both}


class _Client:
    last: ClassVar[dict] = {}

    async def start_new(self, name, instance_id, data):
        _Client.last = data


async def test_submit_stores_its_trace_on_the_record_for_the_timer_starter(spans):
    """The timer Starter can win the claim before Submit's fast path (the
    e2e test saw it under load): the attempt still joins Submit's trace."""
    from adapters.settings import Settings
    from reporting import Alerts, StatusReporter
    from submit.handler import SubmitHandler
    from submit.policy import SubmitPolicy
    from tests.builders import order_payload
    from tests.unit.orchestrators.driver import SETTINGS, STEPS

    world = World()
    settings = Settings(**{**SETTINGS.__dict__, "reply_queues": {"webshop": "replies-webshop"}})
    handler = SubmitHandler(
        SubmitPolicy.from_settings(settings),
        world.store,
        world.orders,
        StatusReporter(world.bus),
        Alerts(world.bus),
        list(STEPS),
    )
    body = json.dumps(order_payload(OrderID="A4")).encode()
    with telemetry.span("submit") as submit:
        outcome = await handler.handle(body, "webshop")  # no Durable client: no fast path
    assert outcome.kind.value == "complete"
    record = await world.record("A4")
    assert record.Trace["traceparent"].split("-")[1] == f"{submit.get_span_context().trace_id:032x}"

    etag = (await world.store.read("webshop:A4"))[1]
    await world.starter().claim_and_start(_Client(), record, etag)
    assert (
        _Client.last["Trace"]["traceparent"].split("-")[1]
        == f"{submit.get_span_context().trace_id:032x}"
    )
