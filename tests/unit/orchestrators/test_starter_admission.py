"""MAX_PROCESSING and the admission limit under it hold on every host (issue 43):
the timer Starter and every host's fast path take their slots from one
document by conditional writes (domain.admission), so claims never exceed the
limit, whichever host claims and however many."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from domain import state_machine as sm
from domain.admission import Admission, Lease
from domain.models import OrderSubmitted, ProcessState
from orchestrators.policy import StarterPolicy
from orchestrators.starter import Starter
from tests.builders import ReadClock, order_payload
from tests.unit.orchestrators.driver import SETTINGS, STEPS, StartingClient, World


def _host(world: World, max_processing: int) -> Starter:
    """One host's Starter (each process builds its own), on the shared store."""
    policy = StarterPolicy.from_settings(
        replace(SETTINGS, max_processing=max_processing, starter_batch_size=4), STEPS
    )
    return Starter(policy, world.store, clock=ReadClock(lambda: world.now))


async def _submit(world: World, order_id: str):
    order = OrderSubmitted.model_validate(order_payload(OrderID=order_id))
    record, etag, _ = await world.store.create_if_absent(sm.new_record(order, world.now, STEPS))
    return record, etag, order


async def _processing(world: World) -> int:
    return await world.store.count_in_state(ProcessState.PROCESSING)


async def test_fast_paths_on_hosts_whose_timer_never_ran_stay_under_the_cap():
    # The timer runs on one host; a fast path elsewhere knew no count at all
    # and claimed every order it was given (the gauge showed 558 over a cap of 500).
    world = World()
    world.store.admission = (
        Admission(limit=100, counted=0, counted_at=world.now - timedelta(seconds=5)),
        '"a"',
    )
    hosts = [_host(world, max_processing=10) for _ in range(3)]
    await hosts[0].run(StartingClient())  # the timer's host counts: nothing yet
    started = []
    for i in range(30):
        record, etag, order = await _submit(world, f"F{i:02d}")
        started.append(await hosts[i % 3].start_submitted(StartingClient(), record, etag, order))

    assert sum(1 for s in started if s is not None) == 10
    assert await _processing(world) == 10
    report = await hosts[0].run(StartingClient())  # the timer finds no room either
    assert report.claimed == 0
    assert await _processing(world) == 10


async def test_the_timer_claims_no_more_than_the_limit_the_completions_allow():
    # 60 in flight at the last count, 100 claimed since and 100 in flight now:
    # 60 finished in 30 s, 2/s. An attempt (3 steps x 60 s) should take 90 s in
    # flight, so 180 at most, though the cap allows 500.
    world = World()
    starter = _host(world, max_processing=500)
    starter._settings = replace(starter._settings, starter_max_batches=100)
    for i in range(400):
        record, etag, _ = await _submit(world, f"P{i:03d}")
        if i < 100:
            await starter.claim_and_start(StartingClient(), record, etag, world.now)
    world.store.admission = (
        Admission(
            limit=250,
            counted=60,
            counted_at=world.now - timedelta(seconds=30),
            rate=2.0,
            leases=(Lease(world.now - timedelta(seconds=20), 100),),
        ),
        '"a"',
    )

    report = await starter.run(StartingClient())

    assert world.store.admission[0].limit == 180
    assert report.claimed == 80
    assert await _processing(world) == 180


def _held_admission_writes(world):
    """A host under a limit of 100 whose admission writes wait for the event
    it returns: a block being taken, held open."""
    world.store.admission = (
        Admission(limit=100, counted=0, counted_at=world.now - timedelta(seconds=5)),
        '"a"',
    )
    release = asyncio.Event()
    write = world.store.write_admission

    async def held_write(state, etag):
        await release.wait()
        return await write(state, etag)

    world.store.write_admission = held_write
    return _host(world, max_processing=100), release


async def test_fast_paths_of_one_process_take_one_block_at_a_time():
    # Each fast path taking a block of its own while another's write was out
    # left most slots unused: counted as claims, and as completions by the rate.
    world = World()
    host, release = _held_admission_writes(world)
    orders = [await _submit(world, f"S{i}") for i in range(5)]
    first = asyncio.create_task(host.start_submitted(StartingClient(), *orders[0]))
    await asyncio.sleep(0)
    # Others arriving while the first one's write is out wait for its block
    # (an order left to the timer costs a read of it and a write of Submit's).
    others = [asyncio.create_task(host.start_submitted(StartingClient(), *o)) for o in orders[1:3]]
    await asyncio.sleep(0.1)
    assert not any(t.done() for t in others)
    release.set()
    await asyncio.gather(first, *others)
    after = [await host.start_submitted(StartingClient(), *o) for o in orders[3:]]

    assert first.result() is not None
    assert all(t.result() is not None for t in others)  # from that block, none of their own
    assert all(a is not None for a in after)  # from the one block
    assert len(world.store.admission[0].leases) == 1


async def test_a_fast_path_waits_for_another_block_taking_a_bounded_time():
    world = World()
    host, release = _held_admission_writes(world)
    first_order, second_order = [await _submit(world, f"W{i}") for i in range(2)]
    first = asyncio.create_task(host.start_submitted(StartingClient(), *first_order))
    await asyncio.sleep(0)
    # The first one's write hangs: the second leaves its order to the timer.
    assert await host.start_submitted(StartingClient(), *second_order) is None
    release.set()
    assert await first is not None


async def test_the_rate_counts_the_timers_claims_as_claims_since_its_count():
    # The timer's slots were dated at its run's start, before the count of the
    # same run began: the next count left them out, saw too few completions,
    # and held the limit at the floor while the service was busy.
    world = World()
    ticks = iter(range(100_000))
    clock = ReadClock(lambda: world.now + timedelta(milliseconds=100 * next(ticks)))
    policy = StarterPolicy.from_settings(
        replace(SETTINGS, max_processing=500, starter_batch_size=40, starter_max_batches=1), STEPS
    )
    starter = Starter(policy, world.store, clock=clock)
    for i in range(40):
        await _submit(world, f"R{i:02d}")
    await starter.run(StartingClient())  # counts, then claims its 40
    for i in range(20):  # 20 of them finish
        record, etag = await world.store.read(f"webshop:R{i:02d}")
        await world.store.replace(
            record.model_copy(update={"ProcessState": ProcessState.PROCESSED}), etag
        )
    world.now += timedelta(seconds=10)

    await starter.run(StartingClient())

    assert world.store.admission[0].rate == pytest.approx(2.0, rel=0.05)  # 20 in 10 s
