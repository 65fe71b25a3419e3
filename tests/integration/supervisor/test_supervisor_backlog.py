"""A Supervisor run works through a backlog of expired attempts page after
page, within its page count and time budget, against the real Cosmos server
with both sources (the rig of test_supervisor.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from adapters.checkpoints import CosmosCheckpointStore
from reporting import Alerts, StatusReporter
from supervisor.sources import IndexSource, QuerySource
from supervisor.supervisor import Supervisor
from tests.builders import ReadClock
from tests.integration.adapters.builders import NOW, POLICY
from tests.integration.supervisor.test_supervisor import rig  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(180)

BACKLOG = 23


def supervisor(rig, page_size: int, max_pages: int, clock=None, budget=None):  # noqa: F811
    source = IndexSource(rig.index, rig.store) if rig.scan == "index" else QuerySource(rig.store)
    return Supervisor(
        rig.store,
        source,
        CosmosCheckpointStore(rig.state_container, rig.charges, "supervisor"),
        StatusReporter(rig.bus),
        Alerts(rig.bus),
        POLICY,
        page_size,
        clock=clock or ReadClock(lambda: rig.now),
        max_pages=max_pages,
        budget=budget,
    )


async def _backlog(rig) -> list[str]:  # noqa: F811
    ids = [f"B{i:02d}" for i in range(BACKLOG)]
    for i, oid in enumerate(ids):
        await rig.add_claimed(oid, NOW + timedelta(seconds=i))
    return ids


async def _recovered(rig, ids) -> int:  # noqa: F811
    return sum([(await rig.state(oid)).FailureCount for oid in ids])


async def test_one_run_recovers_a_backlog_larger_than_a_page(rig):  # noqa: F811
    ids = await _backlog(rig)

    report = await supervisor(rig, page_size=5, max_pages=20).run()

    assert report.recovered == BACKLOG
    assert await _recovered(rig, ids) == BACKLOG
    assert report.pages >= BACKLOG // 5  # page after page, each within its size
    assert report.pages <= 20


async def test_a_run_stops_at_its_page_count_and_the_next_resumes(rig):  # noqa: F811
    ids = await _backlog(rig)

    first = await supervisor(rig, page_size=5, max_pages=2).run()

    assert first.pages == 2
    assert first.recovered == 10
    assert first.read <= 2 * 5 * 2  # an index page reads entries, then their records
    second = await supervisor(rig, page_size=5, max_pages=20).run()
    assert first.recovered + second.recovered == BACKLOG
    assert await _recovered(rig, ids) == BACKLOG  # none twice, none skipped


async def test_a_run_starts_no_page_once_its_budget_is_spent(rig):  # noqa: F811
    ids = await _backlog(rig)
    reads = []

    def slow():  # the first page takes 10 s of the clock
        reads.append(None)
        return rig.now if len(reads) == 1 else rig.now + timedelta(seconds=10)

    spent = await supervisor(
        rig, page_size=5, max_pages=20, clock=ReadClock(slow), budget=timedelta(seconds=4)
    ).run()

    assert spent.pages == 1
    assert spent.recovered == 5
    assert await _recovered(rig, ids) == 5
    rest = await supervisor(rig, page_size=5, max_pages=20, budget=timedelta(seconds=60)).run()
    assert spent.recovered + rest.recovered == BACKLOG  # a clock that stands still: all
