"""The Starter's backlog counts at most once per `count_interval` (issue 44
item 4): the COUNTs, whose cost grows with the entries they match, and the
compensation scans run on the first run and then once an interval; the runs
between them still claim, against the cap with the last Processing count
raised by what this process claimed since."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from domain import state_machine as sm
from domain.models import OrderSubmitted, ProcessState
from orchestrators.starter import Starter
from tests.builders import ReadClock, order_payload
from tests.unit.orchestrators.driver import SETTINGS, STEPS, World


class Client:
    def __init__(self) -> None:
        self.started: list[str] = []

    async def start_new(self, name, instance_id, data):
        self.started.append(instance_id)

    async def get_status(self, instance_id):
        return None


def _counting(world: World) -> list[str]:
    """Record every COUNT and compensation scan the store is asked for."""
    calls: list[str] = []
    store = world.store
    for name in ("count_in_state", "query_compensation_requests", "query_in_state_after"):
        real = getattr(store, name)

        async def wrapped(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return await _real(*args, **kwargs)

        setattr(store, name, wrapped)
    return calls


async def _pending(world: World, order_id: str) -> None:
    order = OrderSubmitted.model_validate(order_payload(OrderID=order_id))
    await world.store.create_if_absent(sm.new_record(order, world.now, STEPS))


async def test_without_an_interval_every_run_counts():
    world = World()
    calls = _counting(world)
    starter = Starter(SETTINGS, world.store, clock=ReadClock(lambda: world.now))
    for _ in range(3):
        report = await starter.run(Client())
        assert report.counted
    assert calls.count("count_in_state") == 6
    assert calls.count("query_compensation_requests") == 3


async def test_with_an_interval_the_runs_between_counts_still_claim():
    world = World()
    calls = _counting(world)
    starter = Starter(
        SETTINGS,
        world.store,
        clock=ReadClock(lambda: world.now),
        count_interval=timedelta(seconds=30),
    )
    client = Client()
    first = await starter.run(client)
    assert first.counted
    assert first.pending == 0
    assert calls.count("count_in_state") == 2
    # An order the fast path missed arrives after the count: the next run,
    # which does not count, still queries and claims it.
    world.now += timedelta(seconds=5)
    await _pending(world, "A1")
    second = await starter.run(client)
    assert not second.counted
    assert second.claimed == 1
    assert client.started == ["webshop:A1:1"]
    assert calls.count("count_in_state") == 2
    assert calls.count("query_compensation_requests") == 1
    # Past the interval the run counts again (and sees the claimed order).
    world.now += timedelta(seconds=30)
    third = await starter.run(client)
    assert third.counted
    assert third.processing == 1
    assert calls.count("count_in_state") == 4
    assert calls.count("query_compensation_requests") == 2


async def test_between_counts_the_cap_counts_this_process_claims():
    """At MAX_PROCESSING = 1, a run between counts that claimed one order
    leaves the next such run no room, though no COUNT said so."""
    world = World()
    starter = Starter(
        replace(SETTINGS, max_processing=1),
        world.store,
        clock=ReadClock(lambda: world.now),
        count_interval=timedelta(seconds=30),
    )
    client = Client()
    await starter.run(client)  # counts: nothing yet
    await _pending(world, "A1")
    await _pending(world, "B1")
    world.now += timedelta(seconds=5)
    second = await starter.run(client)
    assert (second.counted, second.claimed) == (False, 1)
    world.now += timedelta(seconds=5)
    third = await starter.run(client)
    assert (third.counted, third.processing, third.claimed) == (False, 1, 0)
    states = {r.ProcessState for r in [await world.record("A1"), await world.record("B1")]}
    assert states == {ProcessState.PROCESSING, ProcessState.PENDING}
