"""Submit's fast path through the local host (devstack.host running
function_app.py): an order posted to the webshop's ingress queue is claimed
and started by Submit itself, right after Received, not by the timer Starter.

The stack's Starter timer is set to fire once a year, so it never runs here;
an order that gets an attempt and reaches Processed can only have been
started by the fast path. The host log is checked for the Starter's per-run
line as the control. No timing is asserted."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from adapters.cosmos_client import build_client
from adapters.settings import load_settings
from adapters.state_store import CosmosStateStore
from cli.orders import generate
from devstack.invariants import INGRESS_QUEUE
from devstack.stack import Stack
from domain.codec import encode
from domain.errors import NotFoundError
from domain.ids import order_key
from domain.models import ProcessState

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

NEVER = "0 0 0 1 1 *"  # 1 January, midnight: not during a test run


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fast-path")
    with Stack(Path(run_dir), overrides={"STARTER_SCHEDULE": NEVER}) as stack:
        yield stack


async def _wait_for_state(
    store: CosmosStateStore, order_id: str, state: ProcessState, timeout: float
):
    deadline = time.monotonic() + timeout
    record = None
    while time.monotonic() < deadline:
        try:
            record, _ = await store.read(order_id)
        except NotFoundError:
            record = None
        except Exception:  # the host creates the containers on its first use
            record = None
        if record is not None and record.ProcessState is state:
            return record
        await asyncio.sleep(0.5)
    raise AssertionError(f"{order_id} did not reach {state.value}: {record}")


async def test_a_lone_order_is_started_by_submit_not_by_the_starters_timer(stack):
    cfg = load_settings(stack.settings)
    [order] = list(generate("webshop", "replies-webshop", 1, f"FAST-{uuid.uuid4().hex[:6]}"))
    cosmos = build_client(cfg.state_account)
    store = CosmosStateStore(
        cosmos.get_database_client(cfg.state_database).get_container_client(cfg.state_container)
    )
    try:
        async with ServiceBusClient.from_connection_string(cfg.servicebus.connection_string) as bus:
            async with bus.get_queue_sender(INGRESS_QUEUE) as sender:
                await sender.send_messages(
                    ServiceBusMessage(encode(order), message_id=f"submit/{order.OrderID}")
                )
            # generous: the 2-core machine is shared; not a speed assertion
            record = await _wait_for_state(
                store, order_key("webshop", order.OrderID), ProcessState.PROCESSED, timeout=240
            )
    finally:
        await cosmos.close()
    assert record.AppId == "webshop"
    assert record.ReceivedSent
    assert record.FailureCount == 0
    assert record.Attempt == 1
    moves = [(h.From, h.To, h.By) for h in record.History]
    print(f"\nhistory: {moves}")
    assert moves[0] == (None, ProcessState.PENDING, "submit")
    assert (ProcessState.PENDING, ProcessState.PROCESSING) in [(f, t) for f, t, _ in moves]
    log = "".join(p.read_text(errors="replace") for p in (stack.run_dir / "logs").glob("host*.log"))
    # The control: the timer Starter never ran, so it claimed nothing.
    assert "starter: pending=" not in log
    assert "at the cap" not in log
    assert "submit_order_webshop" in log or INGRESS_QUEUE in log
