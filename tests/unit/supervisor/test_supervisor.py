"""Supervisor decisions with fakes behind the project's ports; the same runs
against the real Cosmos server are in tests/integration/supervisor."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from domain import state_machine as sm
from domain.errors import StaleError
from domain.models import OrderSubmitted, ProcessState
from reporting import Alerts, StatusReporter
from supervisor.sources import QuerySource
from supervisor.supervisor import Supervisor
from tests.builders import ReadClock, claim
from tests.fakes import FakeStateStore, RecordingPublisher
from tests.unit.domain.conftest import STEPS, order_payload

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = sm.RetryPolicy(
    threshold=2, long_retries=1, long_delay=timedelta(hours=1), claim_timeout=timedelta(seconds=60)
)


class MemoryCheckpoints:
    def __init__(self):
        self.value = None

    async def load(self):
        return self.value

    async def save(self, checkpoint):
        self.value = checkpoint


class Rig:
    def __init__(self, page_size=10, slack=timedelta(seconds=5)):
        self.now = T0
        self.store, self.bus, self.checkpoints = (
            FakeStateStore(),
            RecordingPublisher(),
            MemoryCheckpoints(),
        )
        self.sup = Supervisor(
            self.store,
            QuerySource(self.store),
            self.checkpoints,
            StatusReporter(self.bus),
            Alerts(self.bus),
            POLICY,
            page_size,
            slack=slack,
            clock=ReadClock(lambda: self.now),
        )

    async def add(self, order_id: str, claimed_at: datetime) -> None:
        # Keyed by the bare OrderID, as records written before keys named the
        # application are: the Supervisor takes keys from records, in either form.
        order = OrderSubmitted.model_validate(order_payload(OrderID=order_id))
        record = sm.claim(sm.new_record(order, claimed_at, STEPS, key=order_id), claimed_at, POLICY)
        await self.store.create_if_absent(record)

    async def state(self, order_id):
        return (await self.store.read(order_id))[0]


async def test_expired_record_goes_back_to_pending():
    rig = Rig()
    await rig.add("A", T0)
    rig.now = T0 + timedelta(minutes=5)
    report = await rig.sup.run()
    assert (report.examined, report.recovered) == (1, 1)
    record = await rig.state("A")
    assert record.ProcessState is ProcessState.PENDING
    assert record.FailureCount == 1


async def test_live_attempt_is_left_alone_within_slack():
    rig = Rig(slack=timedelta(seconds=30))
    await rig.add("A", T0)
    rig.now = T0 + timedelta(seconds=80)  # 20 s past CompleteBy, inside the slack
    report = await rig.sup.run()
    assert report.examined == 0
    assert (await rig.state("A")).ProcessState is ProcessState.PROCESSING


async def test_budget_ends_in_error_with_alert_and_failed_status():
    rig = Rig()
    await rig.add("A", T0)
    outcomes = []
    for _ in range(5):
        record = await rig.state("A")
        if record.ProcessState is ProcessState.ERROR:
            break
        rig.now = max(rig.now, record.NotBefore or rig.now) + timedelta(seconds=1)
        if record.ProcessState is ProcessState.PENDING:
            assert await claim(rig.store, "A", rig.now, POLICY) is not None
        rig.now += timedelta(minutes=5)
        report = await rig.sup.run()
        outcomes.append((report.recovered, report.long_retry, report.failed))
    assert outcomes == [(1, 0, 0), (0, 1, 0), (0, 0, 1)]
    record = await rig.state("A")
    assert record.FailureCount == POLICY.max_failures
    assert [json.loads(b)["Kind"] for b in rig.bus.to("alerts")] == ["OrderError"]
    assert [json.loads(b)["Status"] for b in rig.bus.to("replies-webshop")] == ["Failed"]


async def test_pages_resume_with_checkpoint_and_cost_is_bounded():
    rig = Rig(page_size=3)
    for i in range(8):
        await rig.add(f"O{i}", T0 + timedelta(seconds=i))
    rig.now = T0 + timedelta(minutes=10)
    seen = []
    for _ in range(3):
        report = await rig.sup.run()
        assert report.examined <= 3
        seen.append(report.examined)
    assert seen == [3, 3, 2]
    states = [(await rig.state(f"O{i}")).ProcessState for i in range(8)]
    assert states == [ProcessState.PENDING] * 8
    assert rig.checkpoints.value is None  # pass finished


async def test_record_recovered_by_another_supervisor_is_skipped():
    rig = Rig()
    await rig.add("A", T0)
    rig.now = T0 + timedelta(minutes=5)
    other = Supervisor(
        rig.store,
        QuerySource(rig.store),
        MemoryCheckpoints(),
        StatusReporter(rig.bus),
        Alerts(rig.bus),
        POLICY,
        10,
        clock=ReadClock(lambda: rig.now),
    )
    page, _ = await rig.store.query_expired(rig.now, T0 - timedelta(days=1), 10, None)
    await other.run()
    # acting on what was read before the other supervisor wrote is refused
    record, _ = page[0]
    with pytest.raises(StaleError):
        await rig.store.update(
            "A", lambda r: sm.recover_expired(r, record.LockedBy, rig.now, POLICY), record.LockedBy
        )
    assert (await rig.state("A")).FailureCount == 1


async def _gave_up(rig):
    """A record one failure short of Error, its deadline passed."""
    await rig.add("A", T0)
    await rig.store.update(
        "A", lambda r: r.model_copy(update={"FailureCount": POLICY.max_failures - 1}), "A:1"
    )
    rig.now = T0 + timedelta(minutes=5)


async def test_failed_status_send_after_error_is_delivered_later():
    """Defect 6: the Supervisor writes Error, then the Failed send raises;
    the run goes on, and the Starter delivers the status later with the
    same message id."""
    from orchestrators.starter import Starter
    from tests.unit.orchestrators.driver import SETTINGS

    rig = Rig()
    await _gave_up(rig)
    real_send = rig.bus.send

    async def reply_queue_down(queue, body, message_id, props=None):
        if queue == "replies-webshop":
            raise ConnectionError("reply queue unavailable")
        await real_send(queue, body, message_id, props)

    rig.bus.send = reply_queue_down
    report = await rig.sup.run()
    assert (report.failed, report.status_unsent) == (1, 1)
    record = await rig.state("A")
    assert record.ProcessState is ProcessState.ERROR
    assert record.PendingStatus is not None
    assert any(q == "alerts" for q, *_ in rig.bus.sent)  # the alert still went out

    rig.bus.send = real_send
    rig.now += timedelta(minutes=1)

    class NoClient:
        async def get_status(self, instance_id):
            return None

    starter = Starter(SETTINGS, rig.store, clock=ReadClock(lambda: rig.now), publisher=rig.bus)
    assert (await starter.run(NoClient())).statuses_delivered == 1
    sent = [(json.loads(body), mid) for q, body, mid, _ in rig.bus.sent if q == "replies-webshop"]
    assert [(b["Status"], mid) for b, mid in sent] == [("Failed", record.PendingStatus.MessageId)]
    assert (await rig.state("A")).PendingStatus is None


async def test_failed_alert_send_after_error_is_retried_not_only_logged():
    """Defect 6 (alerts; simulation seed 239 --orders 3): the Supervisor writes
    Error and the OrderError alert send fails. The alert rides in the record's
    outbox with the Failed status, so the Starter sends it later; the client's
    Failed status does not wait for it (the alerts queue refusing for long)."""
    from orchestrators.starter import Starter
    from tests.unit.orchestrators.driver import SETTINGS

    rig = Rig()
    await _gave_up(rig)
    real_send = rig.bus.send

    async def alerts_down(queue, body, message_id, props=None):
        if queue == "alerts":
            raise ConnectionError("alerts queue unavailable")
        await real_send(queue, body, message_id, props)

    rig.bus.send = alerts_down
    report = await rig.sup.run()
    assert (report.failed, report.status_unsent) == (1, 0)
    assert [json.loads(b)["Status"] for b in rig.bus.to("replies-webshop")] == ["Failed"]
    assert rig.bus.to("alerts") == []
    pending = (await rig.state("A")).PendingStatus
    assert pending is not None
    assert pending.Sent

    rig.bus.send = real_send
    rig.now += timedelta(minutes=1)

    class NoClient:
        async def get_status(self, instance_id):
            return None

    starter = Starter(SETTINGS, rig.store, clock=ReadClock(lambda: rig.now), publisher=rig.bus)
    assert (await starter.run(NoClient())).statuses_delivered == 0  # the alert alone was left
    alerts = [json.loads(body) for body in rig.bus.to("alerts")]
    assert [(a["Kind"], a["OrderID"]) for a in alerts] == [("OrderError", "A")]
    assert [q for q, *_ in rig.bus.sends if q == "replies-webshop"] == ["replies-webshop"]
    assert (await rig.state("A")).PendingStatus is None


async def test_query_source_recovers_records_older_than_seven_days():
    """Defect 9: after a long outage, old Processing records are still found."""
    rig = Rig()
    await rig.add("A", T0)
    rig.now = T0 + timedelta(days=30)
    report = await rig.sup.run()
    assert report.recovered == 1
    assert (await rig.state("A")).ProcessState is ProcessState.PENDING


async def test_a_store_failure_while_clearing_the_outbox_does_not_stop_the_run():
    from domain.errors import TransientError

    rig = Rig()
    await _gave_up(rig)
    await rig.add("B", T0)
    real_replace = rig.store.replace

    async def throttled_clear(record, etag):
        if record.ProcessState is ProcessState.ERROR and record.PendingStatus is None:
            raise TransientError("429")
        return await real_replace(record, etag)

    rig.store.replace = throttled_clear
    rig.store.update = _update_via(rig.store)
    report = await rig.sup.run()
    assert (report.failed, report.recovered) == (1, 1)
    assert [json.loads(b)["Status"] for q, b, *_ in rig.bus.sent if q == "replies-webshop"] == [
        "Failed"
    ]


def _update_via(store):
    """FakeStateStore.update, but through `store.replace` (so a patched
    replace applies to updates too)."""

    async def update(order_id, mutate, expected_locked_by):
        from adapters.ports import ANY_OWNER

        record, etag = await store.read(order_id)
        if expected_locked_by is not ANY_OWNER and record.LockedBy != expected_locked_by:
            raise StaleError(order_id)
        new = mutate(record)
        return new, await store.replace(new, etag)

    return update
