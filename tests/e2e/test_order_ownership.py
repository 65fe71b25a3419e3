"""OrderIDs belong to their application, through the local host: two
applications post one OrderID and both orders are processed, each hearing
only of its own (ADR 017f)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from azure.servicebus import ServiceBusMessage

from cli.orders import generate
from devstack.invariants import observe, records_with_prefix, violations
from domain.codec import encode
from domain.ids import order_key
from domain.models import ProcessState
from domain.steps import DEFAULT_CATALOG
from tests.e2e.conftest import E2E

pytestmark = [pytest.mark.timeout(300)]

APPS = {"webshop": "replies-webshop", "partner-portal": "replies-partner-portal"}


async def _post(e2e: E2E, app: str, orders) -> None:
    async with e2e.bus.get_queue_sender(f"orders-{app}") as sender:
        await sender.send_messages(
            [ServiceBusMessage(encode(o), message_id=o.OrderID) for o in orders]
        )


async def _taken(e2e: E2E, queue: str, message_id: str, timeout: float = 60) -> None:
    """Wait until Submit has settled `message_id` (it is no longer on `queue`)."""
    deadline = time.monotonic() + timeout
    async with e2e.bus.get_queue_receiver(queue) as receiver:
        while time.monotonic() < deadline:
            waiting = await receiver.peek_messages(max_message_count=50)
            if not any(m.message_id == message_id for m in waiting):
                return
            await asyncio.sleep(0.5)
    raise AssertionError(f"{message_id} still on {queue} after {timeout}s")


async def _terminal(e2e: E2E, app: str, ids: set[str], timeout: float = 150) -> dict:
    """`app`'s records of `ids` (by its OrderIDs) once every one is terminal."""
    deadline = time.monotonic() + timeout
    while True:
        records = await records_with_prefix(e2e.store, e2e.prefix, app)
        if ids <= {oid for oid, r in records.items() if r.ProcessState.is_terminal}:
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{app}: not terminal after {timeout}s: {records}")
        await asyncio.sleep(1)


async def test_two_applications_post_one_order_id_and_both_are_processed(stack):
    async with E2E(stack) as e2e:
        # The same OrderIDs, different orders (their own lines and totals).
        mine = list(generate("webshop", APPS["webshop"], 2, e2e.prefix, seed=1))
        theirs = list(generate("partner-portal", APPS["partner-portal"], 2, e2e.prefix, seed=2))
        ids = {o.OrderID for o in mine}
        assert ids == {o.OrderID for o in theirs}
        assert [o.digest() for o in mine] != [o.digest() for o in theirs]
        # The partner's first, then the webshop's: whoever comes second is not refused.
        await _post(e2e, "partner-portal", theirs)
        await _post(e2e, "webshop", mine)

        sent = {"webshop": mine, "partner-portal": theirs}
        for app in APPS:
            records = await _terminal(e2e, app, ids)
            assert {oid: r.ProcessState for oid, r in records.items()} == dict.fromkeys(
                ids, ProcessState.PROCESSED
            ), app
            for order in sent[app]:
                record = records[order.OrderID]
                assert record.id == order_key(app, order.OrderID)
                assert (record.AppId, record.ReplyTo) == (app, APPS[app])
                assert record.OrderDigest == order.digest()  # its own order, not the other's

        observed = {
            app: await observe(
                e2e.store,
                e2e.bus,
                e2e.remote,
                e2e.prefix,
                stack.run_dir / "logs",
                reply_queue=APPS[app],
                ingress_queue=f"orders-{app}",
                app=app,
            )
            for app in APPS
        }
        for app, seen in observed.items():
            # Each application hears of each of its orders, once each, by its own OrderID.
            assert seen.replies == {oid: ["Received", "Processed"] for oid in ids}, app
            assert seen.dead_letter_reasons == Counter(), app  # no OrderConflict, nothing refused
            assert violations(seen, e2e.settings, ids) == [], app
        alerts = observed["webshop"].alerts + observed["partner-portal"].alerts
        assert alerts["OrderConflict"] == 0
        # Four orders at the remote services, each step applied once per order key.
        effects = observed["webshop"].side_effects["effects"]
        applied = Counter(
            r["order_id"]
            for r in effects
            if r["order_id"].rpartition(":")[2] in ids and r["count"] > 0
        )
        assert applied == {
            order_key(a, oid): len(DEFAULT_CATALOG.names) for a in APPS for oid in ids
        }
