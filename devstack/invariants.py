"""The invariants of DESIGN.md §7, checked from the outside: the state store,
the reply queue, the ingress queue's dead-letter queue, the alerts queue, the remote
service's side-effect counts and the host's Supervisor log lines. Used by
`make demo` and the end-to-end fault tests."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from adapters.settings import Settings
from adapters.state_store import CosmosStateStore
from domain.models import TERMINAL_STATES, OrderState, ProcessState

STATUS_OF_STATE = {
    ProcessState.PROCESSED: "Processed",
    ProcessState.ERROR: "Failed",
    ProcessState.COMPENSATED: "Compensated",
    ProcessState.COMPENSATION_FAILED: "CompensationFailed",
    ProcessState.REJECTED: "Rejected",
}


@dataclass
class Observed:
    records: dict[str, OrderState]
    replies: dict[str, list[str]] = field(default_factory=dict)
    dead_letter_reasons: Counter = field(default_factory=Counter)
    alerts: Counter = field(default_factory=Counter)
    side_effects: dict = field(default_factory=dict)
    supervisor_reads: list[tuple[int, int]] = field(default_factory=list)  # (pages, read)


async def records_with_prefix(
    store: CosmosStateStore, prefix: str, app: str = "webshop"
) -> dict[str, OrderState]:
    """`app`'s records whose OrderID starts with `prefix`, by OrderID (the
    client's: its own ids, whatever another application uses)."""
    out = {}
    for state in ProcessState:
        for record in await store.query_in_state(state, 10_000):
            if record.AppId == app and record.order_id.startswith(prefix):
                out[record.order_id] = record
    return out


async def drain(client: ServiceBusClient, queue: str, wait: float = 2) -> list:
    out = []
    receiver = client.get_queue_receiver(
        queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    )
    async with receiver:
        while batch := await receiver.receive_messages(max_message_count=200, max_wait_time=wait):
            out.extend(batch)
    return out


# The webshop's ingress queue: the demo and the end-to-end tests post as the
# webshop (Submit takes the AppId from the queue).
INGRESS_QUEUE = "orders-webshop"


async def observe(
    store: CosmosStateStore,
    bus: ServiceBusClient,
    remote_url: str,
    prefix: str,
    log_dir: Path,
    reply_queue: str = "replies-webshop",
    ingress_queue: str = INGRESS_QUEUE,
    app: str = "webshop",
) -> Observed:
    observed = Observed(records=await records_with_prefix(store, prefix, app))
    for message in await drain(bus, reply_queue):
        update = json.loads(b"".join(message.body))
        observed.replies.setdefault(update["OrderID"], []).append(update["Status"])
    for message in await drain(bus, f"{ingress_queue}/$deadletterqueue"):
        observed.dead_letter_reasons[message.dead_letter_reason] += 1
    for message in await drain(bus, "alerts"):
        observed.alerts[json.loads(b"".join(message.body))["Kind"]] += 1
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{remote_url}/_admin/side-effects") as response,
    ):
        effects = await response.json()
    # The service names an order by its key's order part (`{app}:{OrderID}`).
    effects["duplicates"] = [
        r for r in effects["duplicates"] if r["order_id"].rpartition(":")[2].startswith(prefix)
    ]
    observed.side_effects = effects
    log = "".join(p.read_text(errors="replace") for p in log_dir.glob("host*.log"))
    observed.supervisor_reads = [
        (int(pages), int(read))
        for pages, read in re.findall(r"supervisor: pages=(\d+) read=(\d+)", log)
    ]
    return observed


def violations(
    observed: Observed,
    settings: Settings,
    accepted: set[str],
    refused: dict[str, str] | None = None,
    originals: dict[str, str] | None = None,
) -> list[str]:
    """`accepted`: order ids that must end terminal; `refused`: dead-letter
    reason -> how many at least; `originals`: order id -> the digest its record
    must still carry after a conflicting submission."""
    found: list[str] = []
    records = observed.records
    # 1. every accepted order reaches a terminal state, in the store and on its reply queue
    for oid in sorted(accepted - set(records)):
        found.append(f"1: accepted order {oid} has no state record")
    for oid in sorted(accepted & set(records)):
        record = records[oid]
        if record.ProcessState not in TERMINAL_STATES:
            found.append(f"1: {oid} is still {record.ProcessState.value}")
        elif STATUS_OF_STATE[record.ProcessState] not in observed.replies.get(oid, []):
            found.append(
                f"1: {oid} is {record.ProcessState.value} but its reply queue never said so"
            )
    # 2. no remote side effect applied twice for one (order, step)
    for row in observed.side_effects.get("duplicates", []):
        found.append(
            f"2: {row['order_id']} {row['step']} {row['operation']} applied {row['count']} times"
        )
    # 3. a stale attempt never changes the record: transitions come from attempts in order
    for oid, record in records.items():
        attempts = [
            int(m.group(1))
            for h in record.History
            if (m := re.fullmatch(rf"{re.escape(record.id)}:(\d+)", h.By))
        ]
        if attempts != sorted(attempts):
            found.append(f"3: {oid} was written by attempts out of order: {attempts}")
    # 4. conflicting or malformed submissions are dead-lettered with a reason and alerted, nothing overwritten
    for reason, least in (refused or {}).items():
        if observed.dead_letter_reasons[reason] < int(least):
            found.append(f"4: expected a dead-lettered message with reason {reason}")
        if observed.alerts[reason] < int(least):
            found.append(f"4: expected an {reason} alert")
    for oid, digest in (originals or {}).items():
        if oid in records and records[oid].OrderDigest != digest:
            found.append(f"4: {oid} was overwritten by a conflicting submission")
    # 5. nothing retries forever
    bound = settings.retry.max_failures
    for oid, record in records.items():
        if record.FailureCount > bound:
            found.append(f"5: {oid} failed {record.FailureCount} times (bound {bound})")
    # 6. the Supervisor's cost per run is bounded by its page size and page
    #    count (an index page reads entries and then their records: twice the
    #    page at most), never by the number of records
    for pages, read in observed.supervisor_reads:
        if (
            pages > settings.supervisor_max_pages
            or read > 2 * settings.supervisor_page_size * pages
        ):
            found.append(
                f"6: a Supervisor run read {read} documents in {pages} pages "
                f"(page size {settings.supervisor_page_size}, at most "
                f"{settings.supervisor_max_pages} pages)"
            )
            break
    return found
