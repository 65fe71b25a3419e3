"""The step catalog (domain/steps.json, domain.steps): what it holds, and that
a bad entry is refused at load with the entry and the reason named."""

from __future__ import annotations

import json

import pytest

from devstack.remote_service.ledger import operations
from domain.steps import (
    DEFAULT_CATALOG,
    DEFAULT_CATALOG_FILE,
    PAYLOAD_FIELDS,
    CatalogError,
    UnknownStep,
    load_catalog,
    parse_catalog,
)
from tests.added_step import WAREHOUSE_STEP, with_warehouse_step, write_catalog


def test_the_shipped_catalog_is_the_three_steps_in_workflow_order():
    assert DEFAULT_CATALOG.names == ("reserve-inventory", "charge-payment", "arrange-shipment")
    assert DEFAULT_CATALOG.services == ("inventory", "payment", "shipping")
    assert [(s.do.path, s.undo.path) for s in DEFAULT_CATALOG.steps] == [
        ("/inventory/reserve", "/inventory/release"),
        ("/payment/charge", "/payment/refund"),
        ("/shipping/arrange", "/shipping/cancel"),
    ]
    # Each step carries the order fields its service needs: no card reference
    # to the warehouse, no order lines to the payment provider.
    assert {s.name: s.payload for s in DEFAULT_CATALOG.steps} == {
        "reserve-inventory": ("CustomerId", "Lines"),
        "charge-payment": ("CustomerId", "Total", "Currency", "PaymentReference"),
        "arrange-shipment": ("CustomerId", "Lines"),
    }
    assert set().union(*(s.payload for s in DEFAULT_CATALOG.steps)) == set(PAYLOAD_FIELDS)
    assert [s.name for s in DEFAULT_CATALOG.steps if s.refusal is not None] == ["charge-payment"]
    assert load_catalog(DEFAULT_CATALOG_FILE) == DEFAULT_CATALOG


def test_operations_are_what_a_remote_service_serves():
    assert operations(DEFAULT_CATALOG) == {
        "inventory": {"reserve": None, "release": "reserve"},
        "payment": {"charge": None, "refund": "charge"},
        "shipping": {"arrange": None, "cancel": "arrange"},
    }


def test_a_step_added_by_data_comes_last_on_its_own_service():
    catalog = with_warehouse_step()
    assert catalog.names[-1] == "reserve-warehouse-slot"
    assert catalog.names[:3] == DEFAULT_CATALOG.names
    assert catalog.services[-1] == "warehouse"
    step = catalog.step_named("reserve-warehouse-slot")
    assert (step.do.path, step.undo.path, step.payload) == (
        "/warehouse/reserve",
        "/warehouse/release",
        ("Lines",),
    )


def test_a_catalog_file_round_trips(tmp_path):
    path = write_catalog(tmp_path / "steps.json")
    assert load_catalog(path) == with_warehouse_step()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"service": "Ware House"}, r"steps\[3\] \(reserve-warehouse-slot\)\.service"),
        ({"payload": ["Lines", "ShoeSize"]}, r"steps\[3\] \(reserve-warehouse-slot\).*ShoeSize"),
        ({"undo": "reserve"}, r"steps\[3\] \(reserve-warehouse-slot\).*do and undo"),
        ({"name": "charge-payment"}, r"steps named twice: \['charge-payment'\]"),
        ({"service": "payment", "do": "charge"}, r"/payment/charge belongs to both"),
        ({"name": "Reserve Slot"}, r"steps\[3\] \(Reserve Slot\)\.name"),
        ({"colour": "red"}, r"steps\[3\] \(reserve-warehouse-slot\)\.colour"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(change, said):
    data = {"steps": [*DEFAULT_CATALOG.model_dump(by_alias=True)["steps"], WAREHOUSE_STEP | change]}
    with pytest.raises(CatalogError, match=said):
        parse_catalog(data)


def test_a_missing_field_is_named():
    entry = {k: v for k, v in WAREHOUSE_STEP.items() if k != "undo"}
    with pytest.raises(
        CatalogError, match=r"steps\[0\] \(reserve-warehouse-slot\)\.undo: Field required"
    ):
        parse_catalog({"steps": [entry]})


def test_an_empty_catalog_is_refused():
    with pytest.raises(CatalogError, match="at least one step"):
        parse_catalog({"steps": []})


def test_a_file_that_is_not_json_or_not_there_is_named(tmp_path):
    bad = tmp_path / "steps.json"
    bad.write_text("{steps: [")
    with pytest.raises(CatalogError, match=f"step catalog {bad}: not JSON"):
        load_catalog(bad)
    with pytest.raises(CatalogError, match="cannot read it"):
        load_catalog(tmp_path / "absent.json")
    bad.write_text(json.dumps({"steps": [{"name": "x"}]}))
    with pytest.raises(CatalogError, match=rf"step catalog {bad}: steps\[0\] \(x\)\.service"):
        load_catalog(bad)


def test_an_unknown_step_names_the_known_ones():
    with pytest.raises(UnknownStep, match="'polish-shoes'; known steps: reserve-inventory, "):
        DEFAULT_CATALOG.step_named("polish-shoes")


def test_the_catalog_file_ships_with_the_app():
    from pathlib import Path

    from deploy.package import shipped_files

    assert Path("domain/steps.json") in set(shipped_files())


def test_a_steps_part_of_the_payload_is_the_fields_its_entry_names():
    """StepCatalog.part: what the Scheduler puts in a step's request (and so
    in the attempt's history): the step's fields, in the payload's order; a
    step the catalog does not know (a newer build's) gets them all."""
    payload = {
        "CustomerId": "C-1",
        "Lines": [{"Sku": "S", "Quantity": 1, "UnitPrice": "1.00"}],
        "Total": "1.00",
        "Currency": "EUR",
        "PaymentReference": "pay-1",
    }
    assert DEFAULT_CATALOG.part("charge-payment", payload) == {
        "CustomerId": "C-1",
        "Total": "1.00",
        "Currency": "EUR",
        "PaymentReference": "pay-1",
    }
    assert DEFAULT_CATALOG.part("reserve-inventory", payload) == {
        "CustomerId": "C-1",
        "Lines": payload["Lines"],
    }
    assert DEFAULT_CATALOG.part("reserve-warehouse-slot", payload) == payload
    assert DEFAULT_CATALOG.part("charge-payment", {}) == {}
