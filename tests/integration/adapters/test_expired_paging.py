"""The Supervisor's scan of expired records: bounded pages, resumable from a
saved continuation token in another process, exact (nothing seen twice or
missed), also while the scanned records are being recovered."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from adapters.state_store import CosmosStateStore
from devstack.cosmos import CosmosServer
from domain import state_machine as sm
from domain.models import OrderState
from tests.fixtures.cosmos import STATE_CONTAINER
from tests.integration.adapters.builders import NOW, POLICY, make_record, processing_record

ROOT = Path(__file__).resolve().parents[3]
SCAN_NOW = NOW + timedelta(hours=2)
WINDOW_START = NOW - timedelta(hours=1)


async def create_all(store: CosmosStateStore, records: list[OrderState], limit: int = 32) -> None:
    gate = asyncio.Semaphore(limit)

    async def create(record: OrderState) -> None:
        async with gate:
            _, _, created = await store.create_if_absent(record)
            assert created

    await asyncio.gather(*(create(r) for r in records))


def expired_records(count: int) -> list[OrderState]:
    # Four records share each deadline, so paging must break ties (by id).
    return [
        processing_record(f"EXP-{i:04d}", NOW + timedelta(seconds=i // 4, microseconds=i % 3))
        for i in range(count)
    ]


def not_in_scan() -> list[OrderState]:
    return [
        processing_record("OUT-TOO-OLD", WINDOW_START - timedelta(microseconds=1)),
        processing_record("OUT-NOT-YET", SCAN_NOW),  # CompleteBy < now is strict
        processing_record("OUT-LATER", SCAN_NOW + timedelta(minutes=5)),
        make_record("OUT-PENDING"),
        sm.mark_processed(
            sm.claim(make_record("OUT-DONE"), NOW, POLICY).model_copy(
                update={"Steps": {}, "CompleteBy": NOW}
            ),
            "OUT-DONE:1",
            NOW,
        ),
    ]


def sort_key(record: OrderState) -> tuple:
    return (record.CompleteBy, record.id)


async def test_a_thousand_expired_records_page_across_processes_exactly_once(
    state_store: CosmosStateStore, cosmos_server: CosmosServer, cosmos_database: str
) -> None:
    records = expired_records(1000)
    await create_all(state_store, records + not_in_scan())
    page_size = 137

    # This process: three pages, then it "dies" holding only the token.
    state_store.charges.by_kind.clear()
    seen: list[list[str]] = []
    token = None
    for _ in range(3):
        page, token = await state_store.query_expired(SCAN_NOW, WINDOW_START, page_size, token)
        seen.append([record.id for record, _etag in page])
    assert token is not None
    # Each page is one bounded query (invariant 6).
    assert state_store.charges.by_kind["query_expired"].calls == 3

    # A fresh process resumes from the saved token.
    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.adapters.resume_scan",
            "--endpoint",
            cosmos_server.endpoint,
            "--key",
            cosmos_server.key,
            "--database",
            cosmos_database,
            "--container",
            STATE_CONTAINER,
            "--now",
            SCAN_NOW.isoformat(),
            "--window-start",
            WINDOW_START.isoformat(),
            "--page-size",
            str(page_size),
            "--token",
            token,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    seen += json.loads(resumed.stdout)["pages"]

    assert all(len(page) <= page_size for page in seen)
    assert [len(page) for page in seen[:-1]] == [page_size] * (len(seen) - 1)
    flat = [order_id for page in seen for order_id in page]
    expected = [r.id for r in sorted(records, key=sort_key)]
    assert flat == expected  # every expired record once, oldest deadline first


async def test_paging_stays_exact_while_the_scanned_records_are_recovered(
    state_store: CosmosStateStore,
) -> None:
    records = expired_records(120)
    await create_all(state_store, records)
    seen: list[str] = []
    token = None
    while True:
        page, token = await state_store.query_expired(SCAN_NOW, WINDOW_START, 25, token)
        for record, _etag in page:
            seen.append(record.id)
            # What the Supervisor does: the record leaves the result set.
            await state_store.update(
                record.id,
                lambda r, lock=record.LockedBy: sm.recover_expired(r, lock, SCAN_NOW, POLICY),
                record.LockedBy,
            )
        if token is None:
            break
    assert seen == [r.id for r in sorted(records, key=sort_key)]
    page, token = await state_store.query_expired(SCAN_NOW, WINDOW_START, 25)
    assert page == []
    assert token is None
