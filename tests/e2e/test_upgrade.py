"""The upgrade from workflow 1.1 through the local host: an order whose 1.1
attempt is in flight when the host is replaced by one with the repo's
host.json (`defaultVersion: 2.2`) finishes on 1.1 (its history says 1.1, and
1.1's code is still registered), while an order posted after the upgrade runs
the default (2.x). The 2.0 and 2.1 -> 2.2 upgrades: tests/e2e/test_upgrade_2_1.py.

Which code ran is visible from outside: 1.1 sends every progress status, 2.x
only those the application opted in to (webshop did not)."""

from __future__ import annotations

import pytest

from domain.models import ProcessState, StepStatus
from tests.e2e.conftest import E2E, stack_on_version, upgrade

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with stack_on_version(tmp_path_factory.mktemp("stack-upgrade"), "1.1") as stack:
        yield stack


async def test_an_attempt_in_flight_on_1_1_finishes_on_1_1_after_the_upgrade(stack):
    async with E2E(stack) as e2e:
        old, new = e2e.orders(2)
        # The old order's payment is slow, so its 1.1 attempt is in flight
        # (charge-payment Running, its request with the agent) at the upgrade.
        await e2e.fault(
            kind="latency",
            service="payment",
            operation="charge",
            order_id=old.OrderID,
            seconds=4,
            count=1,
        )
        await e2e.post([old])
        await e2e.wait_for(
            lambda rs: (
                old.OrderID in rs
                and rs[old.OrderID].Steps["charge-payment"].Status is StepStatus.RUNNING
            ),
            what="the 1.1 attempt to be in flight",
        )

        await upgrade(stack)
        await e2e.post([new])

        ids = {old.OrderID, new.OrderID}
        records = await e2e.wait_terminal(ids, revive=False)
        assert {oid: r.ProcessState for oid, r in records.items()} == dict.fromkeys(
            ids, ProcessState.PROCESSED
        )
        # The attempt in flight finished the order: no retry by a 2.x attempt.
        assert records[old.OrderID].Attempt == 1
        assert records[old.OrderID].History[-1].By == f"{records[old.OrderID].id}:1"
        assert await e2e.check(ids) == []
        assert e2e.observed.replies[old.OrderID] == [
            "Received",
            "Processing",
            "StepCompleted",
            "StepCompleted",
            "StepCompleted",
            "Processed",
        ]
        assert e2e.observed.replies[new.OrderID] == ["Received", "Processed"]
