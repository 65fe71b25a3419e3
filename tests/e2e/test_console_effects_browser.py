"""Each step's effect, as the console's order page says it, against the remote
service's own ledger (`/_admin/side-effects`: the effects it applied;
`/_admin/requests`: the calls it received), in headless Chromium on the whole
local stack. Orders are driven into each state with the remote service's
fault rules: Processed; Failed at its first step (Error, nothing to undo);
Compensated after a declined charge; CompensationFailed
with the refund refused (HTTP 422); Error after transient shipping failures;
and one read while its charge is in flight. For every step of every order the
page's state agrees with the ledger, its times are its own (the request and
the reply the timeline shows for it), and an order that is not Processed
says in one line what the services still hold. And an order in its long
retry (the host restarted with a 10-minute long-retry delay, so that it
waits long enough to be read): its next try shown, and "retry now" taken
from the page, after which the next attempt finishes it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from console.timeline import label
from domain.ids import order_key
from domain.models import ProcessState
from domain.steps import DEFAULT_CATALOG
from tests.e2e import test_console_browser as console_browser
from tests.e2e.conftest import E2E

pytestmark = [pytest.mark.timeout(600)]

browser = console_browser.browser  # the module's headless Chromium


async def _ledger(e2e: E2E, order_id: str) -> tuple[dict[str, int], dict[str, int]]:
    """(effects applied, calls received) per `service/operation` for one order."""
    keys = {order_id, order_key("webshop", order_id)}
    async with e2e.http.get(f"{e2e.remote}/_admin/side-effects") as response:
        effects = await response.json()
    async with e2e.http.get(f"{e2e.remote}/_admin/requests") as response:
        requests = await response.json()
    applied = {
        row["operation"]: row["count"] for row in effects["effects"] if row["order_id"] in keys
    }
    called = {
        f"{row['service']}/{row['operation']}": row["count"]
        for row in requests["requests"]
        if row["order_id"] in keys
    }
    return applied, called


def _expected(applied: dict[str, int], called: dict[str, int], step: str) -> set[str]:
    """What the console may say of `step` given the ledger."""
    s = DEFAULT_CATALOG.step_named(step)
    do, undo = s.do.path.lstrip("/"), s.undo.path.lstrip("/")
    if applied.get(do):
        if applied.get(undo):
            return {"undone"}
        return {"undo refused"} if called.get(undo) else {"applied"}
    if not called.get(do):
        return {"not called"}
    # asked, no effect: refused (a 4xx) or the agent gave up on 5xx answers
    return {"refused", "unknown", "undone"}


def _rows(driver) -> dict[str, dict[str, str]]:
    out = {}
    for row in driver.find_elements(By.CSS_SELECTOR, "#side-effects tr[data-step]"):
        cell = {c: row.find_element(By.CSS_SELECTOR, f".{c}").text for c in _CELLS}
        out[row.get_attribute("data-step")] = cell
    return out


_CELLS = ("effect", "effect-detail", "started", "completed", "took")


def _event_times(driver, label: str) -> list[str]:
    """The times the timeline shows for `label`'s request and reply lines."""
    return [
        li.find_element(By.TAG_NAME, "time").text
        for li in driver.find_elements(By.CSS_SELECTOR, "ol.timeline > li")
        if li.text.split("\n", 1)[0].split(" ", 1)[-1].startswith(label)
    ]


async def _check_order(e2e: E2E, driver, base: str, order_id: str) -> dict[str, dict[str, str]]:
    """The order's page agrees with the ledger, step by step; returns its rows."""
    await console_browser._open_order(driver, base, order_key("webshop", order_id))
    applied, called = await _ledger(e2e, order_id)
    rows = _rows(driver)
    assert set(rows) == set(DEFAULT_CATALOG.names)
    starts = []
    for step, row in rows.items():
        assert row["effect"] in _expected(applied, called, step), (step, row, applied, called)
        if row["effect"] == "not called":
            assert (row["started"], row["completed"], row["took"]) == ("", "", "")
            continue
        # its own request and answer, as the timeline shows them
        shown = _event_times(driver, label(step))
        assert row["started"] in shown, (step, row, shown)
        if row["completed"]:
            assert row["completed"] in shown, (step, row, shown)
            assert row["started"] <= row["completed"]
        starts.append(row["started"])
    assert len(starts) == len(set(starts)), rows  # no two steps share a start
    return rows


def _held(driver) -> str:
    found = driver.find_elements(By.ID, "held")
    return found[0].text if found else ""


async def _wait_called(e2e: E2E, order_id: str, operation: str, timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        _, called = await _ledger(e2e, order_id)
        if called.get(operation):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{operation} never called for {order_id}")


async def test_each_steps_effect_agrees_with_the_remote_ledger(stack, browser):
    base = f"http://127.0.0.1:{stack.ports.host}/api/console"
    async with E2E(stack) as e2e:
        ok, declined, refund_refused, failing, flying, out_of_stock = e2e.orders(6)
        await e2e.decline_charge(declined.OrderID)
        for service, operation, order, message in (
            ("inventory", "reserve", out_of_stock, "out of stock"),
            ("shipping", "arrange", refund_refused, "address unknown"),
            ("payment", "refund", refund_refused, "refund window closed"),
        ):
            await e2e.fault(
                kind="permanent",
                service=service,
                operation=operation,
                order_id=order.OrderID,
                message=message,
            )
        # the charge answers after 4 s (the step's deadline is 6 s): read while in flight
        await e2e.fault(
            kind="latency",
            service="payment",
            operation="charge",
            order_id=flying.OrderID,
            seconds=4,
        )
        await e2e.post([ok, declined, refund_refused, flying, out_of_stock])

        # --- in flight: the reservation answered, the charge asked, shipping not yet ------
        await _wait_called(e2e, flying.OrderID, "payment/charge")
        await console_browser._open_order(browser, base, order_key("webshop", flying.OrderID))
        rows = _rows(browser)
        assert browser.find_element(By.ID, "order-state").text == "Processing"
        assert rows["reserve-inventory"]["effect"] == "applied", rows
        assert rows["charge-payment"]["effect"] == "in flight", rows
        assert rows["arrange-shipment"]["effect"] == "not called", rows
        assert _held(browser) == "Still held: reserve inventory; in flight: charge payment."

        ids = {o.OrderID for o in (ok, declined, refund_refused, flying, out_of_stock)}
        records = await e2e.wait_terminal(ids, timeout=180, revive=False)
        assert records[ok.OrderID].ProcessState is ProcessState.PROCESSED
        assert records[declined.OrderID].ProcessState is ProcessState.COMPENSATED
        assert records[refund_refused.OrderID].ProcessState is ProcessState.COMPENSATION_FAILED
        assert records[flying.OrderID].ProcessState is ProcessState.PROCESSED

        # --- Processed: three effects applied, each with its own times ---------------------
        rows = await _check_order(e2e, browser, base, ok.OrderID)
        assert {r["effect"] for r in rows.values()} == {"applied"}
        assert _held(browser) == ""  # nothing to say for a Processed order
        rows = await _check_order(e2e, browser, base, flying.OrderID)
        assert rows["charge-payment"]["took"].endswith(" s"), rows  # the 4 s it waited

        # --- Compensated after a declined charge --------------------------------------------
        rows = await _check_order(e2e, browser, base, declined.OrderID)
        assert rows["charge-payment"]["effect"] == "refused"
        assert "HTTP 422" in rows["charge-payment"]["effect-detail"]
        assert "card declined" in rows["charge-payment"]["effect-detail"]
        assert rows["reserve-inventory"]["effect"] == "undone"
        assert rows["arrange-shipment"]["effect"] == "not called"
        assert _held(browser) == "Nothing is held at the services."

        # --- Failed at the first step: refused, nothing done, nothing to undo --------------
        assert records[out_of_stock.OrderID].ProcessState is ProcessState.ERROR
        rows = await _check_order(e2e, browser, base, out_of_stock.OrderID)
        assert rows["reserve-inventory"]["effect"] == "refused"
        assert "out of stock" in rows["reserve-inventory"]["effect-detail"]
        assert {rows[s]["effect"] for s in ("charge-payment", "arrange-shipment")} == {"not called"}
        assert _held(browser) == "Nothing is held at the services."

        # --- CompensationFailed: the customer was charged and the refund refused ------------
        rows = await _check_order(e2e, browser, base, refund_refused.OrderID)
        assert rows["arrange-shipment"]["effect"] == "refused"
        assert "address unknown" in rows["arrange-shipment"]["effect-detail"]
        assert rows["charge-payment"]["effect"] == "undo refused"
        assert "refund window closed" in rows["charge-payment"]["effect-detail"]
        assert "charge payment (refund payment refused)" in _held(browser)
        assert _held(browser).startswith("Still held:")

        # --- Error: shipping answered 503 until the budget was spent ------------------------
        await console_browser._clear_faults(e2e)
        await e2e.fault(
            kind="transient", service="shipping", operation="arrange", order_id=failing.OrderID
        )
        await e2e.post([failing])
        records = await e2e.wait_terminal({failing.OrderID}, timeout=180, revive=False)
        assert records[failing.OrderID].ProcessState is ProcessState.ERROR
        rows = await _check_order(e2e, browser, base, failing.OrderID)
        assert rows["reserve-inventory"]["effect"] == "applied"
        assert rows["charge-payment"]["effect"] == "applied"
        assert rows["arrange-shipment"]["effect"] == "unknown"
        assert _held(browser).startswith("Still held: reserve inventory, charge payment")
        assert browser.find_element(By.ID, "last-error").text != "—"
        # a time on the page is the timeline's, to the millisecond
        datetime.strptime(rows["charge-payment"]["started"], "%H:%M:%S.%f")


async def test_a_long_retry_shows_its_next_try_and_is_taken_now(stack, browser):
    """Shipping answers 503 until the order's short budget (3 failures) is
    spent: Pending in its long retry, 10 minutes away. The page says when,
    an operator takes it now, and once shipping works the next attempt
    finishes the order."""
    base = f"http://127.0.0.1:{stack.ports.host}/api/console"
    wait = WebDriverWait(browser, 30)
    await asyncio.to_thread(stack.replace_host, {"LONG_RETRY_DELAY_SECONDS": "600"})
    try:
        async with E2E(stack) as e2e:
            (waiting,) = e2e.orders(1)
            oid, key = waiting.OrderID, order_key("webshop", waiting.OrderID)
            await e2e.fault(kind="transient", service="shipping", operation="arrange", order_id=oid)
            await e2e.post([waiting])
            records = await e2e.wait_for(
                lambda rs: oid in rs and rs[oid].LongRetries == 1,
                timeout=240,
                what="the long retry",
            )
            record = records[oid]
            assert record.ProcessState is ProcessState.PENDING
            assert record.NotBefore is not None
            assert record.NotBefore > datetime.now(UTC)
            next_try = record.NotBefore.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")

            rows = await _check_order(e2e, browser, base, oid)  # each step against the ledger
            assert rows["arrange-shipment"]["effect"] == "unknown", rows
            assert browser.find_element(By.ID, "order-state").text == "Pending"
            shown = browser.find_element(By.CSS_SELECTOR, ".cards").text
            assert f"Next try\n{next_try}" in shown
            assert "(1 long retries)" in shown
            retry = browser.find_element(By.ID, "retry")
            assert f"next try {next_try}" in retry.find_element(By.XPATH, "..").text
            assert _held(browser).startswith("Still held: reserve inventory, charge payment")

            await console_browser._clear_faults(e2e)
            retry.click()
            wait.until(ec.presence_of_element_located((By.ID, "confirm")))
            console_browser._confirm(browser, wait, "shipping is back")
            assert "Retry recorded" in browser.find_element(By.ID, "notice").text
            taken, _ = await e2e.store.read(key)
            entry = next(h for h in reversed(taken.History) if h.By == "operator:local")
            assert entry.Reason.startswith("retry now, not at ")
            assert entry.Reason.endswith(": shipping is back")
            records = await e2e.wait_terminal({oid}, timeout=120, revive=False)
            assert records[oid].ProcessState is ProcessState.PROCESSED
            assert records[oid].LongRetries == 1  # the budget was not reset
            await console_browser._open_order(browser, base, key)
            assert browser.find_elements(By.ID, "retry") == []
            assert "operator local: retry now" in browser.find_element(By.TAG_NAME, "main").text
    finally:
        await asyncio.to_thread(stack.replace_host)
