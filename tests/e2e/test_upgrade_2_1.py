"""The upgrades from workflow 2.0 (ADR 005) and from 2.1 (ADR 019a) to the
live version through the local host: an order whose attempt on the old
version is compensating when the host is replaced by one with the repo's
host.json (`defaultVersion: 2.2`) finishes its compensation on its own version
(its history says so, and that version's code is still registered: replaying
a 2.0 history with later code would wait on different undo deadlines, a 2.1
one would defer where 2.1 gave its verdict), while an order posted after the
upgrade runs the live version.

2.0, 2.1 and 2.2 send the same messages when every undo is answered in time,
so which version each instance ran is read from the local host's task hub
(the instance's version, as `context.version` gives it to the orchestrator)."""

from __future__ import annotations

import sqlite3

import pytest

from devstack.stack import Stack
from domain.models import ProcessState, StepStatus
from orchestrators.order_workflow import CURRENT_VERSION
from tests.e2e.conftest import E2E, stack_on_version, upgrade

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module", params=["2.0", "2.1"])
def stack(request, tmp_path_factory):
    old = request.param
    with stack_on_version(tmp_path_factory.mktemp(f"stack-upgrade-{old}"), old) as stack:
        stack.old_version = old  # type: ignore[attr-defined]
        yield stack


def instance_versions(stack: Stack, instance_ids: set[str]) -> dict[str, str | None]:
    """Each instance's orchestration version, read from the task hub file."""
    (hub,) = (stack.run_dir / "host").glob("*.sqlite")
    db = sqlite3.connect(f"{hub.as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute("SELECT instance_id, version FROM instances").fetchall()
    finally:
        db.close()
    return {iid: version for iid, version in rows if iid in instance_ids}


async def test_a_compensation_in_flight_finishes_on_its_version_after_the_upgrade(stack):
    async with E2E(stack) as e2e:
        old, new = e2e.orders(2)
        # The old order's payment is declined, so its attempt on the old version compensates;
        # the refund is slow, so the compensation is in flight at the upgrade.
        await e2e.decline_charge(old.OrderID)
        await e2e.fault(
            kind="latency",
            service="payment",
            operation="refund",
            order_id=old.OrderID,
            seconds=4,
            count=1,
        )
        await e2e.post([old])
        await e2e.wait_for(
            lambda rs: (
                old.OrderID in rs and rs[old.OrderID].ProcessState is ProcessState.COMPENSATING
            ),
            what="the old version's attempt to be compensating",
        )

        await upgrade(stack)
        await e2e.post([new])

        ids = {old.OrderID, new.OrderID}
        records = await e2e.wait_terminal(ids, revive=False)
        assert records[old.OrderID].ProcessState is ProcessState.COMPENSATED
        assert records[old.OrderID].Steps["reserve-inventory"].Status is StepStatus.COMPENSATED
        assert records[new.OrderID].ProcessState is ProcessState.PROCESSED
        # The attempt in flight finished the compensation: no second attempt.
        assert records[old.OrderID].Attempt == 1
        assert records[old.OrderID].History[-1].By == f"{records[old.OrderID].id}:1"
        assert await e2e.check(ids) == []
        assert e2e.observed.replies[old.OrderID][-1] == "Compensated"
        assert e2e.observed.replies[new.OrderID] == ["Received", "Processed"]
        first, later = (f"{records[o.OrderID].id}:1" for o in (old, new))
        assert instance_versions(stack, {first, later}) == {
            first: stack.old_version,
            later: CURRENT_VERSION,
        }
