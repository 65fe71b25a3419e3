"""The recovery index's batched removals against the real Cosmos server
(issue 12): finished attempts' discards go as one transactional batch per
partition, an entry gone already does not keep the others, and the Supervisor
removes the entries it visits in one batch per partition too. One shard here
(a partition per minute, as the batches were first built); the sharded key:
test_sharded_index.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

from adapters.ports import IndexEntry
from adapters.recovery_index import (
    DISCARD_SPREAD,
    CosmosRecoveryIndex,
    ensure_index_container,
    entry_id,
    partition_of,
)
from supervisor.sources import IndexSource
from tests.builders import claim
from tests.integration.adapters.builders import NOW

pytestmark = pytest.mark.timeout(120)

MINUTE = NOW.replace(second=0, microsecond=0)


@pytest.fixture
async def index(cosmos_client, cosmos_database, request_charges):
    container = await ensure_index_container(cosmos_client, cosmos_database, "recoveryIndex")
    return container, CosmosRecoveryIndex(container, request_charges, discard_batch=5, shards=1)


async def _ids(container) -> list[str]:
    return sorted([d["id"] async for d in container.query_items("SELECT * FROM c")])


def _calls(index: CosmosRecoveryIndex, kind: str) -> int:
    stats = index.charges.by_kind.get(kind)
    return stats.calls if stats is not None else 0


async def test_discards_wait_for_a_batch_then_go_in_one_request(index):
    container, idx = index
    deadlines = {f"O{i}": MINUTE + timedelta(seconds=10 + i) for i in range(5)}
    for oid, at in deadlines.items():
        await idx.add(oid, at, 1)
    for oid in list(deadlines)[:4]:
        await idx.discard(oid, deadlines[oid])
    assert len(await _ids(container)) == 5  # waiting for a fifth discard
    assert _calls(idx, "index_remove_batch") == 0
    await idx.discard("O3", deadlines["O3"])  # a retried activity discards again
    assert await _ids(container) == [entry_id("O4", deadlines["O4"])]
    assert _calls(idx, "index_remove_batch") == 1
    assert _calls(idx, "index_remove") == 0  # the duplicate did not fail the batch


async def test_an_entry_gone_already_does_not_keep_the_others(index):
    container, idx = index
    deadlines = {f"G{i}": MINUTE + timedelta(seconds=20 + i) for i in range(5)}
    for oid, at in deadlines.items():
        await idx.add(oid, at, 1)
    # The Supervisor visited G2 first.
    await idx.remove(
        IndexEntry(
            entry_id("G2", deadlines["G2"]),
            partition_of(deadlines["G2"], "G2", 1),
            "G2",
            deadlines["G2"],
            1,
        )
    )
    for oid, at in deadlines.items():
        await idx.discard(oid, at)
    assert await _ids(container) == []


async def test_discards_spread_over_time_go_without_waiting_for_a_full_batch(index):
    container, idx = index
    first, later = MINUTE + timedelta(seconds=1), MINUTE + timedelta(seconds=1) + DISCARD_SPREAD
    await idx.add("S1", first, 1)
    await idx.add("S2", later, 1)
    await idx.discard("S1", first)
    assert len(await _ids(container)) == 2
    await idx.discard("S2", later)
    assert await _ids(container) == []


async def test_entries_of_buckets_go_in_a_batch_each(index):
    """Discards gather per partition: the first bucket's four go once four
    have gathered there; the second bucket's two wait, then go together."""
    container, idx = index
    idx._discard_batch = 4
    deadlines = [MINUTE + timedelta(seconds=52 + 2 * i) for i in range(6)]  # 4 + 2 in two buckets
    for i, at in enumerate(deadlines):
        await idx.add(f"B{i}", at, 1)
    for i, at in enumerate(deadlines):
        await idx.discard(f"B{i}", at)
    assert len(await _ids(container)) == 2
    assert _calls(idx, "index_remove_batch") == 1
    await idx.flush()
    assert await _ids(container) == []
    assert _calls(idx, "index_remove_batch") == 2


async def test_the_supervisor_removes_the_entries_it_visits_in_one_batch(index, state_store):
    """Entries of attempts that ended without discarding (a lost batch): one
    record read each, one batched removal for the bucket."""
    from domain import state_machine as sm
    from tests.integration.adapters.builders import POLICY, make_record

    container, idx = index
    for oid in ("E1", "E2", "E3"):
        record = make_record(oid, MINUTE)
        await state_store.create_if_absent(record)
        await idx.add(oid, MINUTE + POLICY.claim_timeout, 1)
        claimed = await claim(state_store, oid, MINUTE, POLICY)
        await state_store.update(
            oid,
            lambda r, by=claimed.LockedBy: sm.mark_failed(r, by, None, "x", MINUTE),
            claimed.LockedBy,
        )
    source = IndexSource(idx, state_store)
    candidates, _, read = await source.page(MINUTE + timedelta(minutes=5), 10, None)
    assert (candidates, read) == ([], 3)
    assert await _ids(container) == []
    assert _calls(idx, "index_remove_batch") == 1
    assert _calls(idx, "index_remove") == 0
