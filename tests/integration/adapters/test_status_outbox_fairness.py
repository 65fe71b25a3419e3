"""The status outbox drain against the local Cosmos server: a reply queue that
refuses every send must not starve the other applications' statuses (review
finding on issue 12). The query returns the oldest entries first and leaves
out queues in back-off; the Starter tries a refusing queue once, then scans
again without it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from adapters.ports import ANY_OWNER
from adapters.state_store import CosmosStateStore
from domain import state_machine as sm
from orchestrators.starter import STATUS_BACKOFF_FIRST, Starter
from tests.builders import ReadClock, claim
from tests.fakes import RecordingPublisher
from tests.integration.adapters.builders import NOW, POLICY, STEPS, make_order
from tests.unit.orchestrators.driver import SETTINGS

REFUSING = "replies-refusing"
HEALTHY = "replies-webshop"


class RefusingPublisher(RecordingPublisher):
    """Service Bus as seen from the Starter: one reply queue refuses every send."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    async def send(self, queue, body, message_id, application_properties=None) -> None:
        if queue == REFUSING:
            self.refused += 1
            raise ConnectionError(f"{queue} refuses sends")
        await super().send(queue, body, message_id, application_properties)


class Client:
    async def start_new(self, name, instance_id, data):  # nothing is Pending in these tests
        raise AssertionError("no order should start")

    async def get_status(self, instance_id):
        return None


async def _failed_with_pending_status(
    store: CosmosStateStore, order_id: str, reply_to: str, at
) -> None:
    """A Failed record whose status (and alert) is still in its outbox, written at `at`."""
    order = make_order(order_id, ReplyTo=reply_to, AppId=reply_to.removeprefix("replies-"))
    await store.create_if_absent(sm.new_record(order, NOW, STEPS, key=order_id))
    claimed = await claim(store, order_id, NOW, POLICY)
    assert claimed is not None
    await store.update(
        order_id,
        lambda r: sm.mark_failed(r, claimed.LockedBy, None, "declined", at),
        claimed.LockedBy,
    )


async def test_outbox_query_returns_oldest_first_and_leaves_out_skipped_queues(
    state_store: CosmosStateStore,
) -> None:
    await asyncio.gather(
        _failed_with_pending_status(state_store, "OB-3", HEALTHY, NOW + timedelta(seconds=3)),
        _failed_with_pending_status(state_store, "OB-1", REFUSING, NOW + timedelta(seconds=1)),
        _failed_with_pending_status(state_store, "OB-2", HEALTHY, NOW + timedelta(seconds=2)),
    )
    before = NOW + timedelta(minutes=1)
    assert [r.id for r, _ in await state_store.query_unsent_statuses(10, before)] == [
        "OB-1",
        "OB-2",
        "OB-3",
    ]
    assert [r.id for r, _ in await state_store.query_unsent_statuses(2, before)] == ["OB-1", "OB-2"]
    skipped = await state_store.query_unsent_statuses(10, before, [REFUSING])
    assert [r.id for r, _ in skipped] == ["OB-2", "OB-3"]
    assert [
        r.id for r, _ in await state_store.query_unsent_statuses(10, before, [REFUSING, HEALTHY])
    ] == []


async def test_outbox_query_leaves_out_entries_kept_for_their_alert_on_request(
    state_store: CosmosStateStore,
) -> None:
    """While the alerts queue refuses, the Starter asks for entries whose
    status is still to send: one kept for its alert alone (PendingStatus.Sent,
    written only when true) is left out by the query on the Cosmos server
    itself, and found again when alerts are asked for."""
    await asyncio.gather(
        _failed_with_pending_status(state_store, "OB-1", HEALTHY, NOW + timedelta(seconds=1)),
        _failed_with_pending_status(state_store, "OB-2", HEALTHY, NOW + timedelta(seconds=2)),
    )
    record, _ = await state_store.read("OB-1")
    assert record.PendingStatus is not None
    message_id = record.PendingStatus.MessageId
    await state_store.update("OB-1", lambda r: sm.mark_alert_left(r, message_id), ANY_OWNER)
    before = NOW + timedelta(minutes=1)
    found = await state_store.query_unsent_statuses(10, before)
    assert [(r.id, r.PendingStatus.Sent) for r, _ in found] == [("OB-1", True), ("OB-2", False)]
    without = await state_store.query_unsent_statuses(10, before, alerts=False)
    assert [r.id for r, _ in without] == ["OB-2"]


async def test_a_refusing_reply_queue_does_not_starve_the_others(
    state_store: CosmosStateStore,
) -> None:
    """A page's worth of older entries for a refusing queue, then a few for a
    healthy one: one run delivers the healthy ones and tries the refusing
    queue once; it is probed again only after its back-off."""
    batch = 8
    await asyncio.gather(
        *(
            _failed_with_pending_status(
                state_store, f"RF-{i:02}", REFUSING, NOW + timedelta(seconds=i)
            )
            for i in range(batch + 4)
        )
    )
    await asyncio.gather(
        *(
            _failed_with_pending_status(
                state_store, f"OK-{i}", HEALTHY, NOW + timedelta(minutes=1, seconds=i)
            )
            for i in range(3)
        )
    )
    publisher = RefusingPublisher()
    now = [NOW + timedelta(minutes=5)]
    starter = Starter(
        replace(SETTINGS, starter_batch_size=batch),
        state_store,
        clock=ReadClock(lambda: now[0]),
        publisher=publisher,
        status_scan_interval=timedelta(seconds=1),
    )

    report = await starter.run(Client())
    delivered = sorted(body_id for q, _, body_id, _ in publisher.sent if q == HEALTHY)
    assert len(delivered) == 3
    assert report.statuses_delivered == 3
    assert publisher.refused == 1
    assert report.statuses_unsent == 1
    assert report.statuses_deferred == batch - 1  # the rest of the first page, not tried
    left = await state_store.query_unsent_statuses(50, now[0])
    assert sorted(r.id for r, _ in left) == [f"RF-{i:02}" for i in range(batch + 4)]

    # Inside the back-off the queue is neither tried nor scanned for.
    now[0] += STATUS_BACKOFF_FIRST - timedelta(seconds=1)
    report = await starter.run(Client())
    assert publisher.refused == 1
    assert report.statuses_deferred == 0

    # Past it, one probe; still refusing, so it backs off again (longer).
    now[0] += timedelta(seconds=2)
    report = await starter.run(Client())
    assert publisher.refused == 2
    assert report.statuses_unsent == 1
    now[0] += STATUS_BACKOFF_FIRST + timedelta(seconds=1)
    await starter.run(Client())
    assert publisher.refused == 2  # the second back-off is twice the first
