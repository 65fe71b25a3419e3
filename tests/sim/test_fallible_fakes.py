"""The fallible world's fakes (issue 21) under the product's real adapters:
each fault is raised as the SDK raises it, so the adapters' own
classification turns it into the domain's error, and a fault "after the
effect" leaves the effect in place. If a fake raised something the SDK never
raises, or lost an effect it claims to have applied, the simulation's verdicts
on these faults could not be trusted."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.exceptions import AzureError
from azure.servicebus.exceptions import (
    MessageLockLostError,
    OperationTimeoutError,
    ServiceBusConnectionError,
)

from adapters.checkpoints import CosmosCheckpointStore
from adapters.cosmos_client import RequestCharges, ensure_state_container
from adapters.orders_db import CosmosOrdersRepository
from adapters.state_store import CosmosStateStore
from agents.ports import RemoteCall
from domain import state_machine as sm
from domain.errors import TransientError
from domain.models import OrderSubmitted
from sim.bus import Bus, Delivery, SimActions, SimServiceBusClient, publisher
from sim.cosmos import SimContainer, SimCosmosClient
from sim.remote import SimRemote, http_remote
from sim.world import Fault, FaultConfig, World
from tests.builders import order_payload

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def _run(coro):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def _world(**faults) -> World:
    return World(1, FaultConfig(**faults))


def _order(oid: str) -> OrderSubmitted:
    return OrderSubmitted.model_validate(order_payload(oid))


def test_a_cosmos_write_whose_answer_is_lost_is_applied_and_transient_to_the_store():
    world = _world(cosmos_lost=1.0)
    container = SimContainer(world, "state", "/id")
    store = CosmosStateStore(container)

    async def go():
        # Each variant of the lost answer (a reset, the client's timeout, a 408).
        for i in range(3):
            with pytest.raises(TransientError):
                await store.create_if_absent(sm.new_record(_order(f"A{i}"), T0, [], key=f"A{i}"))
            assert (f"A{i}", f"A{i}") in container.docs  # the write happened

    _run(go())
    kinds = [f.kind for f in world.faults.injected]
    assert kinds == ["cosmos_answer_lost"] * 3


def test_a_cosmos_503_or_refused_connection_is_transient_and_changes_nothing():
    world = _world(cosmos_fail=1.0)
    container = SimContainer(world, "orders", "/id")
    orders = CosmosOrdersRepository(container)

    async def go():
        for _ in range(3):  # 429 past the SDK's retries, 503, refused connection
            with pytest.raises(TransientError):
                await orders.store(_order("B"), "B")
        assert container.docs == {}

    _run(go())


def test_a_cosmos_outage_fails_every_call_in_its_window_only():
    world = _world(cosmos_outage=True)
    container = SimContainer(world, "state", "/id")
    checkpoints = CosmosCheckpointStore(container, RequestCharges())
    world.faults.cosmos.begin(world.clock.now, 30)

    async def go():
        for _ in range(2):  # a 503 and a refused connection, alternately
            with pytest.raises(TransientError):
                await checkpoints.save("c1")
        # The local stack's setup translates nothing: the host's start fails.
        with pytest.raises(AzureError):
            await ensure_state_container(
                SimCosmosClient(world, {"orderState": container}),  # type: ignore[arg-type]
                "db",
                "orderState",
            )
        world.clock.now += timedelta(seconds=31)
        await checkpoints.save("c2")
        assert await checkpoints.load() == "c2"

    _run(go())


def test_a_query_on_a_lagging_replica_sees_previous_versions():
    world = _world(query_lag=1.0)
    container = SimContainer(world, "state", "/id")

    async def go():
        await container.upsert_item({"id": "X", "v": 1})
        await container.upsert_item({"id": "X", "v": 2})
        docs = [d async for d in container.query_items("SELECT * FROM c WHERE c.id = 'X'")]
        assert [d["v"] for d in docs] == [1]
        assert (await container.read_item("X", "X"))["v"] == 2  # a point read is not lagged here

    _run(go())


def _delivery(world: World, bus: Bus) -> Delivery:
    bus.send("q", b"{}", "m1")
    msg = bus.receivable("q")
    assert msg is not None
    return Delivery(bus, "q", msg)


def test_settlement_faults_as_the_sdk_raises_them():
    world = _world(settle_fail=1.0)
    bus = Bus(world)
    d = _delivery(world, bus)
    actions = SimActions(d)
    # Fault 0 is "dropped": nothing settled, the lock still ours.
    with pytest.raises(ServiceBusConnectionError):
        actions.complete(d)
    assert d.msg in bus.queue("q").messages
    assert d.msg.lock_token == d.token
    # Fault 1 is "lock lost": the message is released for redelivery.
    with pytest.raises(MessageLockLostError):
        actions.complete(d)
    assert d.msg.lock_token is None
    d = Delivery(bus, "q", bus.receivable("q"))
    # Fault 2 is "after": completed, and the answer lost.
    with pytest.raises(OperationTimeoutError):
        SimActions(d).complete(d)
    assert bus.queue("q").messages == []


def test_a_send_accepted_whose_answer_is_lost_is_on_the_queue_and_transient():
    world = _world(send_lost=1.0)
    bus = Bus(world)
    pub = publisher(SimServiceBusClient(world, bus, set()))

    async def go():
        with pytest.raises(TransientError):  # fault 0: accepted, answer lost
            await pub.send("q", b"{}", "m1")
        with pytest.raises(TransientError):  # fault 1: refused, nothing sent
            await pub.send("q", b"{}", "m2")

    _run(go())
    assert [m.message_id for m in bus.queue("q").messages] == ["m1"]


def test_a_remote_answer_after_the_clients_timeout_is_a_transient_error():
    world = _world(slow_answers=1.0)
    remote = SimRemote(world, {})
    service = http_remote(remote)
    call = RemoteCall("payment", "charge", "K/charge-payment", 1, {"OrderID": "K"})

    async def go():
        # Fault 0: applied, answered late; fault 1: never got there.
        for _ in range(2):
            with pytest.raises(TransientError, match="no answer within"):
                await service.call(call, timeout=2.0)

    _run(go())
    assert [f.kind for f in world.faults.injected] == ["slow_answer", "slow_answer"]
    assert len(remote.calls) == 1  # only the first reached the service
    assert isinstance(world.faults.injected[0], Fault)


def test_an_order_whose_create_conflicts_but_cannot_be_read_yet_is_retried_not_refused():
    """Seed 202 (python -m sim --seeds 400 --orders 3): a delivery's create of
    the order was applied and its answer lost; the next try's create
    conflicted, and its read went to a replica that had not seen the create
    (a 404). The NotFoundError dead-lettered the submission ProcessingFailed
    and the order was never accepted. It is a TransientError now, so the
    delivery is tried again; and the try after the lag finds the order."""
    world = _world(query_lag=1.0)
    container = SimContainer(world, "orders", "/id")
    orders = CosmosOrdersRepository(container)

    async def go():
        etag = await orders.store(_order("C"), "C")
        with pytest.raises(TransientError, match="did not find it"):
            await orders.store(_order("C"), "C")
        world.clock.now += timedelta(seconds=5)  # replicated by now
        assert await orders.store(_order("C"), "C") == etag

    _run(go())
    assert [f.kind for f in world.faults.injected] == ["new_document_lag"]


def test_a_delete_that_finds_nothing_can_lose_its_404_and_the_orders_db_calls_it_transient():
    """The fault surface's gap at CosmosOrdersRepository.discard (issue 42):
    a delete of a document that is not there answers 404, which the adapter
    takes as done; that answer can be lost on its way back like any other
    (FaultConfig.lost_404), and then the caller cannot know: a TransientError.
    Its own stream: the seed's other draws stay where they were."""
    world = _world(lost_404=1.0)
    orders = CosmosOrdersRepository(SimContainer(world, "orders", "/id"))

    async def go():
        for _ in range(3):  # a reset, the client's timeout, a 408
            with pytest.raises(TransientError):
                await orders.discard("gone")

    _run(go())
    assert [f.kind for f in world.faults.injected] == ["cosmos_answer_lost"] * 3
    assert world.faults.rng.getstate() == _world().faults.rng.getstate()
    quiet = _world(lost_404=0.0)
    _run(CosmosOrdersRepository(SimContainer(quiet, "orders", "/id")).discard("gone"))
    assert quiet.faults.injected == []


def test_a_host_start_can_read_the_shard_count_another_start_just_created_before_it_replicated():
    """The fault surface's gap at ensure_shard_count's read (issue 42): the
    second of two hosts starting together finds the `~config` document there
    (its create conflicts) and then cannot read it on its replica (a 404,
    FaultConfig.start_lag): the start is refused as transient and retried,
    never taken for another shard count. Only a host's start lags so."""
    from adapters.recovery_index import ensure_shard_count

    world = _world(start_lag=1.0)
    index = SimContainer(world, "recoveryIndex", "/bucket")
    started: dict[str, str] = {}

    def start(name: str, after: float) -> None:
        async def run() -> None:
            try:
                await ensure_shard_count(index, 4)  # type: ignore[arg-type]
                started[name] = "started"
            except TransientError as exc:
                started[name] = str(exc)

        world.at(world.clock.now + timedelta(seconds=after), name, lambda: world.spawn(name, run))

    start("host", 0.0)  # the first records it
    start("host-2", 0.5)  # its create conflicts, its read lags
    start("supervisor0", 1.0)  # no host's start: reads it as it is
    start("host-3", 5.0)  # a later start: replicated by then
    _run(world.run(world.clock.now + timedelta(seconds=10)))
    assert started["host"] == started["supervisor0"] == started["host-3"] == "started"
    assert "not yet readable" in started["host-2"]
    # (its first read too: then its create conflicts, and the read after it lags again)
    assert [f.kind for f in world.faults.injected] == ["new_document_lag"] * 2
