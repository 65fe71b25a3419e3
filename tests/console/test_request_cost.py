"""What each console view costs in Cosmos DB requests, against the real
Cosmos server: a fixed number per page, whatever the number of records
(docs/console.md has the table). The local server charges 1 RU per request, so
requests are what is measured here; the RU of each request in Azure grows with
the page size, not with the container."""

from __future__ import annotations

import json
from datetime import timedelta

from adapters.console_reads import MAX_PAGE
from console import views
from domain.models import ProcessState
from tests.console.conftest import errored_by_supervisor, pending, processed, processing

OVERVIEW_REQUESTS = len(ProcessState) + 3  # a COUNT per state, the gauge, throughput, Supervisor


async def _seed(store, now, prefix: str, errors: int, others: int) -> None:
    for i in range(errors):
        await store.create_if_absent(
            errored_by_supervisor(f"{prefix}-E{i:04d}", now - timedelta(minutes=10))
        )
    for i in range(others):
        make = (pending, processing, processed)[i % 3]
        await store.create_if_absent(make(f"{prefix}-O{i:04d}", now - timedelta(minutes=i % 50)))


def _calls(deps) -> int:
    return deps.store.charges.calls


async def _cost(deps, view) -> tuple[int, object]:
    before = _calls(deps)
    result = await view()
    return _calls(deps) - before, result


async def test_every_view_costs_the_same_with_ten_times_the_records(deps, now):
    store = deps.store
    await _seed(store, now, "A", errors=6, others=24)
    small = {
        "overview": (await _cost(deps, lambda: views.overview(deps)))[0],
        "orders": (
            await _cost(deps, lambda: views.orders(deps, views.parse_filters({"state": "Error"})))
        )[0],
        "stuck": (await _cost(deps, lambda: views.stuck(deps, None)))[0],
        "detail": (await _cost(deps, lambda: views.order_detail(deps, "A-E0000")))[0],
        "statuses": (await _cost(deps, lambda: views.parked_statuses(deps)))[0],
    }
    await _seed(store, now, "B", errors=60, others=240)
    large = {
        "overview": (await _cost(deps, lambda: views.overview(deps)))[0],
        "orders": (
            await _cost(deps, lambda: views.orders(deps, views.parse_filters({"state": "Error"})))
        )[0],
        "stuck": (await _cost(deps, lambda: views.stuck(deps, None)))[0],
        "detail": (await _cost(deps, lambda: views.order_detail(deps, "B-E0000")))[0],
        "statuses": (await _cost(deps, lambda: views.parked_statuses(deps)))[0],
    }
    assert (
        small
        == large
        == {
            "overview": OVERVIEW_REQUESTS,
            "orders": 1,
            "stuck": 1,
            "detail": 1,
            "statuses": 1,
        }
    )


async def test_overview_reads_what_it_shows(deps, state_container, now):
    await _seed(deps.store, now, "C", errors=2, others=9)
    # an order that ended Compensated, one CompensationFailed (stored as such)
    for oid, state in (("C-C0", "Compensated"), ("C-F0", "CompensationFailed")):
        doc = json.loads(processed(oid, now - timedelta(minutes=3)).model_dump_json())
        await state_container.upsert_item({**doc, "ProcessState": state})
    calls, data = await _cost(deps, lambda: views.overview(deps))
    assert calls == OVERVIEW_REQUESTS
    assert data["counts"]["Error"] == 2
    assert data["counts"]["Processed"] == 3
    assert data["counts"]["Processing"] == 3
    assert data["counts"]["Pending"] == 3
    assert data["throughput"]["total"] == {
        "Processed": 3,
        "Compensated": 1,
        "Error": 2,
        "CompensationFailed": 1,
    }
    # each errored record: two recoveries, one long retry and the final failure
    assert data["decision_totals"] == {"recovered": 2, "long-retry": 2, "failed": 2}


async def test_orders_pages_by_keyset_one_request_each(deps, now):
    await _seed(deps.store, now, "D", errors=0, others=0)
    ids = []
    for i in range(2 * views.PAGE_SIZE + 7):
        record = errored_by_supervisor(f"D-{i:04d}", now - timedelta(minutes=30))
        await deps.store.create_if_absent(record)
        ids.append(record.id)
    seen, pages, token = [], 0, None
    while True:
        calls, data = await _cost(
            deps,
            lambda t=token: views.orders(
                deps,
                views.parse_filters({"state": "Error", "page": t} if t else {"state": "Error"}),
            ),
        )
        assert calls == 1
        assert len(data["rows"]) <= views.PAGE_SIZE
        seen += [item["row"].id for item in data["rows"]]
        pages += 1
        token = data["next_page"]
        if token is None:
            break
    assert seen == sorted(ids)
    assert pages == 3


async def test_orders_filters_by_application_and_age(deps, now):
    await deps.store.create_if_absent(pending("F-old-web", now - timedelta(minutes=90)))
    await deps.store.create_if_absent(pending("F-new-web", now - timedelta(minutes=5)))
    await deps.store.create_if_absent(
        pending("F-old-partner", now - timedelta(minutes=90), app="partner-portal")
    )
    data = await views.orders(
        deps, views.parse_filters({"state": "Pending", "app": "webshop", "older": "60"})
    )
    assert [item["row"].id for item in data["rows"]] == ["F-old-web"]
    data = await views.orders(deps, views.parse_filters({"state": "Pending"}))
    assert [item["row"].id for item in data["rows"]] == ["F-new-web", "F-old-partner", "F-old-web"]


async def test_list_page_size_is_bounded(deps):
    import pytest

    with pytest.raises(ValueError, match="page_size must be"):
        await deps.reads.list_orders("Error", MAX_PAGE + 1)


async def test_resubmit_costs_a_read_and_a_conditional_replace(deps, now):
    record = errored_by_supervisor("G-1", now - timedelta(minutes=10))
    await deps.store.create_if_absent(record)
    calls, updated = await _cost(
        deps, lambda: views.act(deps, "G-1", "resubmit", "ada@example.com", "cause fixed")
    )
    assert calls == 2
    assert updated.ProcessState is ProcessState.PENDING
    stored, _ = await deps.store.read("G-1")
    assert stored.History[-1].By == "operator:ada@example.com"
    assert (stored.History[-1].From, stored.History[-1].To) == (
        ProcessState.ERROR,
        ProcessState.PENDING,
    )


async def test_order_detail_reads_one_record_and_one_order(deps, now):
    from tests.console.conftest import order

    await deps.store.create_if_absent(processed("H-1", now))
    await deps.orders.store(order("H-1"), "H-1")  # keyed as the record is
    state_before, orders_before = deps.store.charges.calls, deps.orders.charges.calls
    data = await views.order_detail(deps, "H-1")
    assert data["order"]["Customer"]["CustomerId"] == "C-7"
    assert "PaymentReference" not in data["order"]
    assert (deps.store.charges.calls - state_before, deps.orders.charges.calls - orders_before) == (
        1,
        1,
    )
