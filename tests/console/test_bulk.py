"""Bulk resubmit with confirmation (issue 45), against the real Cosmos
server: the orders list's checkboxes lead to one confirmation page naming
each chosen order (those that cannot be resubmitted left out, with why);
its POST acts on each order still at the version shown, with the
operator's name and reason, and says what became of each; a replay or an
order changed in between is refused order by order, nothing is done twice."""

from __future__ import annotations

import html
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest

from console import views
from domain import state_machine as sm
from domain.models import ProcessState
from tests.console.conftest import POLICY, errored_by_supervisor, pending
from tests.console.test_hostile_input import HOST, _call, _request
from tests.console.test_hostile_input import local as local_mode

local = local_mode  # the fixture: local mode over the real stores


def _confirm_page(ids: list[str]):
    query = urlencode([("id", i) for i in ids])
    return _call(
        "console_bulk_action",
        _request("GET", f"/bulk/resubmit?{query}", route={"action": "resubmit"}),
    )


def _fields(page: str, name: str) -> list[str]:
    return [
        html.unescape(part.split('"', 1)[0]) for part in page.split(f'name="{name}" value="')[1:]
    ]


async def _post(form: list[tuple[str, str]]):
    return await _call(
        "console_bulk_action",
        _request(
            "POST",
            "/bulk/resubmit",
            route={"action": "resubmit"},
            headers={"Origin": HOST, "Sec-Fetch-Site": "same-origin"},
            body=urlencode(form).encode(),
        ),
    )


async def test_bulk_resubmit_confirms_acts_once_per_order_and_says_what_became_of_each(local, now):
    for oid in ("BK-1", "BK-2", "BK-3"):
        await local.store.create_if_absent(errored_by_supervisor(oid, now))
    await local.store.create_if_absent(pending("BK-P", now))

    listing = await _call("console_orders", _request("GET", "/orders", {"state": "Error"}))
    assert 'id="bulk-form"' in listing.get_body().decode()

    page = await _confirm_page(["BK-1", "BK-2", "BK-P", "BK-1"])
    body = page.get_body().decode()
    assert page.status_code == 200, body
    assert "Resubmit 2 orders?" in body
    assert "left out:" in body  # the Pending one, with why
    ids, versions = _fields(body, "id"), _fields(body, "version")
    assert ids == ["BK-1", "BK-2"]
    (token,) = _fields(body, "csrf")
    form = [
        ("csrf", token),
        *[
            p
            for pair in zip(ids, versions, strict=True)
            for p in (("id", pair[0]), ("version", pair[1]))
        ],
    ]

    # without a reason: refused, nothing done
    refused = await _post(form)
    assert refused.status_code == 400
    assert (await local.store.read("BK-1"))[0].ProcessState is ProcessState.ERROR

    # BK-2 changes after the confirmation was shown: it alone is left as it is
    await views.act(local, "BK-2", "compensate", "someone", "asked by the customer")
    done = await _post([*form, ("reason", "payment provider fixed")])
    body = html.unescape(done.get_body().decode())
    assert done.status_code == 200, body
    assert "Resubmit: 1 of 2 done" in body
    one, _ = await local.store.read("BK-1")
    assert one.ProcessState is ProcessState.PENDING
    assert (one.History[-1].By, one.History[-1].Reason) == (
        "operator:local",
        "resubmitted: payment provider fixed",
    )
    two, _ = await local.store.read("BK-2")
    assert two.ProcessState is ProcessState.ERROR  # changed in between: not acted on

    # a replay acts on nothing
    replay = await _post([*form, ("reason", "payment provider fixed")])
    assert "Resubmit: 0 of 2 done" in html.unescape(replay.get_body().decode())
    one_again, _ = await local.store.read("BK-1")
    assert sum(1 for h in one_again.History if h.By == "operator:local") == 1

    # a token for another list does nothing
    other = await _post(
        [("csrf", token), ("id", "BK-3"), ("version", versions[0]), ("reason", "xyz")]
    )
    assert other.status_code == 403
    assert (await local.store.read("BK-3"))[0].ProcessState is ProcessState.ERROR


async def test_bulk_is_bounded(local):
    page = await _confirm_page([f"B-{i}" for i in range(51)])
    assert page.status_code == 400
    assert "at most 50" in page.get_body().decode()
    page = await _confirm_page([])
    assert page.status_code == 400


def _long_retry(order_id: str, now):
    """Pending again, waiting for its long retry (NotBefore in the future)."""
    record, t = pending(order_id, now), now
    while not (record.LongRetries and record.ProcessState is ProcessState.PENDING):
        record = sm.claim(record, t, POLICY)
        t = record.CompleteBy + timedelta(seconds=1)
        record = sm.recover_expired(record, record.LockedBy, t, POLICY)
    return record


async def test_retry_now_makes_a_long_retry_claimable_at_once(local, now):
    """Issue 45 item 6: an order in a long retry (next try hours away) is
    taken now, on the operator's word, with its budget unchanged."""
    record = _long_retry("LR-1", now)
    assert record.NotBefore > datetime.now(UTC)
    await local.store.create_if_absent(record)
    waiting = {r.id for r, _ in await local.store.query_claimable(50, datetime.now(UTC))}
    assert "LR-1" not in waiting
    page = await _call("console_order", _request("GET", "/orders/LR-1", route={"order_id": "LR-1"}))
    assert 'id="retry"' in page.get_body().decode()

    updated = await views.act(local, "LR-1", "retry", "local", "the provider is back")
    assert updated.NotBefore <= datetime.now(UTC)
    assert (updated.LongRetries, updated.FailureCount) == (record.LongRetries, record.FailureCount)
    assert updated.History[-1].Reason.endswith(": the provider is back")
    assert updated.History[-1].Reason.startswith("retry now, not at ")
    ready = {r.id for r, _ in await local.store.query_claimable(50, datetime.now(UTC))}
    assert "LR-1" in ready  # the Starter's own query takes it
    # nothing to retry any more: refused, nothing changed
    with pytest.raises(sm.IllegalTransition):
        await views.act(local, "LR-1", "retry", "local", "again please")
