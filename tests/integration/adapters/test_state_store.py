"""CosmosStateStore against the local Cosmos DB server: conditional writes,
the LockedBy guard, claims, queries, the backlog gauge, request charges and
error translation."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from azure.cosmos.aio import ContainerProxy

from adapters.cosmos_client import KindCharges, RequestCharges, build_client
from adapters.ports import ANY_OWNER
from adapters.settings import CosmosAccount
from adapters.state_store import BACKLOG_GAUGE_ID, CosmosStateStore
from devstack.cosmos import CosmosServer, FaultRule, get_faults, set_faults
from domain import admission
from domain import state_machine as sm
from domain.boundary import check_order_id
from domain.errors import (
    ConflictError,
    NotFoundError,
    PermanentError,
    StaleError,
    TransientError,
)
from domain.models import OrderState, ProcessState
from tests.builders import claim, start_step
from tests.integration.adapters.builders import NOW, POLICY, STEPS, make_record

FIXED_WIDTH_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


async def test_create_if_absent_creates_once_and_returns_the_stored_record(
    state_store: CosmosStateStore,
) -> None:
    first = make_record("ORD-1")
    stored, etag, created = await state_store.create_if_absent(first)
    assert created
    assert stored == first

    other = first.model_copy(update={"ReceivedSent": True})
    again, again_etag, created_again = await state_store.create_if_absent(other)
    assert not created_again
    assert again == first  # never overwritten
    assert again_etag == etag


async def test_read_of_a_missing_record_is_not_found(state_store: CosmosStateStore) -> None:
    with pytest.raises(NotFoundError):
        await state_store.read("NOPE-1")


async def test_records_round_trip_with_fixed_width_utc_times(
    state_store: CosmosStateStore, state_container: ContainerProxy
) -> None:
    paris = timezone(timedelta(hours=1))
    record = sm.claim(make_record("ORD-T"), NOW, POLICY).model_copy(
        update={"CompleteBy": datetime(2026, 1, 1, 13, 30, tzinfo=paris)}
    )
    await state_store.create_if_absent(record)

    raw = await state_container.read_item("ORD-T", partition_key="ORD-T")
    assert raw["CompleteBy"] == "2026-01-01T12:30:00.000000Z"
    assert all(FIXED_WIDTH_UTC.match(raw[f]) for f in ("CreatedAt", "UpdatedAt"))
    assert "ttl" not in raw  # unset: the container default (never expire)

    read, etag = await state_store.read("ORD-T")
    assert read == record
    assert etag == raw["_etag"]


async def test_replace_with_a_stale_etag_is_rejected_as_stale(
    state_store: CosmosStateStore,
) -> None:
    record, etag, _ = await state_store.create_if_absent(make_record("ORD-2"))
    newer = await state_store.replace(record.model_copy(update={"ReceivedSent": True}), etag)
    assert newer != etag

    with pytest.raises(StaleError):
        await state_store.replace(record.model_copy(update={"LastError": "late"}), etag)
    current, current_etag = await state_store.read("ORD-2")
    assert current.ReceivedSent
    assert current.LastError is None
    assert current_etag == newer


async def test_twenty_conditional_replaces_on_one_etag_have_one_winner(
    state_store: CosmosStateStore,
) -> None:
    record, etag, _ = await state_store.create_if_absent(make_record("ORD-3"))
    writes = [
        state_store.replace(record.model_copy(update={"LastError": f"writer {i}"}), etag)
        for i in range(20)
    ]
    results = await asyncio.gather(*writes, return_exceptions=True)
    winners = [i for i, r in enumerate(results) if isinstance(r, str)]
    assert len(winners) == 1
    assert sum(isinstance(r, StaleError) for r in results) == 19
    current, _ = await state_store.read("ORD-3")
    assert current.LastError == f"writer {winners[0]}"


async def test_twenty_concurrent_claims_of_one_record_have_one_winner(
    state_store: CosmosStateStore,
) -> None:
    await state_store.create_if_absent(make_record("ORD-4"))
    claims = await asyncio.gather(*(claim(state_store, "ORD-4", NOW, POLICY) for _ in range(20)))

    winners = [c for c in claims if c is not None]
    assert len(winners) == 1
    assert claims.count(None) == 19
    current, _ = await state_store.read("ORD-4")
    assert current.ProcessState is ProcessState.PROCESSING
    assert current.Attempt == 1
    assert current.LockedBy == "ORD-4:1"
    assert current.CompleteBy == NOW + POLICY.claim_timeout
    assert current == winners[0]


async def test_claim_of_a_record_that_is_not_claimable_returns_none(
    state_store: CosmosStateStore,
) -> None:
    assert await claim(state_store, "ABSENT-1", NOW, POLICY) is None
    await state_store.create_if_absent(make_record("ORD-5"))
    assert await claim(state_store, "ORD-5", NOW, POLICY) is not None
    _, etag = await state_store.read("ORD-5")
    assert await claim(state_store, "ORD-5", NOW, POLICY) is None  # already Processing
    assert (await state_store.read("ORD-5"))[1] == etag  # and nothing was written


async def test_update_by_the_lock_owner_applies_the_transition(
    state_store: CosmosStateStore,
) -> None:
    await state_store.create_if_absent(make_record("ORD-6"))
    claimed = await claim(state_store, "ORD-6", NOW, POLICY)
    assert claimed is not None
    owner = claimed.LockedBy
    deadline = NOW + timedelta(minutes=5)

    updated, etag = await state_store.update(
        "ORD-6", lambda r: start_step(r, STEPS[0], NOW, deadline), owner
    )
    assert updated.CompleteBy == deadline
    assert await state_store.read("ORD-6") == (updated, etag)


async def test_update_with_a_wrong_locked_by_is_stale_and_writes_nothing(
    state_store: CosmosStateStore,
) -> None:
    await state_store.create_if_absent(make_record("ORD-7"))
    await claim(state_store, "ORD-7", NOW, POLICY)  # LockedBy ORD-7:1
    before = await state_store.read("ORD-7")
    called = []

    def mutate(record: OrderState) -> OrderState:
        called.append(record)
        return record.model_copy(update={"LastError": "from a stale attempt"})

    with pytest.raises(StaleError):
        await state_store.update("ORD-7", mutate, "ORD-7:0")
    with pytest.raises(StaleError):
        await state_store.update("ORD-7", mutate, None)
    assert called == []
    assert await state_store.read("ORD-7") == before


async def test_update_that_loses_a_race_rechecks_the_guard_on_the_new_version(
    state_store: CosmosStateStore,
) -> None:
    """A concurrent writer changes the record between our read and our write.
    If it kept the lock, the update is redone on the new version; if it took
    the lock away, the update must not be written at all."""
    await state_store.create_if_absent(make_record("ORD-8"))
    claimed = await claim(state_store, "ORD-8", NOW, POLICY)
    assert claimed is not None
    owner = claimed.LockedBy
    seen: list[OrderState] = []

    async def interloper(change: dict) -> None:
        record, etag = await state_store.read("ORD-8")
        await state_store.replace(record.model_copy(update=change), etag)

    # The first call of `mutate` happens after update() read the record; the
    # interloper's write lands before update() replaces it.
    pending_interlopers = [{"LastError": "same owner, other write"}]

    def mutate(record: OrderState) -> OrderState:
        seen.append(record)
        # Always a change (so always a write): a later UpdatedAt.
        return record.model_copy(
            update={"ReceivedSent": True, "UpdatedAt": record.UpdatedAt + timedelta(seconds=1)}
        )

    async def racing_update() -> tuple[OrderState, str]:
        original_replace = state_store.replace

        async def replace_after_interloper(record: OrderState, etag: str) -> str:
            if pending_interlopers:
                await interloper(pending_interlopers.pop())
            return await original_replace(record, etag)

        state_store.replace = replace_after_interloper  # type: ignore[method-assign]
        try:
            return await state_store.update("ORD-8", mutate, owner)
        finally:
            del state_store.replace

    updated, _ = await racing_update()
    assert len(seen) == 2  # lost the race once, redone on the new version
    assert updated.ReceivedSent
    assert updated.LastError == "same owner, other write"

    # Now the interloper is a Supervisor that recovers the record (lock gone).
    seen.clear()
    pending_interlopers.append({"LockedBy": None, "ProcessState": ProcessState.PENDING})
    with pytest.raises(StaleError):
        await racing_update()
    assert len(seen) == 1
    current, _ = await state_store.read("ORD-8")
    assert current.LockedBy is None
    assert current.ProcessState is ProcessState.PENDING
    assert current.ReceivedSent  # from the first update
    assert current.UpdatedAt == updated.UpdatedAt  # the second one wrote nothing


async def test_update_that_changes_nothing_writes_nothing(state_store: CosmosStateStore) -> None:
    _, etag, _ = await state_store.create_if_absent(make_record("ORD-9"))
    _record, same_etag = await state_store.update("ORD-9", lambda r: r, ANY_OWNER)
    assert same_etag == etag
    assert "replace" not in state_store.charges.by_kind


async def test_query_claimable_returns_only_claimable_records(
    state_store: CosmosStateStore,
) -> None:
    later = NOW + timedelta(hours=1)
    await state_store.create_if_absent(make_record("P-READY"))
    await state_store.create_if_absent(
        make_record("P-WAITING").model_copy(update={"NotBefore": later})
    )
    await state_store.create_if_absent(
        make_record("P-WOKEN").model_copy(update={"NotBefore": NOW - timedelta(seconds=1)})
    )
    await state_store.create_if_absent(sm.claim(make_record("P-CLAIMED"), NOW, POLICY))
    await state_store.write_backlog_gauge(4, NOW)

    found = await state_store.query_claimable(10, NOW)
    assert sorted(r.id for r, _ in found) == ["P-READY", "P-WOKEN"]

    for i in range(5):
        await state_store.create_if_absent(make_record(f"P-MORE-{i}"))
    assert len(await state_store.query_claimable(3, NOW)) == 3


async def test_the_admission_document_takes_only_conditional_writes(
    state_store: CosmosStateStore,
) -> None:
    # Two hosts that read it at one etag: one write wins, the other is stale
    # and must read again, so the two cannot both take the last slot.
    assert await state_store.read_admission() is None
    first = admission.first(500, 50, 3, NOW)
    etag = await state_store.write_admission(first, None)
    with pytest.raises(ConflictError):
        await state_store.write_admission(first, None)
    mine, _ = admission.take(first, 10, NOW + timedelta(seconds=1), retries=2)
    theirs, _ = admission.take(first, 40, NOW + timedelta(seconds=1))

    await state_store.write_admission(mine, etag)
    with pytest.raises(StaleError):
        await state_store.write_admission(theirs, etag)

    stored, _ = await state_store.read_admission()
    assert stored == mine
    assert stored.estimate() == 13
    assert await state_store.count_in_state(ProcessState.PROCESSING) == 0  # no record


async def test_backlog_gauge_is_written_from_a_count_and_read_by_point_read(
    state_store: CosmosStateStore,
) -> None:
    with pytest.raises(ValueError, match="OrderID"):
        check_order_id(BACKLOG_GAUGE_ID)  # can never be an order's id
    assert await state_store.read_backlog_gauge() is None

    for i in range(3):
        await state_store.create_if_absent(make_record(f"G-{i}"))
    await claim(state_store, "G-0", NOW, POLICY)
    assert await state_store.count_in_state(ProcessState.PROCESSING) == 1
    assert await state_store.count_in_state("Pending") == 2
    await state_store.write_backlog_gauge(2, NOW)

    state_store.charges.by_kind.clear()
    pending, measured_at, processing = await state_store.read_backlog_gauge()
    assert (pending, measured_at, processing) == (2, NOW, None)
    assert state_store.charges.by_kind == {"gauge_read": KindCharges(1, 1.0, 0)}

    await state_store.write_backlog_gauge(7, NOW + timedelta(seconds=5))
    assert await state_store.read_backlog_gauge() == (7, NOW + timedelta(seconds=5), None)
    # with the records in flight, which every host's fast path checks the cap against
    await state_store.write_backlog_gauge(7, NOW + timedelta(seconds=10), processing=3)
    assert await state_store.read_backlog_gauge() == (7, NOW + timedelta(seconds=10), 3)


async def test_request_charges_are_recorded_per_call_by_kind(
    state_store: CosmosStateStore, request_charges: RequestCharges
) -> None:
    record, etag, _ = await state_store.create_if_absent(make_record("RC-1"))
    await state_store.read("RC-1")
    await state_store.replace(record.model_copy(update={"ReceivedSent": True}), etag)
    with pytest.raises(StaleError):
        await state_store.replace(record, etag)  # a failed call costs too
    with pytest.raises(NotFoundError):
        await state_store.read("RC-ABSENT")
    await state_store.query_claimable(10, NOW)

    assert state_store.charges is request_charges
    # The local server charges 1 RU per request; Azure's real charges flow the same way.
    assert request_charges.by_kind == {
        "create": KindCharges(calls=1, request_units=1.0, failures=0),
        "read": KindCharges(calls=2, request_units=2.0, failures=1),  # the 404
        "replace": KindCharges(calls=2, request_units=2.0, failures=1),  # the 412
        "query_pending": KindCharges(calls=1, request_units=1.0, failures=0),
    }
    assert request_charges.total == 6.0


@pytest.mark.parametrize("status", [429, 503])
async def test_a_throttled_store_raises_transient_error_with_retry_after(
    status: int,
    cosmos_server: CosmosServer,
    cosmos_account: CosmosAccount,
    cosmos_database: str,
    state_container: ContainerProxy,
) -> None:
    await CosmosStateStore(state_container).create_if_absent(make_record("TH-1"))
    client = build_client(cosmos_account, throttle_retries=0)
    try:
        container = client.get_database_client(cosmos_database).get_container_client(
            state_container.id
        )
        store = CosmosStateStore(container)
        await store.read("TH-1")  # container metadata cached before the faults start
        set_faults(
            cosmos_server.endpoint,
            FaultRule(status=status, db=cosmos_database, retry_after_ms=250),
        )
        with pytest.raises(TransientError) as caught:
            await store.read("TH-1")
        assert caught.value.retry_after == 0.25
        assert store.charges.by_kind["read"].failures == 1
        if status == 503:
            return  # the SDK retries a 503 once after 0.5 s: one call is enough here
        with pytest.raises(TransientError):
            await claim(store, "TH-1", NOW, POLICY)
        with pytest.raises(TransientError):
            await store.create_if_absent(make_record("TH-2"))
        with pytest.raises(TransientError):
            await store.query_expired(NOW, NOW - timedelta(hours=1), 10)
        assert store.charges.by_kind["read"].failures == 2
    finally:
        await client.close()


async def test_the_sdk_absorbs_a_short_burst_of_throttling_within_its_budget(
    cosmos_server: CosmosServer,
    cosmos_faults: Callable[..., None],
    cosmos_account: CosmosAccount,
    cosmos_database: str,
    state_container: ContainerProxy,
) -> None:
    await CosmosStateStore(state_container).create_if_absent(make_record("TH-3"))
    client = build_client(cosmos_account, throttle_retries=3)
    try:
        container = client.get_database_client(cosmos_database).get_container_client(
            state_container.id
        )
        store = CosmosStateStore(container)
        await store.read("TH-3")
        cosmos_faults(FaultRule(status=429, db=cosmos_database, retry_after_ms=10, count=2))
        record, _ = await store.read("TH-3")
        assert record.id == "TH-3"
        (rule,) = get_faults(cosmos_server.endpoint)
        assert rule["fired"] == 2

        cosmos_faults(FaultRule(status=429, db=cosmos_database, retry_after_ms=10, count=4))
        with pytest.raises(TransientError):  # 1 try + 3 retries, all throttled
            await store.read("TH-3")
    finally:
        await client.close()


async def test_a_create_that_conflicts_but_is_never_read_back_is_transient(
    state_store: CosmosStateStore,
    state_container: ContainerProxy,
    cosmos_database: str,
    cosmos_faults: Callable[..., None],
) -> None:
    """409 on the create, then 404 on every read of the record (a replica
    that has not seen another host's create): no verdict on the order, only
    "try again" (simulation seed 5000057). It was a StaleError, which Submit
    dead-lettered ProcessingFailed."""
    record = make_record("LAG-1")
    await state_store.create_if_absent(record)
    cosmos_faults(
        FaultRule(status=404, db=cosmos_database, coll=state_container.id, method="GET", count=3)
    )
    with pytest.raises(TransientError, match="create conflicted but a read did not find it"):
        await state_store.create_if_absent(record)
    stored, _, created = await state_store.create_if_absent(record)  # the replica caught up
    assert (stored, created) == (record, False)


def test_naive_datetimes_are_refused() -> None:
    from adapters.state_store import cosmos_time

    assert cosmos_time(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-01-01T00:00:00.000000Z"
    with pytest.raises(ValueError, match="naive datetimes"):
        cosmos_time(datetime(2026, 1, 1))


async def test_queries_skip_a_document_that_is_not_a_valid_record(
    state_store: CosmosStateStore, state_container: ContainerProxy
) -> None:
    # One bad document must not stop every Starter run; reading it directly fails.
    await state_container.create_item({"id": "BAD-1", "ProcessState": "Pending", "LockedBy": None})
    await state_store.create_if_absent(make_record("GOOD-1"))
    assert [r.id for r, _ in await state_store.query_claimable(10, NOW)] == ["GOOD-1"]
    with pytest.raises(PermanentError):
        await state_store.read("BAD-1")


async def test_counts_leave_out_a_document_that_is_no_record(
    state_store: CosmosStateStore, state_container: ContainerProxy
) -> None:
    # Garbage left Processing (a portal edit, another program) is never
    # recovered: counted, it would hold an admission slot for good.
    await state_container.create_item(
        {"id": "JUNK-P", "ProcessState": "Processing", "LockedBy": "JUNK-P:1", "Attempt": 1}
    )
    await state_container.create_item({"id": "JUNK-Q", "ProcessState": "Pending"})
    for i in range(2):
        await state_store.create_if_absent(make_record(f"C-{i}"))
    await claim(state_store, "C-0", NOW, POLICY)
    assert await state_store.count_in_state(ProcessState.PROCESSING) == 1
    assert await state_store.count_in_state(ProcessState.PENDING) == 1


async def test_unsent_statuses_are_found_after_their_grace_and_not_once_cleared(
    state_store: CosmosStateStore,
) -> None:
    """The outbox query (docs/adr/001-status-outbox.md) on the real server:
    terminal records with a pending status older than `before`, nothing else."""
    for order_id in ("OUT-1", "OUT-2", "OUT-3"):
        await state_store.create_if_absent(make_record(order_id))
        claimed = await claim(state_store, order_id, NOW, POLICY)
        assert claimed is not None
    await state_store.update(
        "OUT-1", lambda r: sm.mark_failed(r, "OUT-1:1", None, "declined", NOW), "OUT-1:1"
    )
    later = NOW + timedelta(minutes=5)
    await state_store.update(
        "OUT-2", lambda r: sm.mark_failed(r, "OUT-2:1", None, "declined", later), "OUT-2:1"
    )

    found = await state_store.query_unsent_statuses(10, NOW + timedelta(minutes=1))
    assert [record.id for record, _ in found] == ["OUT-1"]
    record, etag = found[0]
    assert record.PendingStatus is not None
    assert record.PendingStatus.Status.value == "Failed"

    await state_store.replace(
        sm.mark_status_sent(record, record.PendingStatus.MessageId, NOW), etag
    )
    assert await state_store.query_unsent_statuses(10, NOW + timedelta(minutes=1)) == []
    assert [
        r.id for r, _ in await state_store.query_unsent_statuses(10, later + timedelta(seconds=1))
    ] == ["OUT-2"]


async def test_claims_on_a_known_etag_have_one_winner_and_cost_one_request_each(
    state_store: CosmosStateStore,
) -> None:
    """The Starter's query result (or Submit's create) and a fast-path claim
    racing on one etag: one replace each, one winner, nothing read."""
    _, etag, _ = await state_store.create_if_absent(make_record("ORD-K"))
    [(record, queried_etag)] = [
        p for p in await state_store.query_claimable(50, NOW) if p[0].id == "ORD-K"
    ]
    assert queried_etag == etag
    calls = state_store.charges.calls
    reads = state_store.charges.by_kind.get("read", KindCharges()).calls
    marks = ([], NOW + POLICY.claim_timeout)  # the claim alone, marking no step
    results = await asyncio.gather(
        *(state_store.claim_known(record, etag, NOW, POLICY, marks) for _ in range(10))
    )
    assert state_store.charges.calls - calls == 10  # one replace each (412s are recorded too)
    assert state_store.charges.by_kind.get("read", KindCharges()).calls == reads
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    claimed, claimed_etag = winners[0]
    current, current_etag = await state_store.read("ORD-K")
    assert current == claimed
    assert current_etag == claimed_etag
    assert current.LockedBy == "ORD-K:1"
    assert current.CompleteBy == NOW + POLICY.claim_timeout
    # a stale etag, or a record no longer claimable, never writes
    assert await state_store.claim_known(record, etag, NOW, POLICY, marks) is None
    assert await state_store.claim_known(current, current_etag, NOW, POLICY, marks) is None
    assert (await state_store.read("ORD-K"))[1] == current_etag


async def test_records_in_a_state_page_by_id_and_skip_bad_documents(
    state_store: CosmosStateStore, state_container: ContainerProxy
) -> None:
    """The Starter's walk over Compensating records (issue 21 items 4 and 6):
    every record is reached page by page, and one document this version cannot
    read (here: a wrong type) is left out rather than failing the query."""
    names = [f"CMP-{i:02d}" for i in range(7)]
    for name in names:
        await state_store.create_if_absent(
            make_record(name).model_copy(update={"ProcessState": ProcessState.COMPENSATING})
        )
    await state_store.create_if_absent(make_record("PND-1"))
    await state_container.create_item(
        {"id": "CMP-03x", "ProcessState": "Compensating", "FailureCount": "many"}
    )
    seen: list[str] = []
    after = None
    while True:
        page, after = await state_store.query_in_state_after(ProcessState.COMPENSATING, 3, after)
        seen += [r.id for r in page]
        if after is None:
            break
    assert seen == names
    assert [r.id for r in await state_store.query_in_state(ProcessState.COMPENSATING, 20)] != []
