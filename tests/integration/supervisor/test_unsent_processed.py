"""The Processed status out of the outbox with the recovery index (ADR 021k),
on the real Cosmos server: the finishing write carries no outbox entry, the
attempt's index entry marks the status maybe unsent until the activity has
sent it and discarded the entry, and whatever is left behind (a process
killed after the write, a refused send) ends in the outbox, from which the
Starter's sweep sends it under the one Processed id."""

from __future__ import annotations

from datetime import timedelta

import pytest

from adapters.checkpoints import CosmosCheckpointStore
from adapters.cosmos_client import RequestCharges
from adapters.recovery_index import CosmosRecoveryIndex, ensure_index_container
from domain.errors import StatusNotSent
from orchestrators.contracts import FinishAll
from reporting import Alerts, StatusOutbox, StatusReporter
from supervisor.sources import IndexSource
from supervisor.supervisor import Supervisor
from tests.builders import ReadClock
from tests.integration.adapters.builders import POLICY
from tests.unit.orchestrators.driver import STEPS, World

pytestmark = pytest.mark.timeout(120)

KEY = "webshop:A1"
PROCESSED_ID = "A1/status/Processed"


class _Killed(BaseException):
    """The activity's process killed between the write and the send."""


@pytest.fixture
async def world(state_store, state_container, orders_repository, cosmos_client, cosmos_database):
    container = await ensure_index_container(cosmos_client, cosmos_database, "recoveryIndex")
    wakes: list = []
    index = CosmosRecoveryIndex(container, wake=lambda delay, fn: wakes.append(fn))
    w = World(store=state_store, orders=orders_repository, index=index)
    w.index_container, w.wakes, w.state_container = container, wakes, state_container
    return w


async def _finish(world) -> FinishAll:
    iid = await world.claimed()
    deadline = world.inputs[iid]["Deadline"]
    return FinishAll(InstanceId=iid, Done={s: f"r-{s}" for s in STEPS}, IndexedAt=deadline)


async def _entries(world) -> list[dict]:
    docs = [d async for d in world.index_container.query_items("SELECT * FROM c")]
    return [d for d in docs if d.get("OrderID") == KEY]


def _supervisor(world, at) -> Supervisor:
    return Supervisor(
        world.store,
        IndexSource(world.index, world.store),
        CosmosCheckpointStore(world.state_container, RequestCharges(), "supervisor-index-sharded"),
        StatusReporter(world.bus),
        Alerts(world.bus),
        POLICY,
        10,
        clock=ReadClock(lambda: at),
    )


async def test_the_happy_path_writes_no_outbox_entry_and_retires_its_entry(world):
    acts = world.activities()
    finish = await _finish(world)
    assert len(await _entries(world)) == 1
    assert not (await acts.finish_attempt(finish)).Stale
    record, _ = await world.store.read(KEY)
    assert record.PendingStatus is None
    assert [mid for _, mid in world.sent("replies-webshop")] == [PROCESSED_ID]
    for flush in world.wakes:  # the discard waiting in the process goes DISCARD_SPREAD on
        await flush()
    assert await _entries(world) == []


async def test_a_rerun_after_a_kill_between_write_and_send_sends_the_same_id(world):
    acts = world.activities()
    finish = await _finish(world)
    world.bus.fail_next = _Killed()
    with pytest.raises(_Killed):
        await acts.finish_attempt(finish)
    record, _ = await world.store.read(KEY)
    assert (record.ProcessState.value, record.PendingStatus) == ("Processed", None)
    assert len(await _entries(world)) == 1
    world.now += timedelta(seconds=5)
    assert not (await acts.finish_attempt(finish)).Stale
    assert [mid for q, _, mid, _ in world.bus.sends if q == "replies-webshop"] == [PROCESSED_ID]
    assert (await world.store.read(KEY))[0].PendingStatus is None


async def test_a_refused_send_parks_the_status_for_the_starters_sweep(world):
    acts = world.activities()
    finish = await _finish(world)
    world.bus.fail_next = ConnectionError("reply queue refused")
    assert not (await acts.finish_attempt(finish)).Stale
    record, etag = await world.store.read(KEY)
    assert record.PendingStatus is not None
    assert record.PendingStatus.MessageId == PROCESSED_ID
    assert (await StatusOutbox(world.store, StatusReporter(world.bus)).deliver(record, etag)).done
    assert [mid for _, mid in world.sent("replies-webshop")] == [PROCESSED_ID]
    assert (await world.store.read(KEY))[0].PendingStatus is None


async def test_the_supervisor_parks_the_status_of_an_attempt_killed_before_its_send(world):
    acts = world.activities()
    finish = await _finish(world)
    world.bus.fail_next = _Killed()
    with pytest.raises(_Killed):
        await acts.finish_attempt(finish)  # and Durable never ran it again
    due = finish.IndexedAt + timedelta(minutes=1)
    report = await _supervisor(world, due).run()
    assert report.recovered == 0
    assert await _entries(world) == []
    record, etag = await world.store.read(KEY)
    assert record.ProcessState.value == "Processed"
    assert record.PendingStatus is not None
    assert record.PendingStatus.MessageId == PROCESSED_ID
    assert record.PendingStatus.At == record.History[-1].At
    assert (await StatusOutbox(world.store, StatusReporter(world.bus)).deliver(record, etag)).done
    assert [mid for _, mid in world.sent("replies-webshop")] == [PROCESSED_ID]


async def test_a_park_read_from_a_lagging_version_is_not_taken_for_parked(world):
    """Simulation seed 388: the reply queue refused Processed and the park's
    read returned a version from before the claim (unlocked, not Processed),
    on which parking changes nothing and writes nothing. That is no park: the
    activity raises for Durable to run it again, and the entry stays."""
    await world.submitted()
    before = await world.store.read(KEY)
    acts = world.activities()
    finish = await _finish(world)
    real_read, lagging = world.store.read, {"left": 0}

    async def read(order_id):
        if lagging["left"]:
            lagging["left"] -= 1
            return before
        return await real_read(order_id)

    world.store.read = read

    async def refused(*args, **kwargs):
        lagging["left"] = 1  # the park's read comes next
        raise ConnectionError("reply queue refused")

    world.bus.send = refused
    with pytest.raises(StatusNotSent):
        await acts.finish_attempt(finish)
    assert (await world.store.read(KEY))[0].PendingStatus is None
    assert len(await _entries(world)) == 1
