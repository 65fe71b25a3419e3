"""An operator's compensation of an Error order whose Failed status is still
in the outbox (review defect 2), on the real Cosmos server: the Starter finds
the request and the unsent entry with its queries, sends Failed, then claims
the compensation; the claim no longer drops the entry when the send fails.
The bus is our recording publisher (the reply queue's side is not in question)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from domain import state_machine as sm
from domain.models import ProcessState
from orchestrators.starter import Starter
from tests.builders import ReadClock, claim
from tests.fakes import RecordingPublisher
from tests.integration.adapters.builders import NOW, POLICY, make_record
from tests.unit.orchestrators.driver import SETTINGS

pytestmark = pytest.mark.timeout(120)


class Client:
    """The Durable client the Starter starts the compensation with; notes
    which statuses the client already had when the compensation began."""

    def __init__(self, bus: RecordingPublisher) -> None:
        self.bus, self.started, self.told_before_start = bus, [], []

    async def start_new(self, name, instance_id, data):
        self.told_before_start += [mid for q, _, mid, _ in self.bus.sent if q == "replies-webshop"]
        self.started.append(instance_id)

    async def get_status(self, instance_id):
        """What it started is Running (so the Starter does not restart it)."""
        if instance_id not in self.started:
            return None
        return type("Status", (), {"runtime_status": type("R", (), {"name": "Running"})()})()


class DownPublisher:
    async def send(self, queue, body, message_id, application_properties=None) -> None:
        raise ConnectionError("service bus unavailable")


async def _errored_with_unsent_failed_status(store, order_id):
    await store.create_if_absent(make_record(order_id, NOW))
    claimed = await claim(store, order_id, NOW, POLICY)
    record, _ = await store.update(
        order_id,
        lambda r: sm.request_compensation(
            sm.mark_failed(r, claimed.LockedBy, None, "declined", NOW), NOW
        ),
        claimed.LockedBy,
    )
    assert record.PendingStatus is not None
    assert record.CompensationRequested
    return record.PendingStatus.MessageId


async def test_the_failed_status_is_sent_before_the_compensation_starts(state_store):
    failed_id = await _errored_with_unsent_failed_status(state_store, "CMP-OUTBOX-1")
    bus = RecordingPublisher()
    client = Client(bus)
    later = NOW + timedelta(minutes=5)
    await Starter(SETTINGS, state_store, clock=ReadClock(lambda: later), publisher=bus).run(client)
    assert client.started == ["CMP-OUTBOX-1:2"]
    assert client.told_before_start == [failed_id]
    record, _ = await state_store.read("CMP-OUTBOX-1")
    assert record.ProcessState is ProcessState.COMPENSATING
    assert record.PendingStatus is None


async def test_a_failed_status_that_cannot_be_sent_survives_the_claim(state_store):
    failed_id = await _errored_with_unsent_failed_status(state_store, "CMP-OUTBOX-2")
    later = NOW + timedelta(minutes=5)
    client = Client(RecordingPublisher())
    await Starter(
        SETTINGS, state_store, clock=ReadClock(lambda: later), publisher=DownPublisher()
    ).run(client)
    assert client.started == ["CMP-OUTBOX-2:2"]
    record, _ = await state_store.read("CMP-OUTBOX-2")
    assert record.ProcessState is ProcessState.COMPENSATING
    assert record.PendingStatus is not None
    assert record.PendingStatus.MessageId == failed_id
    # The Starter's next run delivers it (the entry is past its grace)
    bus = client.bus = RecordingPublisher()
    await Starter(SETTINGS, state_store, clock=ReadClock(lambda: later), publisher=bus).run(client)
    assert failed_id in [mid for q, _, mid, _ in bus.sent if q == "replies-webshop"]
    record, _ = await state_store.read("CMP-OUTBOX-2")
    assert record.PendingStatus is None
