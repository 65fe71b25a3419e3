"""The operator console in a real headless browser (Debian's Chromium driven
by Selenium through chromium-driver; `make browser` installs both) against the
whole local stack: the host serves the console's HTTP functions.

One scenario, as an operator would go through it, on orders made to fail
with the remote service's fault injection: open the overview; read the order
pages of a declined payment, an order retried after its reservation timed
out, an order whose compensation failed and then succeeded after an operator
asked again (through the console), and an order whose payment the agent
retried; resubmit an Error order and see it go Pending; count, follow, resend
and discard dead letters; and check that a hostile OrderID renders as text.
The order pages are asserted, not only screenshotted: each attempt's outcome
in words, causal order, each step's side-effect state, the agent's calls.
It takes the README's screenshots; with UPDATE_SCREENSHOTS=1 it writes them to
docs/images/ (otherwise to a temporary folder, so a test run changes no tracked file)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from domain.codec import encode
from domain.ids import order_key
from domain.models import ProcessState
from tests.e2e.conftest import E2E

pytestmark = [pytest.mark.timeout(600)]

IMAGES = (
    Path(__file__).resolve().parents[2] / "docs" / "images"
    if os.environ.get("UPDATE_SCREENSHOTS") == "1"
    else Path(tempfile.gettempdir()) / "console-screenshots"
)
HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>"


def _find(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        f"{' / '.join(names)} not found: run `make browser` (apt-get install chromium chromium-driver)",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = _find("chromium", "chromium-browser")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(_find("chromedriver")))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _screenshot(driver, name: str) -> None:
    """The whole page: grow the window to the document's height first."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    # the window's outer size includes what headless Chromium keeps for its frame
    driver.set_window_size(1280, min(max(height + 200, 600), 4200))
    IMAGES.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(IMAGES / name))
    driver.set_window_size(1280, 1000)


def _no_markup_from(driver, text: str) -> None:
    """`text` is on the page as text, and none of it became elements or ran."""
    assert text in driver.find_element(By.TAG_NAME, "body").text
    assert driver.find_elements(By.CSS_SELECTOR, "img[src='x'], script") == []
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018 - raises when no alert() ran


async def _post_hostile(bus: ServiceBusClient) -> None:
    body = {"OrderID": HOSTILE, "AppId": "webshop", "ReplyTo": "replies-webshop", "Lines": []}
    async with bus.get_queue_sender("orders-webshop") as sender:  # the webshop's ingress
        await sender.send_messages(
            ServiceBusMessage(json.dumps(body), message_id="submit/console-hostile")
        )


def _events(driver, attempt: int) -> list[str]:
    return [
        li.text.split("\n", 1)[0]
        for li in driver.find_elements(By.CSS_SELECTOR, f"#attempt-{attempt} ol.timeline > li")
    ]


def _position(texts: list[str], needle: str) -> int:
    for i, text in enumerate(texts):
        if needle in text:
            return i
    raise AssertionError(f"{needle!r} not in {texts}")


def _in_order(texts: list[str], *needles: str) -> None:
    positions = [_position(texts, n) for n in needles]
    assert positions == sorted(positions), list(zip(needles, positions, strict=True))


def _outcome(driver, attempt: int) -> str:
    return driver.find_element(By.ID, f"outcome-{attempt}").text


def _effects(driver) -> dict[str, str]:
    return {
        row.get_attribute("data-step"): row.find_element(By.CSS_SELECTOR, ".effect").text
        for row in driver.find_elements(By.CSS_SELECTOR, "#side-effects tr[data-step]")
    }


def _confirm(driver, wait, reason: str) -> None:
    """On a confirmation page: give the reason, confirm, and wait for the
    notice (a loaded machine may take long over the POST and its redirect:
    up to 90 s); a refusal fails with its message."""
    wait.until(ec.presence_of_element_located((By.ID, "reason"))).send_keys(reason)
    driver.find_element(By.ID, "confirm").click()
    answered = (By.CSS_SELECTOR, "#notice, #error-message")
    WebDriverWait(driver, 90).until(ec.presence_of_element_located(answered))
    refused = driver.find_elements(By.ID, "error-message")
    assert not refused, f"the action was refused: {refused[0].text}"


async def _open_order(driver, base: str, order_id: str) -> None:
    await asyncio.to_thread(driver.get, f"{base}/orders/{order_id}")
    shown = driver.find_elements(By.ID, "order-id")
    assert shown, driver.find_element(By.TAG_NAME, "body").text[:3000]  # the page it got
    assert shown[0].text == order_id


async def _dead_letter_while_host_is_down(e2e: E2E, order) -> str:
    """A valid order dead-lettered RetriesExhausted on the webshop's ingress,
    as the message gate does after its retries (the host is stopped so that
    Submit does not take it first). Returns its message id."""
    message_id = f"submit/{order.OrderID}"
    await asyncio.to_thread(e2e.stack.servers["host"].stop)
    try:
        async with e2e.bus.get_queue_sender("orders-webshop") as sender:
            await sender.send_messages(ServiceBusMessage(encode(order), message_id=message_id))
        async with e2e.bus.get_queue_receiver("orders-webshop") as receiver:
            for _ in range(10):
                got = await receiver.receive_messages(max_message_count=10, max_wait_time=3)
                for m in got:
                    if m.message_id == message_id:
                        await receiver.dead_letter_message(
                            m,
                            reason="RetriesExhausted",
                            error_description="the state store was unavailable (test)",
                        )
                        return message_id
                    await receiver.abandon_message(m)
        raise AssertionError("the order message never arrived")
    finally:
        await asyncio.to_thread(e2e.host_with_crash_points)


async def _dead_letter_ids(bus: ServiceBusClient, queue: str) -> list[str]:
    async with bus.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as r:
        return [str(m.message_id) for m in await r.peek_messages(max_message_count=100)]


async def inject_faults(e2e: E2E, retried, declined, undo_fails, agent_retries) -> None:
    """The remote service's fault rules for four of the orders the console
    is read on (here, and by tests/console/histories/record.py)."""
    # `retried`: its reservations hang (12 s) past the agent's call timeout (10 s)
    # on every call attempt 1 can make before its one deadline (a step
    # timeout per step, 18 s: ADR 021a), so attempt 1 ends without an
    # answer and the Supervisor hands the order to attempt 2, whose retry
    # after one more hang succeeds.
    for (service, operation), order, rule in (
        (("inventory", "reserve"), retried, {"kind": "latency", "seconds": 12, "count": 3}),
        (("inventory", "release"), undo_fails, {"kind": "permanent", "count": 1}),
        (("payment", "charge"), agent_retries, {"kind": "transient", "count": 2}),
    ):
        await e2e.fault(service=service, operation=operation, order_id=order.OrderID, **rule)
    await e2e.decline_charge(declined.OrderID)
    await e2e.decline_charge(undo_fails.OrderID)


async def test_operator_reads_and_acts_in_the_browser(stack, browser):
    base = f"http://127.0.0.1:{stack.ports.host}/api/console"
    wait = WebDriverWait(browser, 30)
    async with E2E(stack) as e2e:
        orders = e2e.orders(8)
        ok, retried, failing, declined, undo_fails, agent_retries, resent, _ = orders
        ids = {o.OrderID for o in (ok, retried, declined, undo_fails, agent_retries)}
        await inject_faults(e2e, retried, declined, undo_fails, agent_retries)
        await e2e.post([ok, retried, declined, undo_fails, agent_retries])
        await _post_hostile(e2e.bus)
        records = await e2e.wait_terminal(ids, timeout=180, revive=False)
        assert records[ok.OrderID].ProcessState is ProcessState.PROCESSED
        assert records[retried.OrderID].ProcessState is ProcessState.PROCESSED
        assert records[retried.OrderID].Attempt >= 2
        assert records[declined.OrderID].ProcessState is ProcessState.COMPENSATED
        assert records[undo_fails.OrderID].ProcessState is ProcessState.COMPENSATION_FAILED
        assert records[agent_retries.OrderID].ProcessState is ProcessState.PROCESSED
        # `failing`: its shipment fails transiently until the retry budget is
        # spent -> Error. Posted alone: the failures open the shipping breaker,
        # which would slow the other orders down.
        await e2e.fault(
            kind="transient", service="shipping", operation="arrange", order_id=failing.OrderID
        )
        await e2e.post([failing])
        records = await e2e.wait_terminal({failing.OrderID}, timeout=180, revive=False)
        assert records[failing.OrderID].ProcessState is ProcessState.ERROR, records[failing.OrderID]
        await _clear_faults(e2e)
        resent_id = await _dead_letter_while_host_is_down(e2e, resent)

        # --- the overview -------------------------------------------------------------
        await asyncio.to_thread(browser.get, base)
        assert browser.find_element(By.TAG_NAME, "h1").text == "Overview"
        processed = browser.find_element(By.CSS_SELECTOR, "#state-counts [data-state='Processed']")
        assert int(processed.text) >= 3
        assert (
            int(browser.find_element(By.CSS_SELECTOR, "#state-counts [data-state='Error']").text)
            >= 1
        )
        totals = browser.find_element(By.ID, "supervisor-totals").text
        assert not totals.startswith("0 recovered"), totals  # the retried order's recoveries
        _no_markup_from(browser, "InvalidMessage")  # the hostile submission's alert, as text
        dead = browser.find_element(
            By.CSS_SELECTOR, "#overview-dead-letters [data-queue='orders-webshop'] .count"
        )
        assert (
            int(dead.text.rstrip("+")) >= 2
        )  # the hostile submission and the RetriesExhausted one
        _screenshot(browser, "console-overview.png")

        # --- the order that needed two attempts --------------------------------------------
        browser.find_element(By.LINK_TEXT, "Orders").click()
        wait.until(ec.presence_of_element_located((By.ID, "orders")))
        Select(browser.find_element(By.NAME, "state")).select_by_visible_text("Processed")
        browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
        wait.until(
            ec.presence_of_element_located((By.LINK_TEXT, order_key("webshop", retried.OrderID)))
        ).click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "order-id"), retried.OrderID))
        last = records[retried.OrderID].Attempt
        first = _outcome(browser, 1)
        assert first.startswith(
            ("gave up at reserve inventory", "timed out at reserve inventory")
        ), first
        assert _outcome(browser, last) == "Processed"
        events = _events(browser, 1)
        _in_order(
            events,
            "claimed by the Starter",
            "attempt began",
            "reserve inventory: requested",
            "Supervisor: attempt 1 missed its deadline",
        )
        assert "reserve inventory: done" in " ".join(_events(browser, last))
        assert _effects(browser) == {
            "reserve-inventory": "applied",
            "charge-payment": "applied",
            "arrange-shipment": "applied",
        }
        assert browser.find_elements(By.ID, "compensation-log") == []  # none ran
        assert len(browser.find_elements(By.CSS_SELECTOR, "#order-lines tr")) == 1 + len(
            retried.Lines
        )
        assert browser.find_element(By.ID, "order-state").text == "Processed"
        assert "Payment data is not shown" in browser.page_source
        assert "pay-" not in browser.find_element(By.TAG_NAME, "body").text  # no payment reference
        _screenshot(browser, "console-order-timeline.png")

        # --- a declined payment ---------------------------------------------------------------
        await _open_order(browser, base, order_key("webshop", declined.OrderID))
        assert _outcome(browser, 1) == "compensated: every requested step undone"
        events = _events(browser, 1)
        _in_order(
            events,
            "reserve inventory: done",
            "charge payment: requested",
            "charge payment: refused (permanent)",
            "compensating:",
            "refund payment: nothing to undo",
            "release inventory: done",
            "order Compensated",
        )
        attempt_text = browser.find_element(By.ID, "attempt-1").text
        assert attempt_text.count("card declined") == 1, attempt_text  # each error once
        for activity in ("write_state", "raise_alert", "report_status", "send_step"):
            assert activity not in attempt_text
        assert _effects(browser) == {
            "reserve-inventory": "undone",
            "charge-payment": "refused",
            "arrange-shipment": "not called",
        }
        assert browser.find_elements(By.ID, "compensation-log") != []
        _screenshot(browser, "console-order-compensated.png")

        # --- an agent that retried ---------------------------------------------------------------
        await _open_order(browser, base, order_key("webshop", agent_retries.OrderID))
        assert _outcome(browser, 1) == "Processed"
        charge = next(
            li
            for li in browser.find_elements(By.CSS_SELECTOR, "#attempt-1 ol.timeline > li")
            if "charge payment: done" in li.text.split("\n", 1)[0]
        )
        calls = [
            c.get_attribute("data-outcome")
            for c in charge.find_elements(By.CSS_SELECTOR, "li.call")
        ]
        assert calls == ["transient", "transient", "ok"], charge.text
        assert " ms" in charge.text  # each call's duration

        # --- a compensation that failed, then succeeded when an operator asked again -----------
        oid = undo_fails.OrderID
        await _open_order(browser, base, order_key("webshop", oid))
        assert _outcome(browser, 1) == "compensation failed"
        assert "release inventory: refused (permanent)" in " ".join(_events(browser, 1))
        assert _effects(browser)["reserve-inventory"] == "undo refused"  # still held
        assert (
            "reserve inventory (release inventory refused)"
            in browser.find_element(By.ID, "held").text
        )
        browser.find_element(By.ID, "compensate").click()
        _confirm(browser, wait, "the provider fixed its release")
        wait.until(ec.presence_of_element_located((By.ID, "notice")))
        await e2e.wait_for(
            lambda rs: oid in rs and rs[oid].ProcessState is ProcessState.COMPENSATED,
            timeout=90,
            what="compensated",
        )
        await _open_order(browser, base, order_key("webshop", oid))
        assert _outcome(browser, 2) == "compensated: every requested step undone"
        assert _events(browser, 1)[-1].endswith(
            "operator local: compensation requested: the provider fixed its release"
        )
        assert "release inventory: done" in " ".join(_events(browser, 2))
        assert _effects(browser) == {
            "reserve-inventory": "undone",
            "charge-payment": "refused",
            "arrange-shipment": "not called",
        }

        # --- resubmit the Error order and see it go Pending ---------------------------------
        await asyncio.to_thread(
            browser.get, f"{base}/orders/{order_key('webshop', failing.OrderID)}"
        )
        assert browser.find_element(By.ID, "order-state").text == "Error"
        browser.find_element(By.ID, "resubmit").click()
        wait.until(ec.presence_of_element_located((By.ID, "confirm")))
        assert (
            "recorded in the order's history as done by local"
            in browser.find_element(By.TAG_NAME, "main").text
        )
        _confirm(browser, wait, "payment provider fixed")
        assert browser.current_url.startswith(base)  # a path redirect, kept on our origin
        page = browser.find_element(By.TAG_NAME, "main").text
        assert "operator local: resubmitted: payment provider fixed" in page
        record, _ = await e2e.store.read(order_key("webshop", failing.OrderID))
        entry = next(h for h in reversed(record.History) if h.By == "operator:local")
        assert (entry.From, entry.To) == (ProcessState.ERROR, ProcessState.PENDING)
        # the state right after: Pending, or already claimed again by the Starter
        assert browser.find_element(By.ID, "order-state").text in (
            "Pending",
            "Processing",
            "Processed",
        )
        # reloading the page after the redirect does not act again
        await asyncio.to_thread(browser.refresh)
        record_after, _ = await e2e.store.read(order_key("webshop", failing.OrderID))
        assert sum(1 for h in record_after.History if h.By == "operator:local") == 1

        # --- dead letters: counts, links, resend, discard -------------------------------------
        await asyncio.to_thread(browser.get, f"{base}/deadletters")
        count = browser.find_element(
            By.CSS_SELECTOR, "#dlq-counts [data-queue='orders-webshop'] .count"
        )
        before = int(count.text.rstrip("+"))
        assert before >= 2
        assert browser.find_elements(By.ID, "dlq-empty") != []  # empty queues collapsed
        _screenshot(browser, "console-deadletters.png")
        await asyncio.to_thread(browser.get, f"{base}/deadletters/orders-webshop")
        wait.until(ec.presence_of_element_located((By.TAG_NAME, "table")))
        _no_markup_from(browser, HOSTILE)
        row = browser.find_element(By.CSS_SELECTOR, f"tr[data-message-id='{resent_id}']")
        # Submit never took it, so no record is stored: named, not linked (it would 404)
        assert row.find_elements(By.CSS_SELECTOR, ".order-link") == []
        unstored = row.find_element(By.CSS_SELECTOR, ".unstored").text
        assert unstored == f"{order_key(resent.AppId, resent.OrderID)} (never stored)"
        row.find_element(By.CSS_SELECTOR, "a.resend").click()
        _confirm(browser, wait, "Submit is back")
        assert "resent" in browser.find_element(By.ID, "notice").text
        records = await e2e.wait_terminal({resent.OrderID}, timeout=120, revive=False)
        assert records[resent.OrderID].ProcessState is ProcessState.PROCESSED  # Submit took it
        assert resent_id not in await _dead_letter_ids(e2e.bus, "orders-webshop")
        # the hostile submission: no order to link, its alert linked; discard it
        hostile = browser.find_element(
            By.CSS_SELECTOR, "tr[data-message-id='submit/console-hostile']"
        )
        assert hostile.find_elements(By.CSS_SELECTOR, ".order-link") == []
        alert_link = hostile.find_element(By.CSS_SELECTOR, ".alert-link").get_attribute("href")
        hostile.find_element(By.CSS_SELECTOR, "a.discard").click()
        _confirm(browser, wait, "a hostile test message")
        assert "submit/console-hostile" not in await _dead_letter_ids(e2e.bus, "orders-webshop")
        count = browser.find_element(
            By.CSS_SELECTOR, "#dlq-counts [data-queue='orders-webshop'] .count"
        )
        assert int(count.text.rstrip("+")) == before - 2
        await asyncio.to_thread(browser.get, alert_link)
        anchor = alert_link.rsplit("#", 1)[1]
        assert HOSTILE in browser.find_element(By.ID, anchor).text  # the alert it was about
        _no_markup_from(browser, HOSTILE)
        # typed into the order search (a query parameter: the local host decodes
        # %2F in a path before routing, so a route value cannot hold "/")
        search = browser.find_element(By.ID, "find-id")
        search.send_keys(HOSTILE)
        search.submit()
        wait.until(ec.presence_of_element_located((By.ID, "error-message")))
        _no_markup_from(browser, f"No order {HOSTILE}")


async def _clear_faults(e2e: E2E) -> None:
    async with e2e.http.delete(f"{e2e.remote}/_admin/faults") as response:
        assert response.status < 300
