"""The typed state commands and the one way a stale attempt ends.

Histories already written (1.0 and 2.x instances in flight) hold the old
all-optional StateWrite shape: every kind must still parse into its command
and dump back to the same bytes. And a stale write ends each workflow version
with the same result as before the commands (the step it was at, the reason)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from orchestrators.commands import (
    BeginCompensation,
    CompleteStep,
    FinishCompensation,
    MarkFailed,
    MarkProcessed,
    RecordTransient,
    StartStep,
    UndoDone,
    UndoFailed,
    parse_state_write,
)
from orchestrators.contracts import (
    WriteResult,
)
from orchestrators.workflow_v2_1 import StaleAttempt, ends_stale, unless_stale
from tests.unit.orchestrators.driver import Driver, World

DEADLINE = "2026-01-01T12:01:00Z"


def old_shape(kind, step=None, deadline=None, reference=None, reason=None, trace=None):
    """What the one all-optional StateWrite model dumped (field order included)."""
    return {
        "Trace": trace,
        "InstanceId": "webshop:A1:1",
        "Kind": kind,
        "Step": step,
        "Deadline": deadline,
        "Reference": reference,
        "Reason": reason,
    }


OLD_WRITES = [
    (old_shape("start_step", "pay", DEADLINE), StartStep),
    (old_shape("start_step", "pay", DEADLINE, trace={"traceparent": "00-ab-cd-01"}), StartStep),
    (old_shape("complete_step", "pay", DEADLINE, "ref-1"), CompleteStep),
    # 1.0 sends no deadline; a reply may carry no reference.
    (old_shape("complete_step", "pay"), CompleteStep),
    (old_shape("processed"), MarkProcessed),
    (old_shape("failed", "pay", reason="step pay failed: declined"), MarkFailed),
    (old_shape("begin_compensation", "pay", reason="step pay failed"), BeginCompensation),
    # 1.0 names no step when it begins compensating.
    (old_shape("begin_compensation", reason="step pay failed"), BeginCompensation),
    (old_shape("transient", "pay", reason="busy"), RecordTransient),
    # A transient reply may carry no error text.
    (old_shape("transient", "pay"), RecordTransient),
    (old_shape("undo_done", "pay"), UndoDone),
    (old_shape("undo_failed", "pay", reason="no reply before the deadline"), UndoFailed),
    (old_shape("finish_compensation"), FinishCompensation),
]


@pytest.mark.parametrize(("data", "command"), OLD_WRITES)
def test_an_old_state_write_parses_into_its_command_and_dumps_the_same_bytes(data, command):
    parsed = parse_state_write(data)
    assert type(parsed) is command
    assert parsed.InstanceId == "webshop:A1:1"
    assert json.dumps(parsed.dump()) == json.dumps(data)
    # As Durable hands it over again: from the JSON text of the history.
    assert type(parse_state_write(json.loads(json.dumps(data)))) is command


def test_old_shapes_without_the_null_fields_parse_too():
    assert parse_state_write({"InstanceId": "webshop:A1:1", "Kind": "processed"}) == MarkProcessed(
        InstanceId="webshop:A1:1"
    )
    assert parse_state_write(
        {"InstanceId": "webshop:A1:1", "Kind": "undo_done", "Step": "pay"}
    ) == UndoDone(InstanceId="webshop:A1:1", Step="pay")


@pytest.mark.parametrize(
    "data",
    [
        old_shape("processed", step="pay"),  # a field this kind does not use, not null
        old_shape("start_step", "pay"),  # a step is started with its deadline
        old_shape("start_step", deadline=DEADLINE),
        old_shape("failed", "pay"),  # failing needs its reason
        old_shape("undo_failed", "pay"),
        old_shape("undo_done"),
        old_shape("complete"),  # no such kind
        {**old_shape("processed"), "Extra": 1},
    ],
)
def test_a_malformed_state_write_is_refused(data):
    with pytest.raises(ValidationError):
        parse_state_write(data)


def test_stale_attempt_raised_deep_inside_ends_the_run_with_the_stale_result():
    def write():
        result = WriteResult.model_validate((yield "write"))
        return unless_stale(result, "pay")

    def body():
        yield from write()
        yield "never scheduled"
        return {"Outcome": "processed"}

    run = ends_stale(lambda context: body())(None)
    assert next(run) == "write"
    with pytest.raises(StopIteration) as stop:
        run.send({"Stale": True, "Reason": "order A1 is locked by 'A1:2'"})
    assert stop.value.value == {
        "Outcome": "stale",
        "Step": "pay",
        "Detail": "order A1 is locked by 'A1:2'",
    }


def test_a_fresh_result_passes_through_unless_stale():
    fresh = WriteResult(Stale=False)
    assert unless_stale(fresh, "pay") is fresh
    with pytest.raises(StaleAttempt) as raised:
        unless_stale(WriteResult(Stale=True, Reason="gone"), "pay")
    assert (raised.value.reason, raised.value.step) == ("gone", "pay")


def ok(send):
    return ("ok", {"Reference": f"ref-{send.Step}-{send.Action}"})


def decline(step):
    def agent(send):
        if send.Action == "do" and send.Step == step:
            return ("permanent", "card declined")
        return ok(send)

    return agent


@pytest.mark.parametrize(
    ("version", "agent", "at_write", "step"),
    [
        # 1.0: start, complete, start, complete, start, complete, processed.
        ("1.0", ok, 2, "charge-payment"),
        ("1.0", ok, 6, None),
        # 1.0's begin_compensation names no step; the result still does.
        ("1.0", decline("charge-payment"), 3, "charge-payment"),
        ("1.0", decline("charge-payment"), 4, "reserve-inventory"),  # its undo
        ("1.0", decline("charge-payment"), 5, None),  # finish compensation
        ("1.1", ok, 3, "charge-payment"),
        ("1.1", ok, 6, None),
        ("1.1", decline("charge-payment"), 3, "charge-payment"),
        ("1.1", decline("charge-payment"), 5, "reserve-inventory"),
        ("1.1", decline("charge-payment"), 6, None),
        # 2.0 writes through write_state only off the happy path.
        ("2.0", decline("charge-payment"), 0, "charge-payment"),
        ("2.0", decline("charge-payment"), 2, "reserve-inventory"),
        ("2.1", decline("charge-payment"), 3, None),
    ],
)
async def test_a_stale_write_ends_every_version_naming_where_it_was(version, agent, at_write, step):
    """Another attempt takes the record just before write_state call
    `at_write`: the run ends "stale", naming the step it was at (or none at
    the terminal writes) and the store's reason, and writes nothing more."""
    world = World()
    iid = await world.claimed()
    count = {"n": 0}

    def steal(name, data):
        if name != "write_state":
            return
        if count["n"] == at_write:
            doc, _ = world.store.docs["webshop:A1"]
            world.store.docs["webshop:A1"] = (dict(doc, LockedBy="webshop:A1:99"), '"stolen"')
        count["n"] += 1

    driver = Driver(world, iid, agent, version=version, before_activity=steal)
    assert await driver.run() == "completed"
    assert driver.output is not None
    assert {k: driver.output[k] for k in ("Outcome", "Step")} == {"Outcome": "stale", "Step": step}
    assert "webshop:A1:99" in driver.output["Detail"]
    assert count["n"] == at_write + 1
