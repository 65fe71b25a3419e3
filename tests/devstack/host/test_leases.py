"""Host leases on the task hub: a stale heartbeat frees a host's work for *other* hosts
only; a host never claims a row its own process holds (issue 47: a restarted host whose
heartbeat stalled claimed its running activity on every poll and ran it ten times)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from devstack.host.store import Store

from .conftest import wait_for

LEASE_S = 0.3


def _hub(tmp_path: Path, host_id: str) -> Store:
    return Store(str(tmp_path / "hub.sqlite"), host_id, LEASE_S)


def _schedule_activity(store: Store) -> None:
    with store.tx() as db:
        db.execute(
            "INSERT INTO activities(instance_id, execution_id, task_id, name, input) "
            "VALUES('i1', 'e1', 0, 'double', '1')"
        )


def _schedule_instance(store: Store, iid: str) -> None:
    store.create_or_restart_instance(
        instance_id=iid,
        name="race",
        version=None,
        execution_id="e1",
        input_json=None,
        started_event={"EventType": 0},
        now_iso="2026-01-01T00:00:00Z",
        now_epoch=0.0,
    )


def test_a_stale_heartbeat_does_not_give_a_host_its_own_activity_again(tmp_path: Path) -> None:
    a, b = _hub(tmp_path, "host-a"), _hub(tmp_path, "host-b")
    a.heartbeat()
    _schedule_activity(a)
    assert [r["name"] for r in a.claim_activities(10)] == ["double"]
    time.sleep(LEASE_S * 2)  # host-a writes no heartbeat: its lease has lapsed
    assert a.claim_activities(10) == []  # ... but it still holds the row itself
    b.heartbeat()
    taken = b.claim_activities(10)  # another host takes the lapsed lock over, as designed
    assert [(r["name"], r["dequeue_count"]) for r in taken] == [("double", 1)]
    assert b.claim_activities(10) == []


def test_a_stale_heartbeat_does_not_give_a_host_its_own_instance_or_entity(
    tmp_path: Path,
) -> None:
    a, b = _hub(tmp_path, "host-a"), _hub(tmp_path, "host-b")
    a.heartbeat()
    _schedule_instance(a, "i1")
    a.enqueue_entity_op(entity_id="@counter@k", operation="add", input_json="1")
    assert a.claim_instances(1.0, 10, set()) == ["i1"]
    assert a.claim_entities(10, set()) == ["@counter@k"]
    time.sleep(LEASE_S * 2)
    assert a.claim_instances(1.0, 10, set()) == []
    assert a.claim_entities(10, set()) == []
    b.heartbeat()
    assert b.claim_instances(1.0, 10, set()) == ["i1"]
    assert b.claim_entities(10, set()) == ["@counter@k"]


def test_a_stalled_heartbeat_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a = _hub(tmp_path, "host-a")
    caplog.set_level(logging.WARNING, logger="devstack.host.store")
    a.stall_heartbeat(LEASE_S * 3)
    stop = a.start_heartbeats(0.05)
    try:
        deadline = time.monotonic() + 5
        while "stalled" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop()
    assert "heartbeat of host host-a stalled for" in caplog.text
    assert "other hosts may have taken its work over" in caplog.text


@pytest.mark.integration
@pytest.mark.e2e
async def test_a_host_whose_heartbeat_stalls_runs_its_activity_once(host_factory: Any) -> None:
    """The real host (lease 2 s): its heartbeat stalls for 5 s while a 6 s activity runs."""
    host = host_factory()
    await host.client.start_new("race", "slow", {"x": 4, "sleep": 6})
    await wait_for(lambda: host.events("double_started", instance="slow"), what="the activity")
    host.post("/admin/heartbeat/stall", {"seconds": 5})
    await wait_for(
        lambda: "stalled for" in host.log_tail(200), timeout=20, what="the stall in the host log"
    )
    s = await wait_for(_stage(host, "slow", "waiting"), timeout=30, what="slow past its activity")
    assert s.custom_status == {"stage": "waiting"}
    await asyncio.sleep(1)  # a second run would have started by now (the poll is 0.25 s)
    assert len(host.events("double_started", instance="slow")) == 1
    assert "lock was lost" not in host.log_tail(200)


def _stage(host: Any, iid: str, stage: str) -> Any:
    async def check() -> Any:
        s = await host.client.get_status(iid)
        return s if s and (s.custom_status or {}).get("stage") == stage else None

    return check
