"""Search beyond one exact OrderID (issue 45): the orders list by the start
of an OrderID, in one state or any, by age either way, against the real
Cosmos server, one request a page; and the header's search box, which opens
an order key and lists the orders whose OrderID starts with anything else."""

from __future__ import annotations

from datetime import timedelta

import pytest

from console import views
from domain import state_machine as sm
from domain.models import OrderSubmitted, ProcessState
from tests.builders import order_payload
from tests.console.conftest import POLICY, STEPS, order
from tests.console.test_hostile_input import _call, _request
from tests.console.test_hostile_input import local as local_mode

local = local_mode  # the fixture: local mode over the real stores


def _keyed(order_id: str, now, app: str = "webshop"):
    return sm.new_record(order(order_id, app), now, STEPS, key=f"{app}:{order_id}")


def _errored(order_id: str, now):
    """Error after its attempts missed their deadlines, keyed by application."""
    record, t = _keyed(order_id, now), now
    while record.ProcessState is not ProcessState.ERROR:
        record = sm.claim(record, t, POLICY)
        t = record.CompleteBy + timedelta(seconds=1)
        record = sm.recover_expired(record, record.LockedBy, t, POLICY)
        t = record.NotBefore or t
    return record


async def _seed(deps, now) -> None:
    await deps.store.create_if_absent(_errored("PFX-1", now - timedelta(hours=2)))
    await deps.store.create_if_absent(_keyed("PFX-2", now - timedelta(minutes=5)))
    await deps.store.create_if_absent(_keyed("PFX-3", now, app="partner-portal"))
    await deps.store.create_if_absent(_keyed("OTHER-PFX", now))
    await deps.store.create_if_absent(_keyed("pfx-lower", now))


async def _ids(deps, **params) -> list[str]:
    data = await views.orders(deps, views.parse_filters(params))
    return [item["row"].id for item in data["rows"]]


async def test_by_the_start_of_an_orderid_in_any_state(deps, now):
    await _seed(deps, now)
    before = deps.store.charges.calls
    found = await _ids(deps, state="any", prefix="PFX")
    assert deps.store.charges.calls - before == 1  # one query, whatever it matches
    # a prefix of the OrderID, not of the key; exact case; never the middle of an id
    assert found == ["partner-portal:PFX-3", "webshop:PFX-1", "webshop:PFX-2"]
    assert await _ids(deps, state="Error", prefix="PFX") == ["webshop:PFX-1"]
    assert await _ids(deps, state="any", prefix="PFX", app="partner-portal") == [
        "partner-portal:PFX-3"
    ]
    # by age, either way
    assert await _ids(deps, state="any", prefix="PFX", newer="60") == [
        "partner-portal:PFX-3",
        "webshop:PFX-2",
    ]
    assert await _ids(deps, state="any", prefix="PFX", older="60") == ["webshop:PFX-1"]


@pytest.mark.parametrize("prefix", ["a:b", "<b>", "x" * 65, "é"])
def test_a_prefix_that_no_orderid_starts_with_is_refused(prefix):
    with pytest.raises(views.BadRequest, match="OrderID prefix"):
        views.parse_filters({"prefix": prefix})


async def test_the_search_box_opens_a_key_and_lists_the_rest(local, now):
    await _seed(local, now)
    opened = await _call("console_find", _request("GET", "/find", {"id": "webshop:PFX-2"}))
    assert opened.status_code == 303
    assert opened.headers["Location"] == "/api/console/orders/webshop%3APFX-2"
    listed = await _call("console_find", _request("GET", "/find", {"id": " PFX "}))
    assert listed.status_code == 303
    assert listed.headers["Location"] == "/api/console/orders?state=any&prefix=PFX"
    page = await _call(
        "console_orders", _request("GET", "/orders", {"state": "any", "prefix": "PFX"})
    )
    body = page.get_body().decode()
    assert page.status_code == 200
    for key in ("webshop:PFX-1", "webshop:PFX-2", "partner-portal:PFX-3"):
        assert f">{key}</a>" in body
    assert "OTHER-PFX" not in body
    refused = await _call("console_find", _request("GET", "/find", {"id": "<b>x"}))
    assert refused.status_code == 404


async def test_a_page_refreshes_itself_when_asked_and_a_confirmation_never(local, now):
    await _seed(local, now)
    page = await _call("console_orders", _request("GET", "/orders", {"refresh": "10"}))
    body = page.get_body().decode()
    assert '<meta http-equiv="refresh" content="10">' in body
    assert "<strong>every 10 s</strong>" in body
    assert 'href="?" id="refresh-off"' in body
    for wrong in ("3", "601", "x", "\uff11\uff10"):  # fullwidth digits are not digits here
        page = await _call("console_orders", _request("GET", "/orders", {"refresh": wrong}))
        assert 'http-equiv="refresh"' not in page.get_body().decode(), wrong
    # the links keep the page's own filters, and never a one-off `done`
    page = await _call(
        "console_order",
        _request(
            "GET", "/orders/webshop:PFX-2", {"done": "resubmit"}, {"order_id": "webshop:PFX-2"}
        ),
    )
    body = page.get_body().decode()
    assert 'href="?refresh=30"' in body
    confirm = await _call(
        "console_action",
        _request(
            "GET",
            "/orders/webshop:PFX-1/resubmit",
            {"refresh": "10"},
            {"order_id": "webshop:PFX-1", "action": "resubmit"},
        ),
    )
    assert confirm.status_code == 200
    assert 'http-equiv="refresh"' not in confirm.get_body().decode()


async def test_by_customer(deps, now):
    """The orders of one customer: their keys from the orders database, then
    one page of their records (two queries), in any state or one."""
    for oid, customer in (("CU-1", "C-42"), ("CU-2", "C-42"), ("CU-3", "C-7")):
        submitted = OrderSubmitted.model_validate(
            order_payload(oid, Customer={"CustomerId": customer, "Name": "Ada"})
        )
        await deps.orders.store(submitted, f"webshop:{oid}")
        await deps.store.create_if_absent(_keyed(oid, now))
    before = deps.store.charges.calls
    assert await _ids(deps, state="any", customer="C-42") == ["webshop:CU-1", "webshop:CU-2"]
    assert await _ids(deps, state="Error", customer="C-42") == []
    assert await _ids(deps, state="any", customer="nobody") == []
    assert deps.store.charges.calls - before == 3  # the records' page, one query each
    with pytest.raises(views.BadRequest, match="customer"):
        views.parse_filters({"customer": "x" * 65})
