"""Submit's decisions, with fakes behind the project's own ports. The same
outcomes are checked against the real Cosmos server and Service Bus emulator in
tests/integration/submit."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from adapters.settings import load_settings
from adapters.settlement import SettleKind
from domain.errors import TransientError
from domain.models import ProcessState
from reporting import Alerts, StatusReporter
from submit.handler import BacklogReader, SubmitHandler
from tests.fakes import FakeOrders, FakeStateStore, RecordingPublisher
from tests.unit.domain.conftest import STEPS, order_payload

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ENV = {
    "CosmosDbConnection": "AccountEndpoint=https://127.0.0.1:1/;AccountKey=a2V5",
    "ServiceBusConnection": "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=x;SharedAccessKey=y;UseDevelopmentEmulator=true",
    "REPLY_QUEUE_REGISTRY": json.dumps({"webshop": "replies-webshop", "partner": "replies-partner"}),
    "PENDING_BACKLOG_LIMIT": "2",
}


class Rig:
    def __init__(self, **env):
        self.store, self.orders, self.bus = FakeStateStore(), FakeOrders(), RecordingPublisher()
        settings = load_settings({**ENV, **env})
        self.handler = SubmitHandler(
            settings,
            self.store,
            self.orders,
            StatusReporter(self.bus),
            Alerts(self.bus),
            STEPS,
            backlog=BacklogReader(self.store, 60, cache_seconds=0, wall_clock=lambda: NOW),
            clock=lambda: NOW,
        )

    async def submit(self, **overrides):
        return await self.handler.handle(json.dumps(order_payload(**overrides)).encode())

    def statuses(self, queue="replies-webshop"):
        return [json.loads(b)["Status"] for b in self.bus.to(queue)]

    def alerts(self):
        return [json.loads(b)["Kind"] for b in self.bus.to("alerts")]


@pytest.fixture
def rig():
    return Rig()


async def test_new_order_is_written_and_received_sent(rig):
    outcome = await rig.submit()
    assert outcome.kind is SettleKind.COMPLETE
    record, _ = await rig.store.read("ORD-1")
    assert record.ProcessState is ProcessState.PENDING and record.LockedBy is None
    assert record.ReceivedSent and record.ReplyTo == "replies-webshop"
    assert "ORD-1" in rig.orders.orders
    assert rig.statuses() == ["Received"]


async def test_redelivery_sends_no_second_received(rig):
    await rig.submit()
    writes = rig.store.writes
    assert (await rig.submit()).kind is SettleKind.COMPLETE
    assert rig.statuses() == ["Received"]
    assert rig.store.writes == writes


async def test_crash_between_orders_and_state_is_healed_by_redelivery(rig):
    class Crash(Exception):
        pass

    real = rig.store.create_if_absent

    async def crash(record):
        raise Crash()

    rig.store.create_if_absent = crash
    with pytest.raises(Crash):
        await rig.submit()
    assert "ORD-1" in rig.orders.orders and not rig.store.docs
    rig.store.create_if_absent = real
    assert (await rig.submit()).kind is SettleKind.COMPLETE
    assert len(rig.store.docs) == 1 and rig.statuses() == ["Received"]


async def test_crash_after_status_before_mark_resends_same_message_id(rig):
    real = rig.store.update

    async def crash(*a, **k):
        raise RuntimeError("killed")

    rig.store.update = crash
    with pytest.raises(RuntimeError):
        await rig.submit()
    rig.store.update = real
    await rig.submit()
    # the publisher (like the reply queue's duplicate detection) dropped the re-send
    assert rig.statuses() == ["Received"]
    assert (await rig.store.read("ORD-1"))[0].ReceivedSent


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"Customer": {"CustomerId": "C-8", "Name": "Ada"}}, "Customer"),
        ({"Currency": "USD"}, "Currency"),
        ({"PaymentReference": "other-ref"}, "PaymentReference"),
        (
            {"Lines": [{"Sku": "SKU-9", "Quantity": 1, "UnitPrice": "25.50"}]},
            "Lines",
        ),
    ],
)
async def test_conflicting_redelivery_is_deadlettered_and_alerted(rig, overrides, field):
    await rig.submit()
    before = dict(rig.store.docs)
    outcome = await rig.submit(**overrides)
    assert outcome.kind is SettleKind.DEADLETTER and outcome.reason == "OrderConflict"
    assert field in outcome.description
    assert rig.store.docs == before  # nothing overwritten
    assert rig.alerts() == ["OrderConflict"]


async def test_malformed_message_is_deadlettered_with_the_validation_error(rig):
    outcome = await rig.handler.handle(b'{"OrderID": 5}')
    assert outcome.kind is SettleKind.DEADLETTER and outcome.reason == "InvalidMessage"
    assert "OrderSubmitted" in outcome.description
    assert rig.alerts() == ["InvalidMessage"] and not rig.store.docs


async def test_oversize_message_is_deadlettered():
    rig = Rig(MAX_ORDER_BYTES="1024")
    lines = [{"Sku": f"SKU-{i}", "Quantity": 1, "UnitPrice": "1.00"} for i in range(60)]
    outcome = await rig.submit(Lines=lines, Total="60.00")
    assert outcome.reason == "InvalidMessage" and "limit is 1024 bytes" in outcome.description


@pytest.mark.parametrize(
    ("app", "queue"),
    [("webshop", "replies-partner"), ("unknown-app", "replies-webshop")],
)
async def test_reply_queue_not_registered_to_sender(rig, app, queue):
    outcome = await rig.submit(AppId=app, ReplyTo=queue)
    assert outcome.kind is SettleKind.DEADLETTER and outcome.reason == "ReplyQueueNotAllowed"
    assert rig.bus.to(queue) == [] and not rig.store.docs
    assert rig.alerts() == ["ReplyQueueNotAllowed"]


async def test_backlog_above_threshold_rejects_visibly(rig):
    await rig.store.write_backlog_gauge(3, NOW)
    outcome = await rig.submit()
    assert outcome.kind is SettleKind.COMPLETE
    assert rig.statuses() == ["Rejected"]
    record, _ = await rig.store.read("ORD-1")
    assert record.ProcessState is ProcessState.REJECTED
    assert "ORD-1" not in rig.orders.orders
    # a redelivery of the rejected order changes nothing and sends nothing new
    await rig.submit()
    assert rig.statuses() == ["Rejected"]


async def test_backlog_does_not_reject_a_redelivery_of_an_accepted_order(rig):
    await rig.submit()
    await rig.store.write_backlog_gauge(100, NOW)
    assert (await rig.submit()).kind is SettleKind.COMPLETE
    assert rig.statuses() == ["Received"]


async def test_stale_gauge_admits(rig):
    await rig.store.write_backlog_gauge(100, NOW - timedelta(minutes=5))
    assert (await rig.submit()).kind is SettleKind.COMPLETE
    assert rig.statuses() == ["Received"]


async def test_transient_store_error_abandons(rig):
    async def throttled(order_id):
        raise TransientError("429", retry_after=0.5)

    rig.store.read = throttled
    outcome = await rig.submit()
    assert outcome.kind is SettleKind.ABANDON
    assert not rig.bus.sent


async def test_transient_bus_error_abandons_and_redelivery_finishes(rig):
    rig.bus.fail_next = TransientError("bus busy")
    assert (await rig.submit()).kind is SettleKind.ABANDON
    assert (await rig.submit()).kind is SettleKind.COMPLETE
    assert rig.statuses() == ["Received"]


async def test_backlog_gauge_is_read_once_per_cache_interval():
    store = FakeStateStore()
    await store.write_backlog_gauge(3, NOW)
    reads = 0
    real = store.read_backlog_gauge

    async def counting():
        nonlocal reads
        reads += 1
        return await real()

    store.read_backlog_gauge = counting
    ticks = iter([0.0, 1.0, 6.0])
    reader = BacklogReader(store, 60, cache_seconds=5, clock=lambda: next(ticks), wall_clock=lambda: NOW)
    assert [await reader.pending() for _ in range(3)] == [3, 3, 3]
    assert reads == 2  # at 0 s and again at 6 s, not at 1 s
