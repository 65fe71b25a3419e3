"""End-to-end fixtures: the whole local stack (Azurite, Cosmos server, Service
Bus emulator, remote service, and the local host running function_app.py) for
a test module, with short deadlines so faults resolve in seconds."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

from adapters.cosmos_client import build_client
from adapters.settings import load_settings
from adapters.state_store import CosmosStateStore
from cli.orders import generate
from devstack.invariants import INGRESS_QUEUE, observe, records_with_prefix, violations
from devstack.stack import Stack
from domain.codec import encode
from domain.models import TERMINAL_STATES

E2E_SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "6",
    "CLAIM_TIMEOUT_SECONDS": "8",
    "FAILURE_THRESHOLD": "3",
    "LONG_RETRIES": "1",
    "LONG_RETRY_DELAY_SECONDS": "4",
    "STARTER_SCHEDULE": "*/1 * * * * *",
    "SUPERVISOR_SCHEDULE": "*/2 * * * * *",
    "SUPERVISOR_PAGE_SIZE": "20",
    "SUPERVISOR_SCAN": "index",
    # one step through the in-app activity path, the others through the queue
    "INLINE_STEPS": "arrange-shipment",
    "AGENT_REPLY_MARGIN_SECONDS": "1",
    # Alert aggregates go out within seconds (reporting/alerts.py).
    "ALERT_WINDOW_SECONDS": "3",
}


REPO = Path(__file__).resolve().parents[2]
# The upgrade tests: the in-flight attempt must outlive a host replacement, so
# that the attempt that finishes is the one that was in flight.
UPGRADE_SETTINGS = {**E2E_SETTINGS, "STEP_TIMEOUT_SECONDS": "40", "CLAIM_TIMEOUT_SECONDS": "40"}


@contextmanager
def stack_on_version(run_dir: Path, version: str) -> Iterator[Stack]:
    """A stack whose host starts new orchestrations on workflow `version` (the
    repo's host.json with another defaultVersion); `upgrade` replaces it."""
    host = json.loads((REPO / "host.json").read_text())
    assert host["extensions"]["durableTask"]["defaultVersion"] == "1.0"
    host["extensions"]["durableTask"]["defaultVersion"] = version
    old_host_json = run_dir / f"host-{version}.json"
    old_host_json.write_text(json.dumps(host))
    with Stack(
        run_dir, overrides=UPGRADE_SETTINGS, host_args=["--host-json", str(old_host_json)]
    ) as stack:
        yield stack


async def upgrade(stack: Stack) -> None:
    """Replace the host by one with the repo's host.json (defaultVersion 1.0)."""
    stack.host_args = []
    await asyncio.to_thread(stack.replace_host)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Stack:
    run_dir = tmp_path_factory.mktemp("stack")
    # start() stops what it started if a server fails; the block stops the rest.
    with Stack(Path(run_dir), overrides=E2E_SETTINGS) as stack:
        yield stack


class E2E:
    """Drive the stack from a test: post orders, inject faults, wait, check."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.settings = load_settings(stack.settings)
        self.remote = stack.settings["REMOTE_SERVICE_URL"]
        self.prefix = f"E2E-{uuid.uuid4().hex[:6]}"
        self.crash_dir = stack.run_dir / f"crash-{self.prefix}"
        self.crash_dir.mkdir()

    async def __aenter__(self) -> E2E:
        cfg = self.settings
        self.cosmos = build_client(cfg.state_account)
        self.store = CosmosStateStore(
            self.cosmos.get_database_client(cfg.state_database).get_container_client(
                cfg.state_container
            )
        )
        self.bus = ServiceBusClient.from_connection_string(cfg.servicebus.connection_string)
        self.http = aiohttp.ClientSession()
        await self.ensure_store()
        return self

    async def __aexit__(self, *exc) -> None:
        async with self.http.delete(f"{self.remote}/_admin/faults"):
            pass
        await self.http.close()
        await self.bus.close()
        await self.cosmos.close()

    async def ensure_store(self) -> None:
        # the host creates the containers on first use; wait for them
        deadline = time.monotonic() + 30
        while True:
            try:
                await self.store.count_in_state("Pending")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    def orders(self, count: int):
        return list(generate("webshop", "replies-webshop", count, self.prefix))

    async def post(self, orders) -> None:
        async with self.bus.get_queue_sender(INGRESS_QUEUE) as sender:
            await sender.send_messages(
                [ServiceBusMessage(encode(o), message_id=f"submit/{o.OrderID}") for o in orders]
            )

    async def fault(self, **rule) -> None:
        async with self.http.post(f"{self.remote}/_admin/faults", json=rule) as response:
            assert response.status < 300, await response.text()

    async def decline_charge(self, order_id: str) -> None:
        """The order's payment is declined for good: its attempt compensates."""
        await self.fault(
            kind="permanent",
            service="payment",
            operation="charge",
            order_id=order_id,
            message="card declined",
        )

    def host_with_crash_points(self, *points: str) -> None:
        self.stack.replace_host(
            {"CRASH_POINTS": ",".join(points), "CRASH_POINTS_DIR": str(self.crash_dir)}
        )

    def crashed(self, point: str) -> bool:
        return (self.crash_dir / f"crashed-{point}").exists()

    def revive_host(self) -> None:
        """Restart the host if a crash point killed it (crash markers stay, so
        the new process runs past them)."""
        if not self.stack.servers["host"].alive():
            self.host_with_crash_points()

    async def wait_terminal(self, ids: set[str], timeout: float = 120, revive: bool = True):
        deadline = time.monotonic() + timeout
        while True:
            if revive:
                await asyncio.to_thread(self.revive_host)
            records = await records_with_prefix(self.store, self.prefix)
            done = {oid for oid, r in records.items() if r.ProcessState in TERMINAL_STATES}
            if ids <= done:
                return records
            if time.monotonic() > deadline:
                pending = {
                    oid: records[oid].ProcessState.value if oid in records else "absent"
                    for oid in ids - done
                }
                raise AssertionError(f"not terminal after {timeout}s: {pending}")
            await asyncio.sleep(1)

    async def wait_for(self, predicate, timeout: float = 60, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = await records_with_prefix(self.store, self.prefix)
            if predicate(records):
                return records
            await asyncio.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}")

    async def check(self, ids: set[str], **kwargs) -> list[str]:
        observed = await observe(
            self.store, self.bus, self.remote, self.prefix, self.stack.run_dir / "logs"
        )
        self.observed = observed
        return violations(observed, self.settings, ids, **kwargs)

    def host_log(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in (self.stack.run_dir / "logs").glob("host*.log")
        )
