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
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from rich.console import Console
from rich.live import Live
from rich.table import Table

from adapters.cosmos_client import build_client
from adapters.settings import load_settings
from adapters.state_store import CosmosStateStore
from agents.config import SERVICE_URL_PREFIX, load_step_catalog
from cli.orders import generate
from devstack.invariants import INGRESS_QUEUE, observe, records_with_prefix, violations
from devstack.process import exit_on_signals
from devstack.stack import REPO, Stack
from domain.codec import encode
from domain.models import TERMINAL_STATES, OrderState, ProcessState

console = Console()

DEMO_SETTINGS = {
    # Deadlines sized for a 2-core machine running every server of the stack,
    # with a host that is killed and takes ~15 s to come back with its leases.
    "STEP_TIMEOUT_SECONDS": "30",
    "CLAIM_TIMEOUT_SECONDS": "30",
    "FAILURE_THRESHOLD": "4",
    "LONG_RETRIES": "1",
    "LONG_RETRY_DELAY_SECONDS": "15",
    "STARTER_SCHEDULE": "*/2 * * * * *",
    "STARTER_BATCH_SIZE": "50",
    "MAX_PROCESSING": "60",
    "SUPERVISOR_SCHEDULE": "*/3 * * * * *",
    "SUPERVISOR_PAGE_SIZE": "50",
    "SUPERVISOR_SCAN": "index",
    "PENDING_BACKLOG_LIMIT": "5000",
}


class Demo:
    def __init__(self, stack: Stack, orders: int, timeout: float) -> None:
        self.stack = stack
        self.count = orders
        self.timeout = timeout
        self.settings = load_settings(stack.settings)
        self.remote = stack.settings["REMOTE_SERVICE_URL"]
        self.steps = load_step_catalog(stack.settings)
        self.prefix = f"DEMO-{uuid.uuid4().hex[:4]}"
        self.orders = list(generate("webshop", "replies-webshop", orders, self.prefix, seed=7))
        self.declined = {o.OrderID for i, o in enumerate(self.orders) if i % 40 == 13}
        self.conflict_id = self.orders[1].OrderID
        self.events: list[str] = []

    # --- setting the scene -----------------------------------------------------------

    def url_for(self, service: str) -> str:
        """Where `service` is served (its REMOTE_SERVICE_URL__<SERVICE>, else the default)."""
        return self.stack.settings.get(f"{SERVICE_URL_PREFIX}{service.upper()}") or self.remote

    async def faults(self) -> None:
        """The scene, from the step catalog: crashes after the first step's
        effect, an outage of the last step's service, and the refusing step
        (the payment: "card declined") refused for a few orders."""
        first, last = self.steps.steps[0], self.steps.steps[-1]
        refused = next((s for s in self.steps.steps if s.refusal is not None), first)
        refusal = refused.refusal or "refused"
        rules = [
            {"kind": "transient", "service": "*", "rate": 0.1},
            {
                "kind": "crash",
                "service": first.service,
                "operation": first.do_operation,
                "count": 3,
                "mode": "drop",
            },
            # longer than a step deadline (30 s): those attempts time out and the Supervisor retries them
            {
                "kind": "outage",
                "service": last.service,
                "operation": last.do_operation,
                "seconds": 40,
            },
        ]
        rules += [
            {
                "kind": "permanent",
                "service": refused.service,
                "operation": refused.do_operation,
                "order_id": oid,
                "message": refusal,
            }
            for oid in sorted(self.declined)
        ]
        urls = {self.url_for(service) for service in self.steps.services}
        async with aiohttp.ClientSession() as http:
            for rule in rules:
                service = str(rule["service"])
                for url in sorted(urls) if service == "*" else [self.url_for(service)]:
                    async with http.post(f"{url}/_admin/faults", json=rule) as response:
                        response.raise_for_status()
        self.events.append(
            f"faults: 10% transient errors, 3 crashes after a side effect, a 40 s {last.service} "
            f"outage, {len(self.declined)} {refused.service} calls refused ({refusal})"
        )

    async def post(self, client: ServiceBusClient) -> None:
        bodies = [(f"submit/{o.OrderID}", encode(o)) for o in self.orders]
        original = self.orders[1].model_dump(mode="json")
        conflicting = {**original, "Customer": {"CustomerId": "C-someone-else"}}
        not_owned = self.orders[2].model_dump(mode="json") | {
            "OrderID": f"{self.prefix}-NOTOWNED",
            "ReplyTo": "replies-partner-portal",
        }
        extras = [
            ("dup/0", encode(self.orders[0])),  # the same order again, another message id
            ("conflict/1", json.dumps(conflicting).encode()),
            ("malformed", b'{"OrderID": "x", "Lines": "lots"}'),
            ("notowned", json.dumps(not_owned).encode()),
        ]
        async with client.get_queue_sender(INGRESS_QUEUE) as sender:
            for start in range(0, len(bodies), 100):
                await sender.send_messages(
                    [ServiceBusMessage(b, message_id=m) for m, b in bodies[start : start + 100]]
                )
            await asyncio.sleep(3)  # let the originals land first, so the conflict is a conflict
            await sender.send_messages([ServiceBusMessage(b, message_id=m) for m, b in extras])
        self.events.append(
            f"posted {len(bodies)} orders, a duplicate, a conflicting order, "
            "a malformed message and an order naming another app's reply queue"
        )

    # --- watching ------------------------------------------------------------------------

    async def records(self, store: CosmosStateStore) -> dict[str, OrderState]:
        return await records_with_prefix(store, self.prefix)

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

    async def check(self, client, store, records: dict[str, OrderState]) -> list[str]:
        observed = await observe(
            store, client, self.remote, self.prefix, self.stack.run_dir / "logs"
        )
        observed.records = records
        found = violations(
            observed,
            self.settings,
            accepted={o.OrderID for o in self.orders},
            refused={"OrderConflict": 1, "InvalidMessage": 1, "ReplyQueueNotAllowed": 1},
            originals={self.conflict_id: self.orders[1].digest()},
        )
        if f"{self.prefix}-NOTOWNED" in records:
            found.append("4: an order naming another app's reply queue was accepted")
        if not observed.supervisor_reads:
            found.append("6: no Supervisor run was logged")
        self.summary(
            records,
            observed.replies,
            observed.dead_letter_reasons,
            observed.alerts,
            observed.side_effects,
            observed.supervisor_reads,
        )
        return found

    def host_log(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in (self.stack.run_dir / "logs").glob("host*.log")
        )

    def summary(self, records, replies, reasons, alerts, effects, reads) -> None:
        t = Table(title="demo summary")
        t.add_column("what")
        t.add_column("figures")
        t.add_row(
            "final states",
            ", ".join(
                f"{k}: {v}"
                for k, v in Counter(r.ProcessState.value for r in records.values()).most_common()
            ),
        )
        t.add_row(
            "attempts per order",
            ", ".join(
                f"{k}: {v}" for k, v in sorted(Counter(r.Attempt for r in records.values()).items())
            ),
        )
        t.add_row("status messages", str(sum(len(v) for v in replies.values())))
        t.add_row("dead-lettered", ", ".join(f"{k}: {v}" for k, v in reasons.items()) or "none")
        t.add_row("alerts", ", ".join(f"{k}: {v}" for k, v in alerts.items()) or "none")
        t.add_row(
            "remote side effects",
            f"{effects['total']} applied, {len(effects['duplicates'])} duplicated, "
            f"{effects.get('replays', 0)} replays answered from the idempotency store",
        )
        t.add_row(
            "supervisor runs",
            f"{len(reads)}, most documents read in one run: "
            f"{max((read for _pages, read in reads), default=0)}",
        )
        for event in self.events:
            t.add_row("event", event)
        console.print(t)

    async def run(self) -> int:
        cfg = self.settings
        cosmos = build_client(cfg.state_account)
        store = CosmosStateStore(
            cosmos.get_database_client(cfg.state_database).get_container_client(cfg.state_container)
        )
        async with (
            cosmos,
            ServiceBusClient.from_connection_string(cfg.servicebus.connection_string) as bus,
        ):
            await self.faults()
            await self.post(bus)
            records = await self.wait(store)
            found = await self.check(bus, store, records)
        counts = Counter(r.ProcessState.value for r in records.values())
        tally = ", ".join(f"{v} {k}" for k, v in counts.most_common())
        if found:
            for v in found[:50]:
                console.print(f"[red]violation[/] {v}")
            print(f"demo: {len(records)} orders, {tally}, {len(found)} invariant violations")
            return 1
        print(f"demo: {len(records)} orders, {tally}, invariants OK")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--run-dir", default=None, help="data and logs (default .devstack/demo-<time>)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the run directory for inspection"
    )
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir or REPO / ".devstack" / f"demo-{datetime.now(UTC):%Y%m%d-%H%M%S}")
    stack = Stack(run_dir, overrides=DEMO_SETTINGS)
    # SIGTERM (a CI timeout, a process manager) and SIGHUP (a closed terminal)
    # stop the stack as Ctrl-C does; a SIGKILL is left to the reaper.
    exit_on_signals()
    console.print(f"demo: starting the local stack in {run_dir}")
    try:
        stack.start()
        return asyncio.run(Demo(stack, args.orders, args.timeout).run())
    except KeyboardInterrupt:
        console.print("demo: interrupted")
        return 130
    finally:
        console.print("demo: stopping the local stack")
        stack.stop()
        console.print(f"demo: logs in {run_dir / 'logs'}")


if __name__ == "__main__":
    sys.exit(main())
