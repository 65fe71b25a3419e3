from __future__ import annotations

import pytest

from agents.steps import (
    DEFAULT_CATALOG,
    UnknownStep,
    compensation_for,
    compensation_order,
    step_named,
)
from domain.ids import idempotency_key

STEP_NAMES = DEFAULT_CATALOG.names


def test_the_workflow_order_is_reserve_charge_ship():
    assert STEP_NAMES == ("reserve-inventory", "charge-payment", "arrange-shipment")


def test_every_step_name_is_a_valid_step_on_the_wire():
    for name in STEP_NAMES:
        assert idempotency_key("o1", name) == f"o1/{name}"


@pytest.mark.parametrize(
    ("step", "undo_path"),
    [
        ("reserve-inventory", "/inventory/release"),
        ("charge-payment", "/payment/refund"),
        ("arrange-shipment", "/shipping/cancel"),
    ],
)
def test_each_step_has_its_compensation_on_the_same_service(step, undo_path):
    assert compensation_for(step).path == undo_path
    assert step_named(step).undo.service == step_named(step).do.service


def test_compensation_runs_in_reverse_workflow_order():
    assert compensation_order(["charge-payment", "reserve-inventory"]) == [
        "charge-payment",
        "reserve-inventory",
    ]
    assert compensation_order(list(STEP_NAMES)) == list(reversed(STEP_NAMES))
    assert compensation_order([]) == []


def test_unknown_steps_are_named_in_the_error():
    with pytest.raises(UnknownStep, match="polish-shoes"):
        step_named("polish-shoes")
    with pytest.raises(UnknownStep, match="polish-shoes"):
        compensation_order(["polish-shoes"])
    assert len(DEFAULT_CATALOG.steps) == 3
