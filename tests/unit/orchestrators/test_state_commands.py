"""The typed state commands and the one way a stale attempt ends: every
kind parses into its command and dumps back what it read, a malformed one
is refused, and a stale write ends the attempt naming the step it was at
and the store's reason."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrators.commands import (
    FinishCompensation,
    RecordTransient,
    UndoDone,
    UndoFailed,
    parse_state_write,
)
from orchestrators.contracts import (
    WriteResult,
)
from orchestrators.order_workflow import StaleAttempt, ends_stale, unless_stale
from tests.unit.orchestrators.driver import Driver, World

WRITES = [
    (
        {"InstanceId": "webshop:A1:1", "Kind": "transient", "Step": "pay", "Reason": "busy"},
        RecordTransient,
    ),
    # A transient reply may carry no error text.
    ({"InstanceId": "webshop:A1:1", "Kind": "transient", "Step": "pay"}, RecordTransient),
    ({"InstanceId": "webshop:A1:1", "Kind": "undo_done", "Step": "pay"}, UndoDone),
    (
        {"InstanceId": "webshop:A1:1", "Kind": "undo_failed", "Step": "pay", "Reason": "no"},
        UndoFailed,
    ),
    ({"InstanceId": "webshop:A1:1", "Kind": "finish_compensation"}, FinishCompensation),
]


@pytest.mark.parametrize(("data", "command"), WRITES)
def test_a_state_write_parses_into_its_command_and_dumps_what_it_read(data, command):
    parsed = parse_state_write(data)
    assert type(parsed) is command
    assert {k: v for k, v in parsed.dump().items() if v is not None} == data


@pytest.mark.parametrize(
    "data",
    [
        {"InstanceId": "webshop:A1:1", "Kind": "undo_failed", "Step": "pay"},  # no reason
        {"InstanceId": "webshop:A1:1", "Kind": "undo_done"},  # no step
        {"InstanceId": "webshop:A1:1", "Kind": "processed"},  # not a write_state kind
        {"InstanceId": "webshop:A1:1", "Kind": "finish_compensation", "Extra": 1},
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


def decline_transiently(step):
    def agent(send):
        if send.Action == "do" and send.Step == step:
            return ("transient", "card service busy")
        return ok(send)

    return agent


def decline(step):
    def agent(send):
        if send.Action == "do" and send.Step == step:
            return ("permanent", "card declined")
        return ok(send)

    return agent


@pytest.mark.parametrize(
    ("agent", "at_write", "step"),
    [
        # The compensation's writes: each undo's outcome, then its end.
        (decline("charge-payment"), 0, "charge-payment"),
        (decline("charge-payment"), 1, "reserve-inventory"),
        (decline("charge-payment"), 2, None),
        # A transient failure's note.
        (decline_transiently("charge-payment"), 0, "charge-payment"),
    ],
)
async def test_a_stale_write_ends_the_attempt_naming_where_it_was(agent, at_write, step):
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

    driver = Driver(world, iid, agent, before_activity=steal)
    assert await driver.run() == "completed"
    assert driver.output is not None
    assert {k: driver.output.get(k) for k in ("Outcome", "Step")} == {
        "Outcome": "stale",
        "Step": step,
    }
    assert "webshop:A1:99" in driver.output["Detail"]
    assert count["n"] == at_write + 1
