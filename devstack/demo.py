"""`make demo`: the main job, end to end on the local stack.

Starts Azurite, the Cosmos server, the Service Bus emulator, the remote
service and the local host running function_app.py; posts a batch of orders
(default 200) with faults injected — transient errors, an outage of one
downstream service longer than a step deadline, payments declined for a few
orders (compensation), a crash after a side effect, a `kill -9` and restart of
the host mid-run, a duplicate and a conflicting submission, a malformed
message, a reply queue the sender does not own — waits until every accepted
order is terminal, prints a summary, and checks the invariants of DESIGN.md §7
against the state store, the reply queue, the dead-letter queue, the alerts
queue and the remote service's side-effect counts. Exit 0 only if all hold.

    python -m devstack.demo [--orders 200] [--timeout 600] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient
from rich.console import Console
from rich.live import Live
from rich.table import Table

from adapters.cosmos_client import build_client
from adapters.settings import load_settings
from adapters.state_store import CosmosStateStore
from cli.orders import generate
from devstack.stack import REPO, Stack
from domain.codec import encode
from domain.models import TERMINAL_STATES, OrderState, ProcessState

console = Console()

DEMO_SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "8",
    "CLAIM_TIMEOUT_SECONDS": "20",
    "FAILURE_THRESHOLD": "4",
    "LONG_RETRIES": "1",
    "LONG_RETRY_DELAY_SECONDS": "15",
    "STARTER_SCHEDULE": "*/2 * * * * *",
    "STARTER_BATCH_SIZE": "50",
    "MAX_PROCESSING": "100",
    "SUPERVISOR_SCHEDULE": "*/3 * * * * *",
    "SUPERVISOR_PAGE_SIZE": "50",
    "SUPERVISOR_SCAN": "index",
    "PENDING_BACKLOG_LIMIT": "5000",
}
STATUS_OF_STATE = {
    ProcessState.PROCESSED: "Processed",
    ProcessState.ERROR: "Failed",
    ProcessState.COMPENSATED: "Compensated",
    ProcessState.COMPENSATION_FAILED: "CompensationFailed",
    ProcessState.REJECTED: "Rejected",
}


class Demo:
    def __init__(self, stack: Stack, orders: int, timeout: float) -> None:
        self.stack = stack
        self.count = orders
        self.timeout = timeout
        self.settings = load_settings(stack.settings)
        self.remote = stack.settings["REMOTE_SERVICE_URL"]
        self.prefix = f"DEMO-{uuid.uuid4().hex[:4]}"
        self.orders = list(generate("webshop", "replies-webshop", orders, self.prefix, seed=7))
        self.declined = {o.OrderID for i, o in enumerate(self.orders) if i % 40 == 13}
        self.conflict_id = self.orders[1].OrderID
        self.events: list[str] = []

    # --- setting the scene -----------------------------------------------------------

    async def faults(self) -> None:
        rules = [
            {"kind": "transient", "service": "*", "rate": 0.1},
            {"kind": "crash", "service": "inventory", "operation": "reserve", "count": 3, "mode": "drop"},
            # longer than a step deadline (8 s): those attempts time out and the Supervisor retries them
            {"kind": "outage", "service": "shipping", "operation": "arrange", "seconds": 14},
        ]
        rules += [
            {"kind": "permanent", "service": "payment", "operation": "charge", "order_id": oid,
             "message": "card declined"}
            for oid in sorted(self.declined)
        ]
        async with aiohttp.ClientSession() as http:
            for rule in rules:
                async with http.post(f"{self.remote}/_admin/faults", json=rule) as response:
                    response.raise_for_status()
        self.events.append(f"faults: 10% transient errors, 3 crashes after a side effect, a 14 s shipping "
                           f"outage, {len(self.declined)} payments declined")

    async def post(self, client: ServiceBusClient) -> None:
        bodies = [(f"submit/{o.OrderID}", encode(o)) for o in self.orders]
        original = self.orders[1].model_dump(mode="json")
        conflicting = {**original, "Customer": {"CustomerId": "C-someone-else"}}
        not_owned = self.orders[2].model_dump(mode="json") | {
            "OrderID": f"{self.prefix}-NOTOWNED", "ReplyTo": "replies-partner-portal"}
        extras = [
            ("dup/0", encode(self.orders[0])),  # the same order again, another message id
            ("conflict/1", json.dumps(conflicting).encode()),
            ("malformed", b'{"OrderID": "x", "Lines": "lots"}'),
            ("notowned", json.dumps(not_owned).encode()),
        ]
        async with client.get_queue_sender("orders") as sender:
            for start in range(0, len(bodies), 100):
                await sender.send_messages(
                    [ServiceBusMessage(b, message_id=m) for m, b in bodies[start:start + 100]])
            await asyncio.sleep(3)  # let the originals land first, so the conflict is a conflict
            await sender.send_messages([ServiceBusMessage(b, message_id=m) for m, b in extras])
        self.events.append(f"posted {len(bodies)} orders, a duplicate, a conflicting order, "
                           "a malformed message and an order naming another app's reply queue")

    # --- watching ------------------------------------------------------------------------

    async def records(self, store: CosmosStateStore) -> dict[str, OrderState]:
        out = {}
        for state in ProcessState:
            for record in await store.query_in_state(state, 10_000):
                if record.id.startswith(self.prefix):
                    out[record.id] = record
        return out

    def table(self, records: dict[str, OrderState], elapsed: float) -> Table:
        counts = Counter(r.ProcessState.value for r in records.values())
        t = Table(title=f"{len(records)}/{self.count} orders recorded, {elapsed:.0f}s")
        for state in ProcessState:
            t.add_column(state.value)
        t.add_row(*(str(counts.get(s.value, 0)) for s in ProcessState))
        return t

    async def wait(self, store: CosmosStateStore) -> dict[str, OrderState]:
        start = time.monotonic()
        killed = False
        with Live(console=console, refresh_per_second=2) as live:
            while True:
                records = await self.records(store)
                elapsed = time.monotonic() - start
                live.update(self.table(records, elapsed))
                if not killed and elapsed > 8:
                    self.stack.servers["host"].kill()
                    self.events.append(f"kill -9 of the host at {elapsed:.0f}s; restarted")
                    await asyncio.to_thread(self.stack.restart, "host")
                    killed = True
                done = [r for r in records.values() if r.ProcessState in TERMINAL_STATES]
                if killed and len(records) >= self.count and len(done) == len(records):
                    return records
                if elapsed > self.timeout:
                    self.events.append(f"timeout after {self.timeout:.0f}s")
                    return records
                dead = self.stack.dead()
                if dead:
                    raise RuntimeError(f"{', '.join(dead)} died; see {self.stack.run_dir / 'logs'}")
                await asyncio.sleep(2)

    # --- checking ----------------------------------------------------------------------

    async def drain(self, client: ServiceBusClient, queue: str) -> list:
        out = []
        receiver = client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
        async with receiver:
            while batch := await receiver.receive_messages(max_message_count=200, max_wait_time=2):
                out.extend(batch)
        return out

    async def check(self, client, records: dict[str, OrderState]) -> list[str]:
        violations: list[str] = []
        replies: dict[str, list[str]] = {}
        for message in await self.drain(client, "replies-webshop"):
            update = json.loads(b"".join(message.body))
            replies.setdefault(update["OrderID"], []).append(update["Status"])
        dead = await self.drain(client, "orders/$deadletterqueue")
        reasons = Counter(m.dead_letter_reason for m in dead)
        alerts = Counter(json.loads(b"".join(m.body))["Kind"] for m in await self.drain(client, "alerts"))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{self.remote}/_admin/side-effects") as response:
                effects = await response.json()

        # 1. every accepted order is terminal, in the store and on its reply queue
        expected = {o.OrderID for o in self.orders}
        missing = expected - set(records)
        if missing:
            violations.append(f"1: {len(missing)} accepted orders have no state record")
        for oid, record in records.items():
            if record.ProcessState not in TERMINAL_STATES:
                violations.append(f"1: {oid} is still {record.ProcessState.value}")
            elif STATUS_OF_STATE[record.ProcessState] not in replies.get(oid, []):
                violations.append(f"1: {oid} is {record.ProcessState.value} but its reply queue never said so")
        # 2. no remote side effect twice for one (order, step)
        for row in effects["duplicates"]:
            violations.append(f"2: {row['order_id']} {row['step']} {row['operation']} applied {row['count']} times")
        # 3. a stale attempt never changed the record: writes come from attempts in order
        for oid, record in records.items():
            attempts = [int(m.group(1)) for h in record.History if (m := re.fullmatch(rf"{re.escape(oid)}:(\d+)", h.By))]
            if attempts != sorted(attempts):
                violations.append(f"3: {oid} was written by attempts out of order: {attempts}")
        # 4. conflicting and malformed submissions dead-lettered with a reason and alerted, nothing overwritten
        for reason in ("OrderConflict", "InvalidMessage", "ReplyQueueNotAllowed"):
            if reasons[reason] < 1:
                violations.append(f"4: no dead-lettered message with reason {reason}")
            if alerts[reason] < 1:
                violations.append(f"4: no {reason} alert")
        if self.conflict_id in records and records[self.conflict_id].OrderDigest != self.orders[1].digest():
            violations.append(f"4: {self.conflict_id} was overwritten by the conflicting submission")
        if f"{self.prefix}-NOTOWNED" in records:
            violations.append("4: an order naming another app's reply queue was accepted")
        # 5. nothing retries forever
        bound = self.settings.retry.max_failures
        for oid, record in records.items():
            if record.FailureCount > bound:
                violations.append(f"5: {oid} failed {record.FailureCount} times (bound {bound})")
        # 6. the Supervisor's cost per run is bounded by its page size
        reads = [int(n) for n in re.findall(r"supervisor: read=(\d+)", self.host_log())]
        if not reads:
            violations.append("6: no Supervisor run was logged")
        elif max(reads) > self.settings.supervisor_page_size * 2:
            violations.append(f"6: a Supervisor run read {max(reads)} documents (page {self.settings.supervisor_page_size})")
        self.summary(records, replies, reasons, alerts, effects, reads)
        return violations

    def host_log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.stack.run_dir / "logs").glob("host*.log"))

    def summary(self, records, replies, reasons, alerts, effects, reads) -> None:
        t = Table(title="demo summary")
        t.add_column("what")
        t.add_column("figures")
        t.add_row("final states", ", ".join(f"{k}: {v}" for k, v in Counter(
            r.ProcessState.value for r in records.values()).most_common()))
        t.add_row("attempts per order", ", ".join(f"{k}: {v}" for k, v in sorted(Counter(
            r.Attempt for r in records.values()).items())))
        t.add_row("status messages", str(sum(len(v) for v in replies.values())))
        t.add_row("dead-lettered", ", ".join(f"{k}: {v}" for k, v in reasons.items()) or "none")
        t.add_row("alerts", ", ".join(f"{k}: {v}" for k, v in alerts.items()) or "none")
        t.add_row("remote side effects", f"{effects['total']} applied, {len(effects['duplicates'])} duplicated, "
                                         f"{effects.get('replays', 0)} replays answered from the idempotency store")
        t.add_row("supervisor runs", f"{len(reads)}, most documents read in one run: {max(reads) if reads else 0}")
        for event in self.events:
            t.add_row("event", event)
        console.print(t)

    async def run(self) -> int:
        cfg = self.settings
        cosmos = build_client(cfg.state_account)
        store = CosmosStateStore(
            cosmos.get_database_client(cfg.state_database).get_container_client(cfg.state_container))
        async with cosmos, ServiceBusClient.from_connection_string(cfg.servicebus.connection_string) as bus:
            await self.faults()
            await self.post(bus)
            records = await self.wait(store)
            violations = await self.check(bus, records)
        counts = Counter(r.ProcessState.value for r in records.values())
        tally = ", ".join(f"{v} {k}" for k, v in counts.most_common())
        if violations:
            for v in violations[:50]:
                console.print(f"[red]violation[/] {v}")
            print(f"demo: {len(records)} orders, {tally}, {len(violations)} invariant violations")
            return 1
        print(f"demo: {len(records)} orders, {tally}, invariants OK")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--run-dir", default=None, help="data and logs (default .devstack/demo-<time>)")
    parser.add_argument("--keep", action="store_true", help="leave the run directory for inspection")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir or REPO / ".devstack" / f"demo-{datetime.now(UTC):%Y%m%d-%H%M%S}")
    stack = Stack(run_dir, overrides=DEMO_SETTINGS)
    console.print(f"demo: starting the local stack in {run_dir}")
    try:
        stack.start()
        return asyncio.run(Demo(stack, args.orders, args.timeout).run())
    finally:
        stack.stop()
        console.print(f"demo: logs in {run_dir / 'logs'}")


if __name__ == "__main__":
    sys.exit(main())
