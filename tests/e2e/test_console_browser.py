"""The operator console in a real headless browser (Debian's Chromium driven
by Selenium through chromium-driver; `make browser` installs both) against the
whole local stack: the host serves the console's HTTP functions.

One scenario, as an operator would go through it: open the overview, find an
order that needed two attempts and read its timeline, resubmit an Error order
and see it go Pending, and check that a hostile OrderID renders as text. It
takes the README's screenshots; with UPDATE_SCREENSHOTS=1 it writes them to
docs/images/ (otherwise to a temporary folder, so a test run changes no tracked file)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from domain.ids import order_key
from domain.models import ProcessState
from tests.e2e.conftest import E2E

pytestmark = [pytest.mark.timeout(420)]

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


async def test_operator_reads_and_acts_in_the_browser(stack, browser):
    base = f"http://127.0.0.1:{stack.ports.host}/api/console"
    wait = WebDriverWait(browser, 30)
    async with E2E(stack) as e2e:
        orders = e2e.orders(3)
        ok, retried, failing = (o.OrderID for o in orders)
        # `retried`: its first reservation hangs past the step deadline, so
        # attempt 1 times out and the Supervisor hands the order to attempt 2.
        await e2e.fault(
            kind="latency",
            service="inventory",
            operation="reserve",
            order_id=retried,
            seconds=10,
            count=1,
        )
        await e2e.post(orders[:2])
        await _post_hostile(e2e.bus)
        records = await e2e.wait_terminal({ok, retried}, timeout=150, revive=False)
        assert records[ok].ProcessState is ProcessState.PROCESSED
        assert records[retried].ProcessState is ProcessState.PROCESSED
        assert records[retried].Attempt >= 2
        # `failing`: its shipment fails transiently until the retry budget is
        # spent -> Error. Posted alone: the failures open the shipping breaker,
        # which would slow the other orders down.
        await e2e.fault(kind="transient", service="shipping", operation="arrange", order_id=failing)
        await e2e.post(orders[2:])
        records = await e2e.wait_terminal({failing}, timeout=180, revive=False)
        assert records[failing].ProcessState is ProcessState.ERROR, records[failing]

        # --- the overview -------------------------------------------------------------
        await asyncio.to_thread(browser.get, base)
        assert browser.find_element(By.TAG_NAME, "h1").text == "Overview"
        processed = browser.find_element(By.CSS_SELECTOR, "#state-counts [data-state='Processed']")
        assert int(processed.text) >= 2
        assert (
            int(browser.find_element(By.CSS_SELECTOR, "#state-counts [data-state='Error']").text)
            >= 1
        )
        totals = browser.find_element(By.ID, "supervisor-totals").text
        assert not totals.startswith("0 recovered"), totals  # the retried order's recoveries
        _no_markup_from(browser, "InvalidMessage")  # the hostile submission's alert, as text
        _screenshot(browser, "console-overview.png")

        # --- find the order that needed two attempts, read its timeline --------------------
        browser.find_element(By.LINK_TEXT, "Orders").click()
        wait.until(ec.presence_of_element_located((By.ID, "orders")))
        Select(browser.find_element(By.NAME, "state")).select_by_visible_text("Processed")
        browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
        # The console names orders by their key: the application and its OrderID.
        wait.until(
            ec.presence_of_element_located((By.LINK_TEXT, order_key("webshop", retried)))
        ).click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "order-id"), retried))
        first = browser.find_element(By.ID, "attempt-1").text
        assert "missed its deadline" in first, first  # the Supervisor's decision
        assert "Pending → Processing by starter" in first
        last = browser.find_element(By.ID, f"attempt-{records[retried].Attempt}").text
        assert "reserve-inventory completed" in last, last
        assert "Processing → Processed" in last, last
        assert browser.find_element(By.ID, "order-state").text == "Processed"
        assert "Payment data is not shown" in browser.page_source
        assert "pay-" not in browser.find_element(By.TAG_NAME, "body").text  # no payment reference
        _screenshot(browser, "console-order-timeline.png")

        # --- resubmit the Error order and see it go Pending ---------------------------------
        await _clear_faults(e2e)
        await asyncio.to_thread(browser.get, f"{base}/orders/{order_key('webshop', failing)}")
        assert browser.find_element(By.ID, "order-state").text == "Error"
        browser.find_element(By.ID, "resubmit").click()
        wait.until(ec.presence_of_element_located((By.ID, "confirm")))
        assert (
            "recorded in the order's history as done by local"
            in browser.find_element(By.TAG_NAME, "main").text
        )
        browser.find_element(By.ID, "confirm").click()
        wait.until(ec.presence_of_element_located((By.ID, "notice")))
        page = browser.find_element(By.TAG_NAME, "main").text
        assert "Error → Pending by operator:local: resubmitted" in page
        record, _ = await e2e.store.read(order_key("webshop", failing))
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
        record_after, _ = await e2e.store.read(order_key("webshop", failing))
        assert sum(1 for h in record_after.History if h.By == "operator:local") == 1

        # --- a hostile OrderID renders as text --------------------------------------------
        await asyncio.to_thread(browser.get, f"{base}/deadletters/orders-webshop")
        wait.until(ec.presence_of_element_located((By.TAG_NAME, "table")))
        _no_markup_from(browser, HOSTILE)
        await asyncio.to_thread(browser.get, f"{base}/alerts")
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
