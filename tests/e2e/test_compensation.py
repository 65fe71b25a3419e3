"""Compensation through the local host: a step fails for good after earlier
steps completed, and every step whose request was sent (the failed one
included) is undone in reverse order — with an
undo that fails transiently then succeeds, and one that fails for good and is
retried by an operator."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from adapters.ports import ANY_OWNER
from domain import state_machine as sm
from domain.ids import order_key
from domain.models import ProcessState, StepStatus
from tests.e2e.conftest import E2E

pytestmark = [pytest.mark.timeout(300)]


async def test_undo_that_fails_transiently_then_succeeds(stack):
    async with E2E(stack) as e2e:
        orders = e2e.orders(1)
        oid = orders[0].OrderID
        await e2e.decline_charge(oid)
        await e2e.fault(
            kind="transient", service="inventory", operation="release", order_id=oid, count=2
        )
        await e2e.post(orders)
        records = await e2e.wait_terminal({oid})
        record = records[oid]
        assert record.ProcessState is ProcessState.COMPENSATED
        assert record.Steps["reserve-inventory"].Status is StepStatus.COMPENSATED
        # The declined charge's request was sent, so it is undone too (first): a
        # refund of nothing, which the remote service answers without an effect.
        assert record.Steps["charge-payment"].Status is StepStatus.COMPENSATED
        assert [(e.Step, e.Outcome) for e in record.Compensation] == [
            ("reserve-inventory", "Done"),
            ("charge-payment", "Done"),
        ]
        assert await e2e.check({oid}) == []
        assert e2e.observed.replies[oid][-2:] == ["Compensating", "Compensated"]
        effects = {
            (r["step"], r["operation"]): r["count"]
            for r in e2e.observed.side_effects["effects"]
            if r["order_id"] == order_key("webshop", oid)
        }
        assert effects == {
            ("reserve-inventory", "inventory/reserve"): 1,
            ("reserve-inventory", "inventory/release"): 1,
        }


async def test_undo_that_fails_for_good_alerts_and_an_operator_retries_it(stack):
    async with E2E(stack) as e2e:
        orders = e2e.orders(1)
        oid = orders[0].OrderID
        await e2e.decline_charge(oid)
        await e2e.fault(
            kind="permanent",
            service="inventory",
            operation="release",
            order_id=oid,
            message="reservation locked",
        )
        await e2e.post(orders)
        records = await e2e.wait_terminal({oid})
        record = records[oid]
        assert record.ProcessState is ProcessState.COMPENSATION_FAILED
        assert "reserve-inventory" in record.LastError
        assert await e2e.check({oid}) == []
        assert e2e.observed.alerts["CompensationFailed"] == 1

        # the operator clears the cause and asks again (what `python -m cli compensate` does)
        async with e2e.http.delete(f"{e2e.remote}/_admin/faults"):
            pass
        await e2e.store.update(
            record.id, lambda r: sm.request_compensation(r, datetime.now(UTC)), ANY_OWNER
        )
        records = await e2e.wait_for(
            # a listing can miss a record being replaced (the local Cosmos server)
            lambda rs: oid in rs and rs[oid].ProcessState is ProcessState.COMPENSATED,
            timeout=90,
            what="compensated",
        )
        assert records[oid].Attempt == record.Attempt + 1
        assert await e2e.check({oid}) == []
        effects = {
            (r["step"], r["operation"]): r["count"]
            for r in e2e.observed.side_effects["effects"]
            if r["order_id"] == order_key("webshop", oid)
        }
        assert effects == {
            ("reserve-inventory", "inventory/reserve"): 1,
            ("reserve-inventory", "inventory/release"): 1,
        }
