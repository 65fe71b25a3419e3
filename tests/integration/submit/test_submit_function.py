"""Submit through the function as registered (one per application ingress
queue), against the real Cosmos server and the Service Bus emulator: each
outcome of DESIGN.md §2.2 and §4, the AppId taken from the queue, and the
Cosmos requests a new order costs."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import azure.durable_functions as df
import pytest

import bootstrap
from adapters.state_store import CosmosStateStore
from devstack.cosmos.faults import FaultRule, clear_faults, set_faults
from domain.errors import NotFoundError
from domain.ids import order_key
from domain.models import ProcessState
from tests.integration.app_env import INGRESS, Bus, app_env, registered  # noqa: F401
from tests.unit.domain.conftest import order_payload
from triggers.submit import function_name, register

pytestmark = pytest.mark.timeout(120)
ORDERS = INGRESS["webshop"]
# The app's root, as function_app builds it (settings from app_env's environment).
ROOT = bootstrap.build()


def _submit_of(app_id: str):
    """The app's Submit function as the host sees it, without a Durable
    client (no fast path: these tests look at Submit alone)."""
    blueprint = df.Blueprint()
    register(blueprint, INGRESS, ROOT)
    # __wrapped__: past the Durable middleware, which would build a client
    # from the host's binding JSON.
    function = registered(blueprint, function_name(app_id)).__wrapped__

    async def run(message, message_actions, client=None):
        await function(message=message, message_actions=message_actions, client=client)

    return run


SUBMIT = _submit_of("webshop")


@pytest.fixture
async def rig(app_env, servicebus_emulator):  # noqa: F811
    rig = Rig(Bus(servicebus_emulator.connection_string))
    # Concurrently: each receiver's link costs the SDK's handshake cadence (~0.9 s).
    await asyncio.gather(
        *(
            rig.bus.drain(queue, wait=0.1)
            for queue in (
                *INGRESS.values(),
                "replies-webshop",
                "replies-partner-portal",
                "alerts",
                *(f"{q}/$deadletterqueue" for q in INGRESS.values()),
            )
        )
    )
    yield rig
    await rig.bus.close()
    await ROOT.close()


def _dies_like_a_process(function):
    """A crash (Killed) leaves the message unsettled; the lock would expire
    and the queue redeliver. Here: abandon, so the test need not wait a minute."""

    async def run(message, message_actions, **extra):
        try:
            await function(message=message, message_actions=message_actions, **extra)
        except Killed as exc:
            raise _Died() from exc

    return run


class _Died(Exception):
    pass


class Rig:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.order_id = f"IT-{uuid.uuid4().hex[:10]}"
        self.key = order_key("webshop", self.order_id)

    def body(self, **overrides) -> bytes:
        return json.dumps(order_payload(OrderID=self.order_id, **overrides)).encode()

    async def submit(self, body: bytes) -> tuple:
        await self.bus.send(ORDERS, body)
        return await self.bus.deliver(ORDERS, _dies_like_a_process(SUBMIT))

    async def replies(self, queue="replies-webshop") -> list[str]:
        return [
            m["Status"]
            for m in await self.bus.drain(queue, wait=0.3)
            if m.get("OrderID") == self.order_id
        ]

    async def alerts(self) -> list[str]:
        return [m["Kind"] for m in await self.bus.drain("alerts", wait=0.3)]

    async def record(self):
        c = await ROOT.container()
        return (await c.store.read(self.key))[0]


async def test_new_order_written_and_received_sent(rig):
    assert await rig.submit(rig.body()) == ("complete",)
    record = await rig.record()
    assert record.ProcessState is ProcessState.PENDING
    assert record.LockedBy is None
    assert record.CompleteBy is None
    assert record.FailureCount == 0
    assert record.ReceivedSent
    c = await ROOT.container()
    assert (await c.orders.get(rig.key)).OrderID == rig.order_id
    assert await rig.replies() == ["Received"]


async def test_redelivered_identical_order_sends_no_second_received(rig):
    await rig.submit(rig.body())
    assert await rig.submit(rig.body()) == ("complete",)
    assert await rig.replies() == ["Received"]


class Killed(BaseException):
    """The process dying mid-handler (no exception the gate could catch)."""


async def test_crash_between_the_two_writes_is_healed_by_redelivery(rig, monkeypatch):
    real = CosmosStateStore.create_if_absent

    async def crash(self, record):
        raise Killed("process killed between the orders DB and the state store")

    monkeypatch.setattr(CosmosStateStore, "create_if_absent", crash)
    with pytest.raises(_Died):
        await rig.submit(rig.body())
    monkeypatch.setattr(CosmosStateStore, "create_if_absent", real)
    # the abandoned message comes back: the host redelivers it
    assert await rig.bus.deliver(ORDERS, SUBMIT) == ("complete",)
    record = await rig.record()
    assert record.ProcessState is ProcessState.PENDING
    c = await ROOT.container()
    items = [
        i
        async for i in c.state_container.query_items(
            "SELECT VALUE COUNT(1) FROM c WHERE c.id = @id",
            parameters=[{"name": "@id", "value": rig.key}],
            partition_key=rig.key,
        )
    ]
    assert items == [1]
    assert await rig.replies() == ["Received"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"Customer": {"CustomerId": "C-999"}}, "Customer"),
        ({"Currency": "USD"}, "Currency"),
        ({"PaymentReference": "another-ref"}, "PaymentReference"),
        ({"Lines": [{"Sku": "SKU-9", "Quantity": 1, "UnitPrice": "25.50"}]}, "Lines"),
    ],
)
async def test_conflicting_order_is_deadlettered_alerted_and_nothing_overwritten(
    rig, overrides, field
):
    await rig.submit(rig.body())
    before = await rig.record()
    call = await rig.submit(rig.body(**overrides))
    assert call[0] == "deadletter"
    assert call[1] == "OrderConflict"
    assert field in call[2]
    assert await rig.record() == before
    dead = [
        m
        for m in await rig.bus.drain(f"{ORDERS}/$deadletterqueue", wait=0.3)
        if m.get("OrderID") == rig.order_id
    ]
    assert [m["_dead_letter_reason"] for m in dead] == ["OrderConflict"]
    assert "OrderConflict" in await rig.alerts()


async def test_malformed_message_is_deadlettered_with_the_validation_error(rig):
    call = await rig.submit(b'{"OrderID": 42, "Lines": "many"}')
    assert call[0] == "deadletter"
    assert call[1] == "InvalidMessage"
    assert "OrderSubmitted" in call[2]
    assert "InvalidMessage" in await rig.alerts()


async def test_oversize_message_is_deadlettered(rig, app_env):  # noqa: F811
    app_env(MAX_ORDER_BYTES="2048")
    lines = [{"Sku": f"SKU-{i:04d}", "Quantity": 1, "UnitPrice": "1.00"} for i in range(80)]
    call = await rig.submit(rig.body(Lines=lines, Total="80.00"))
    assert call[:2] == ("deadletter", "InvalidMessage")
    assert "limit is 2048 bytes" in call[2]


async def test_reply_queue_of_another_application_is_refused(rig):
    call = await rig.submit(rig.body(ReplyTo="replies-partner-portal"))
    assert call[:2] == ("deadletter", "ReplyQueueNotAllowed")
    assert await rig.replies("replies-partner-portal") == []
    assert "ReplyQueueNotAllowed" in await rig.alerts()


async def test_backlog_above_threshold_answers_rejected(rig, app_env):  # noqa: F811
    app_env(PENDING_BACKLOG_LIMIT="5")
    c = await ROOT.container()
    from datetime import UTC, datetime

    await c.store.write_backlog_gauge(6, datetime.now(UTC))
    assert await rig.submit(rig.body()) == ("complete",)
    assert await rig.replies() == ["Rejected"]
    assert (await rig.record()).ProcessState is ProcessState.REJECTED


async def test_throttled_store_retries_after_a_delay_not_at_once(
    rig,
    app_env,  # noqa: F811
    cosmos_server,
    cosmos_database,
):
    app_env(REDELIVERY_DELAYS_SECONDS="2")
    set_faults(cosmos_server.endpoint, FaultRule(status=429, db=cosmos_database, retry_after_ms=10))
    try:
        # completed: a copy is scheduled on the queue instead of an abandon
        assert await rig.submit(rig.body()) == ("complete",)
    finally:
        clear_faults(cosmos_server.endpoint)
    started = time.monotonic()
    assert await rig.bus.deliver(ORDERS, SUBMIT, wait=15) == ("complete",)
    # Not a timing assertion on speed: the copy must not come back before its delay.
    assert time.monotonic() - started > 1.0
    assert await rig.replies() == ["Received"]
    assert await rig.alerts() == []


async def test_two_orders_with_the_same_client_properties_both_get_their_back_off_copy(
    rig,
    app_env,  # noqa: F811
    cosmos_server,
    cosmos_database,
):
    """A back-off copy is named by the broker's sequence number, not by a
    property the client set: two orders that both carry one
    `x-original-message-id` (and retry count) each get their copy past the
    queue's duplicate detection, and both are accepted."""
    app_env(REDELIVERY_DELAYS_SECONDS="2")  # both originals are taken before either copy
    other = f"IT-{uuid.uuid4().hex[:10]}"
    same = {"x-original-message-id": "chosen-by-the-client", "x-retry-count": 0}
    for order_id in (rig.order_id, other):
        body = json.dumps(order_payload(OrderID=order_id)).encode()
        await rig.bus.send(ORDERS, body, message_id=order_id, properties=same)
    set_faults(cosmos_server.endpoint, FaultRule(status=429, db=cosmos_database, retry_after_ms=10))
    try:
        # completed, each: its copy is scheduled instead
        assert [await rig.bus.deliver(ORDERS, SUBMIT) for _ in range(2)] == [
            ("complete",),
            ("complete",),
        ]
    finally:
        clear_faults(cosmos_server.endpoint)
    assert [await rig.bus.deliver(ORDERS, SUBMIT, wait=15) for _ in range(2)] == [
        ("complete",),
        ("complete",),
    ]
    c = await ROOT.container()
    for order_id in (rig.order_id, other):
        record, _ = await c.store.read(order_key("webshop", order_id))
        assert record.ProcessState is ProcessState.PENDING
    received = [m["OrderID"] for m in await rig.bus.drain("replies-webshop", wait=0.3)]
    assert sorted(received) == sorted([rig.order_id, other])
    assert await rig.alerts() == []


async def test_throttling_that_outlasts_the_back_off_dead_letters_with_a_reason_and_an_alert(
    rig,
    app_env,  # noqa: F811
    cosmos_server,
    cosmos_database,
):
    app_env(REDELIVERY_DELAYS_SECONDS="0.2")
    set_faults(cosmos_server.endpoint, FaultRule(status=429, db=cosmos_database, retry_after_ms=10))
    try:
        assert await rig.submit(rig.body()) == ("complete",)
        call = await rig.bus.deliver(ORDERS, SUBMIT, wait=15)
    finally:
        clear_faults(cosmos_server.endpoint)
    assert call[:2] == ("deadletter", "RetriesExhausted")
    alerts = [m for m in await rig.bus.drain("alerts", wait=0.3)]
    assert [(a["Kind"], a["OrderID"]) for a in alerts] == [("RetriesExhausted", rig.order_id)]
    [dead] = await rig.bus.drain(f"{ORDERS}/$deadletterqueue", wait=0.3)
    assert dead["_message_id"] == alerts[0]["MessageId"]


async def test_an_unexpected_exception_is_dead_lettered_processing_failed(rig, monkeypatch):
    async def broken(self, record):
        raise ZeroDivisionError("surprise")

    monkeypatch.setattr(CosmosStateStore, "create_if_absent", broken)
    call = await rig.submit(rig.body())
    assert call[:2] == ("deadletter", "ProcessingFailed")
    assert "ZeroDivisionError" in call[2]
    [alert] = await rig.bus.drain("alerts", wait=0.3)
    assert alert["Kind"] == "ProcessingFailed"
    assert alert["OrderID"] == rig.order_id


async def test_a_rejected_order_whose_status_send_failed_hears_rejected_from_the_outbox(
    rig,
    app_env,  # noqa: F811
    monkeypatch,
):
    app_env(PENDING_BACKLOG_LIMIT="5", REDELIVERY_DELAYS_SECONDS="0.2")
    c = await ROOT.container()
    from datetime import UTC, datetime

    from adapters.servicebus import ServiceBusPublisher
    from domain.errors import TransientError
    from reporting import StatusOutbox, StatusReporter

    await c.store.write_backlog_gauge(6, datetime.now(UTC))
    real = ServiceBusPublisher.send

    async def fail_replies(self, queue, *args, **kwargs):
        if queue == "replies-webshop":
            raise TransientError("reply queue unreachable")
        return await real(self, queue, *args, **kwargs)

    monkeypatch.setattr(ServiceBusPublisher, "send", fail_replies)
    # the delivery completes: the status waits in the record's outbox
    assert await rig.submit(rig.body()) == ("complete",)
    monkeypatch.setattr(ServiceBusPublisher, "send", real)
    record = await rig.record()
    assert record.ProcessState is ProcessState.REJECTED
    assert record.PendingStatus is not None
    assert await rig.replies() == []
    # the Starter's outbox delivery sends it once the queue takes it
    assert (await StatusOutbox(c.store, StatusReporter(c.publisher)).deliver(record)).done
    assert await rig.replies() == ["Rejected"]
    assert (await rig.record()).PendingStatus is None
    with pytest.raises(NotFoundError):
        await c.orders.get(rig.key)


async def test_an_order_on_the_webshop_ingress_becomes_a_webshop_order(rig):
    assert await rig.submit(rig.body()) == ("complete",)
    assert (await rig.record()).AppId == "webshop"
    assert await rig.replies() == ["Received"]


async def test_each_application_has_its_own_submit_function_and_queue(rig):
    body = rig.body(AppId="partner-portal", ReplyTo="replies-partner-portal")
    await rig.bus.send(INGRESS["partner-portal"], body)
    assert await rig.bus.deliver(INGRESS["partner-portal"], _submit_of("partner-portal")) == (
        "complete",
    )
    c = await ROOT.container()
    record, _ = await c.store.read(order_key("partner-portal", rig.order_id))
    assert record.AppId == "partner-portal"
    assert await rig.replies("replies-partner-portal") == ["Received"]


async def test_a_body_naming_partner_portal_on_the_webshop_ingress_is_dead_lettered_app_id_mismatch(
    rig,
):
    call = await rig.submit(rig.body(AppId="partner-portal", ReplyTo="replies-partner-portal"))
    assert call[:2] == ("deadletter", "AppIdMismatch")
    [dead] = await rig.bus.drain(f"{ORDERS}/$deadletterqueue", wait=0.3)
    assert dead["_dead_letter_reason"] == "AppIdMismatch"
    assert dead["OrderID"] == rig.order_id
    alerts = await rig.bus.drain("alerts", wait=0.3)
    assert [(a["Kind"], a["OrderID"], a["Queue"]) for a in alerts] == [
        ("AppIdMismatch", rig.order_id, ORDERS)
    ]
    with pytest.raises(NotFoundError):
        await rig.record()
    c = await ROOT.container()
    with pytest.raises(NotFoundError):
        await c.orders.get(rig.key)
    assert await rig.replies("replies-partner-portal") == []
    assert await rig.replies() == []


def _calls(*charges) -> dict[str, int]:
    out: dict[str, int] = {}
    for ledger in {id(c): c for c in charges}.values():
        for kind, stats in ledger.by_kind.items():
            out[kind] = out.get(kind, 0) + stats.calls
    return out


async def test_a_new_order_costs_two_creates_and_one_replace_on_the_real_server(rig):
    """Counted from the Cosmos server's responses (each adapter call records
    its response's charge), not timed."""
    c = await ROOT.container()
    # The backlog gauge's point read is per process (cached 5 s), not per
    # order: counted apart.
    before = _calls(c.store.charges, c.orders.charges)
    assert await rig.submit(rig.body()) == ("complete",)
    after = _calls(c.store.charges, c.orders.charges)
    spent = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    backlog = {k: v for k, v in spent.items() if "gauge" in k or "backlog" in k}
    assert {k: v for k, v in spent.items() if k not in backlog} == {
        "order_create": 1,
        "create": 1,
        "replace": 1,
    }
    print(
        f"\nsubmit, new order: cosmos requests={sum(spent.values()) - sum(backlog.values())} {spent}"
    )
