"""The sharded recovery index against the real Cosmos server
(docs/adr/019b-sharded-recovery-index.md): the shard count fixed per
container and a change refused with nothing lost, entries written before the
shards (a rolling deploy into the same container) recovered, and the walk's
jump over an empty stretch with the server's own MIN query."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from adapters.checkpoints import CosmosCheckpointStore
from adapters.ports import bucket_of
from adapters.recovery_index import (
    SHARDS_DOCUMENT,
    CosmosRecoveryIndex,
    ensure_index_container,
    ensure_shard_count,
    entry_id,
)
from adapters.settings import SettingsError
from domain.models import ProcessState
from reporting import Alerts, StatusReporter
from supervisor.sources import IndexSource, checkpoint_name
from supervisor.supervisor import Supervisor
from tests.builders import ReadClock, claim
from tests.fakes import RecordingPublisher
from tests.integration.adapters.builders import NOW, POLICY, make_record
from tests.integration.app_env import app_env  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def container(cosmos_client, cosmos_database):
    return await ensure_index_container(cosmos_client, cosmos_database, "recoveryIndex")


def supervisor(store, state_container, index, charges, now, page_size=3):
    bus = RecordingPublisher()
    return Supervisor(
        store,
        IndexSource(index, store),
        CosmosCheckpointStore(state_container, charges, checkpoint_name("index")),
        StatusReporter(bus),
        Alerts(bus),
        POLICY,
        page_size,
        clock=ReadClock(lambda: now),
        max_pages=20,
    )


async def claimed(store, index, oid: str, at=NOW) -> None:
    await store.create_if_absent(make_record(oid, at))
    await index.add(oid, at + POLICY.claim_timeout, 1)
    assert await claim(store, oid, at, POLICY) is not None


async def test_the_first_process_records_the_count_and_a_different_one_is_refused(container):
    # Two processes starting at once with the same count: both go on.
    await asyncio.gather(ensure_shard_count(container, 8), ensure_shard_count(container, 8))
    doc = await container.read_item(SHARDS_DOCUMENT["id"], partition_key=SHARDS_DOCUMENT["bucket"])
    assert doc["shards"] == 8
    await ensure_shard_count(container, 8)  # a restart
    with pytest.raises(SettingsError, match=r"RECOVERY_INDEX_SHARDS is 16.*set up with 8 shards"):
        await ensure_shard_count(container, 16)
    with pytest.raises(SettingsError, match="RECOVERY_INDEX_SHARDS must be 1 to 999"):
        await ensure_shard_count(container, 0)


async def test_a_refused_change_loses_no_entry(
    container, state_store, state_container, request_charges
):
    """Entries written under 4 shards; a process configured for 8 is refused
    before it writes or reads one, and the Supervisor of the recorded count
    recovers them all."""
    await ensure_shard_count(container, 4)
    index = CosmosRecoveryIndex(container, request_charges, shards=4)
    oids = [f"C{i}" for i in range(12)]
    for oid in oids:
        await claimed(state_store, index, oid)
    with pytest.raises(SettingsError):
        await ensure_shard_count(container, 8)
    sup = supervisor(
        state_store, state_container, index, request_charges, NOW + timedelta(minutes=5)
    )
    report = await sup.run()
    assert report.recovered == len(oids)
    for oid in oids:
        assert (await state_store.read(oid))[0].ProcessState is ProcessState.PENDING
    # Only the shard-count document is left.
    docs = [d async for d in container.query_items("SELECT * FROM c")]
    assert [d["id"] for d in docs] == [SHARDS_DOCUMENT["id"]]


async def test_entries_of_the_version_before_the_shards_are_recovered(
    container, state_store, state_container, request_charges
):
    """A rolling deploy into the container the previous version used: it wrote
    (and until its last host stops, still writes) entries under the bare
    minute. The sharded Supervisor reads each minute's bare partition too."""
    await ensure_shard_count(container, 16)
    index = CosmosRecoveryIndex(container, request_charges, shards=16)
    for oid in ("OLD-1", "OLD-2"):
        await state_store.create_if_absent(make_record(oid, NOW))
        deadline = NOW + POLICY.claim_timeout
        # exactly what the version before the shards wrote
        await container.upsert_item(
            {
                "id": entry_id(oid, deadline),
                "bucket": bucket_of(deadline),
                "OrderID": oid,
                "CompleteBy": deadline.isoformat(),
                "Attempt": 1,
            }
        )
        assert await claim(state_store, oid, NOW, POLICY) is not None
    for oid in ("NEW-1", "NEW-2", "NEW-3"):
        await claimed(state_store, index, oid)
    partitions = {d["bucket"] async for d in container.query_items("SELECT * FROM c")}
    assert bucket_of(NOW + POLICY.claim_timeout) in partitions  # the old key
    assert any("|" in p for p in partitions)  # and the new
    sup = supervisor(
        state_store, state_container, index, request_charges, NOW + timedelta(minutes=5)
    )
    report = await sup.run()
    assert report.recovered == 5
    for oid in ("OLD-1", "OLD-2", "NEW-1", "NEW-2", "NEW-3"):
        assert (await state_store.read(oid))[0].ProcessState is ProcessState.PENDING


async def test_an_empty_stretch_is_crossed_in_one_run(
    container, state_store, state_container, request_charges
):
    """Entries 40 minutes apart: 680 partitions with 16 shards, more than five
    pages of MAX_BUCKETS_PER_PAGE queries, each of which would end the run (a
    page that recovered nothing). The walk's MIN query on the server jumps
    the empty stretch: one run recovers both."""
    index = CosmosRecoveryIndex(container, request_charges, shards=16)
    await claimed(state_store, index, "EARLY", NOW)
    await claimed(state_store, index, "LATE", NOW + timedelta(minutes=40))
    sup = supervisor(
        state_store, state_container, index, request_charges, NOW + timedelta(minutes=45)
    )
    report = await sup.run()
    assert report.recovered == 2


async def test_the_app_refuses_to_start_with_another_count(app_env):  # noqa: F811
    """bootstrap: the first build records the count; after a restart with
    another RECOVERY_INDEX_SHARDS every function's container build fails
    with the reason, before an entry is written or read."""
    import bootstrap

    root = bootstrap.build()  # settings from the environment, read by each build
    app_env(SUPERVISOR_SCAN="index", RECOVERY_INDEX_SHARDS="4")
    try:
        c = await root.container()
        assert c.settings.recovery_index_shards == 4
        sup = await root.supervisor()
        assert (await sup.run()).read == 0
        await root.close()
        app_env(SUPERVISOR_SCAN="index", RECOVERY_INDEX_SHARDS="8")
        with pytest.raises(SettingsError, match="set up with 4 shards"):
            await root.container()
    finally:
        await root.close()
