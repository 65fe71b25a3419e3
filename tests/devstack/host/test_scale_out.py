"""Scale-out: two host processes on one task hub share the work, as Functions instances do.

Each host claims an orchestration instance (one episode at a time) or an activity work
item through the hub's leased locks; the timer singleton is covered in test_timers.
Here: work started through both hosts is done by both, every activity runs once and
every instance completes once, and a host that stops leaves its share to the other.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from typing import Any

import pytest

from .conftest import wait_for, wait_status

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def _history_checks(host: Any, status: Any) -> None:
    """One end, and one scheduling of the activity, in the hub's own history of the instance."""
    kinds = [e["EventType"] for e in status.historyEvents]
    assert kinds.count("ExecutionCompleted") == 1, status.instance_id
    with sqlite3.connect(host.data_dir / f"{host.hub}.sqlite") as db:
        events = [
            json.loads(e)
            for (e,) in db.execute(
                "SELECT event FROM history WHERE instance_id=? ORDER BY seq", (status.instance_id,)
            )
        ]
    scheduled = [e["Name"] for e in events if e["EventType"] == 4]  # TaskScheduled
    assert scheduled == ["double"], (status.instance_id, scheduled)
    ids = [e["EventId"] for e in events if e["EventType"] in (4, 10)]  # TaskScheduled, TimerCreated
    assert len(ids) == len(set(ids)), (status.instance_id, ids)


async def test_two_hosts_share_orchestrations_and_activities_without_running_any_twice(
    host_factory: Any,
) -> None:
    a = host_factory()
    b = host_factory()  # same data dir: the same task hub file
    ids = [f"shared-{i:02d}" for i in range(30)]
    for i, iid in enumerate(ids):
        # Started through either host, as triggers arrive at either Functions instance.
        client = (a if i % 2 else b).client
        await client.start_new("race", iid, {"x": i, "sleep": 0.2, "timeout": 1})

    outputs = {}
    for iid in ids:
        s = await wait_status(a.client, iid, "Completed", "Failed", timeout=90)
        outputs[iid] = s.output
        _history_checks(a, s)
    assert outputs == {
        f"shared-{i:02d}": {"doubled": 2 * i, "timeout": True, "version": "2.0"} for i in range(30)
    }

    started = a.events("double_started")
    runs = Counter(e["instance"] for e in started)
    assert runs == Counter({iid: 1 for iid in ids}), "an activity ran twice or not at all"
    by_host = Counter(e["pid"] for e in started)
    assert set(by_host) == {a.proc.pid, b.proc.pid}, f"one host did every activity: {by_host}"


async def test_a_stopped_host_leaves_its_share_to_the_other(host_factory: Any) -> None:
    a = host_factory()
    b = host_factory()
    ids = [f"handover-{i:02d}" for i in range(10)]
    for i, iid in enumerate(ids):
        # A long durable timer keeps every instance waiting, whichever host ran it.
        await (a if i % 2 else b).client.start_new("race", iid, {"x": i, "timeout": 4})
    for iid in ids:
        await wait_for(lambda iid=iid: _stage(a, iid, "waiting"), timeout=60, what=f"{iid} waiting")
    b.stop()
    for iid in ids:
        s = await wait_status(a.client, iid, "Completed", "Failed", timeout=60)
        assert s.output == {"doubled": 2 * int(iid[-2:]), "timeout": True, "version": "2.0"}
        _history_checks(a, s)
    assert Counter(e["instance"] for e in a.events("double_started")) == Counter(
        {iid: 1 for iid in ids}
    )


async def _stage(host: Any, iid: str, stage: str) -> bool:
    s = await host.client.get_status(iid)
    return bool(s) and (s.custom_status or {}).get("stage") == stage
