"""A fourth step added by data alone, end to end: the local stack (host running
function_app.py unchanged, Service Bus emulator, Cosmos server, Azurite) started
with a step catalog file that has "reserve-warehouse-slot" appended
(STEP_CATALOG_FILE, tests/added_step.py), and that step's service "warehouse" at
another base URL (REMOTE_SERVICE_URL__WAREHOUSE): a second remote service
process. No product code names the step. One order is processed through all
four steps; one whose shipment is declined compensates the warehouse slot too
(the workflow 2.1 in use reads its steps from the plan, so no new version)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.remote_service.process import start_remote_service
from devstack.stack import Stack
from domain.ids import order_key
from domain.models import ProcessState, StepStatus
from tests.added_step import write_catalog
from tests.e2e.conftest import E2E, E2E_SETTINGS

pytestmark = [pytest.mark.timeout(300)]

STEP = "reserve-warehouse-slot"
ALL_STEPS = ["reserve-inventory", "charge-payment", "arrange-shipment", STEP]


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    """The warehouse service, on its own port, serving the extended catalog."""
    run_dir = Path(tmp_path_factory.mktemp("warehouse"))
    catalog = write_catalog(run_dir / "steps.json")
    service = start_remote_service(seed=3, catalog=catalog, state_file=run_dir / "state.json")
    try:
        yield service, catalog
    finally:
        service.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, warehouse) -> Stack:
    service, catalog = warehouse
    overrides = {
        **E2E_SETTINGS,
        "STEP_CATALOG_FILE": str(catalog),
        "REMOTE_SERVICE_URL__WAREHOUSE": service.url,
    }
    with Stack(Path(tmp_path_factory.mktemp("stack")), overrides=overrides) as stack:
        yield stack


async def _effects(e2e: E2E, url: str, key: str) -> dict[tuple[str, str], int]:
    async with e2e.http.get(f"{url}/_admin/side-effects", params={"order_id": key}) as response:
        rows = (await response.json())["effects"]
    return {(r["step"], r["operation"]): r["count"] for r in rows}


async def test_an_order_runs_the_added_step_at_its_own_service(stack, warehouse):
    service, _ = warehouse
    async with E2E(stack) as e2e:
        orders = e2e.orders(1)
        oid = orders[0].OrderID
        await e2e.post(orders)
        records = await e2e.wait_terminal({oid})
        record = records[oid]
        assert record.ProcessState is ProcessState.PROCESSED, record.LastError
        assert list(record.Steps) == ALL_STEPS
        assert all(s.Status is StepStatus.COMPLETED for s in record.Steps.values())
        assert await e2e.check({oid}) == []
        key = order_key("webshop", oid)
        # The added step's effect is on the warehouse service, and only there.
        assert await _effects(e2e, service.url, key) == {(STEP, "warehouse/reserve"): 1}
        assert await _effects(e2e, e2e.remote, key) == {
            ("reserve-inventory", "inventory/reserve"): 1,
            ("charge-payment", "payment/charge"): 1,
            ("arrange-shipment", "shipping/arrange"): 1,
        }


async def test_a_later_failure_undoes_the_added_step_too(stack, warehouse):
    """The added step runs last: its refusal compensates every step."""
    service, _ = warehouse
    async with E2E(stack) as e2e:
        orders = e2e.orders(1)
        oid = orders[0].OrderID
        async with e2e.http.post(
            f"{service.url}/_admin/faults",
            json={
                "kind": "permanent",
                "service": "warehouse",
                "operation": "reserve",
                "order_id": oid,
                "message": "no slot free",
            },
        ) as response:
            assert response.status == 201, await response.text()
        await e2e.post(orders)
        records = await e2e.wait_terminal({oid})
        record = records[oid]
        assert record.ProcessState is ProcessState.COMPENSATED, record.LastError
        # The log in the order the requests were sent (its undo runs it backwards):
        # every step, the refused one included, undone.
        assert [(e.Step, e.Outcome) for e in record.Compensation] == [
            (step, "Done") for step in ALL_STEPS
        ]
        assert await e2e.check({oid}) == []
        key = order_key("webshop", oid)
        assert await _effects(e2e, service.url, key) == {}  # refused: nothing to undo
        assert await _effects(e2e, e2e.remote, key) == {
            ("reserve-inventory", "inventory/reserve"): 1,
            ("reserve-inventory", "inventory/release"): 1,
            ("charge-payment", "payment/charge"): 1,
            ("charge-payment", "payment/refund"): 1,
            ("arrange-shipment", "shipping/arrange"): 1,
            ("arrange-shipment", "shipping/cancel"): 1,
        }
