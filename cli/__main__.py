"""The client and operator tool.

    python -m cli post --app webshop --count 20
    python -m cli watch --app webshop --expect 20
    python -m cli show ORDER_ID
    python -m cli list --state Error
    python -m cli stuck
    python -m cli resubmit ORDER_ID
    python -m cli alerts
    python -m cli deadletters orders
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import typer
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from rich.console import Console
from rich.live import Live
from rich.table import Table

from adapters.cosmos_client import build_client
from adapters.ports import ANY_OWNER
from adapters.servicebus import servicebus_client
from adapters.settings import Settings
from adapters.state_store import CosmosStateStore
from cli import orders as order_source
from cli.config import tool_settings
from domain import state_machine as sm
from domain.codec import encode
from domain.models import ProcessState

app = typer.Typer(
    help="Post orders, watch their status, and operate the order pipeline.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()

TERMINAL_STATUSES = {"Processed", "Failed", "Rejected", "Compensated", "CompensationFailed"}


def _run(coro):
    return asyncio.run(coro)


def _settings() -> Settings:
    return tool_settings()


async def _store(cfg: Settings):
    client = build_client(cfg.state_account)
    container = client.get_database_client(cfg.state_database).get_container_client(cfg.state_container)
    return client, CosmosStateStore(container)


@app.command()
def post(
    app_id: str = typer.Option("webshop", "--app", help="the submitting application's id"),
    count: int = typer.Option(1, help="how many orders to generate"),
    file: Path | None = typer.Option(None, help="a JSON file with one order or a list of them"),
    reply_to: str | None = typer.Option(None, help="reply queue (default: the app's registered one)"),
    prefix: str | None = typer.Option(None, help="OrderID prefix for generated orders"),
    seed: int | None = typer.Option(None, help="random seed for generated orders"),
) -> None:
    """Post orders to the `orders` queue as application APP."""
    cfg = _settings()
    queue = reply_to or cfg.reply_queues.get(app_id)
    if queue is None:
        raise typer.BadParameter(f"application {app_id!r} has no registered reply queue; pass --reply-to")
    if file is not None:
        bodies = [(o.get("OrderID", "?"), json.dumps(o).encode()) for o in order_source.from_file(file)]
    else:
        bodies = [(o.OrderID, encode(o)) for o in order_source.generate(app_id, queue, count, prefix, seed)]

    async def send():
        async with servicebus_client(cfg.servicebus) as client, client.get_queue_sender("orders") as sender:
            for start in range(0, len(bodies), 100):
                chunk = bodies[start : start + 100]
                await sender.send_messages(
                    [ServiceBusMessage(body, message_id=f"submit/{oid}", content_type="application/json")
                     for oid, body in chunk]
                )

    _run(send())
    for oid, _ in bodies[:5]:
        console.print(f"posted {oid}")
    if len(bodies) > 5:
        console.print(f"... and {len(bodies) - 5} more")
    console.print(f"[bold]{len(bodies)}[/] orders posted to [bold]orders[/] as {app_id} (replies to {queue})")


@app.command()
def watch(
    app_id: str = typer.Option("webshop", "--app"),
    expect: int = typer.Option(0, help="stop when this many orders reached a final status"),
    timeout: float = typer.Option(300, help="seconds to watch"),
) -> None:
    """Watch the app's reply queue with a live view per order."""
    cfg = _settings()
    queue = cfg.reply_queues.get(app_id)
    if queue is None:
        raise typer.BadParameter(f"application {app_id!r} has no registered reply queue")
    latest: dict[str, str] = {}

    def table() -> Table:
        t = Table(title=f"{queue}: {len(latest)} orders")
        t.add_column("OrderID")
        t.add_column("status")
        for oid, status in sorted(latest.items())[-30:]:
            t.add_row(oid, status)
        counts = {}
        for status in latest.values():
            counts[status] = counts.get(status, 0) + 1
        t.caption = "  ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
        return t

    async def receive():
        deadline = time.monotonic() + timeout
        async with servicebus_client(cfg.servicebus) as client:
            receiver = client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
            async with receiver:
                with Live(table(), console=console, refresh_per_second=4) as live:
                    while time.monotonic() < deadline:
                        for message in await receiver.receive_messages(max_message_count=50, max_wait_time=1):
                            update = json.loads(b"".join(message.body))
                            latest[update["OrderID"]] = update["Status"]
                        live.update(table())
                        final = sum(1 for s in latest.values() if s in TERMINAL_STATUSES)
                        if expect and final >= expect:
                            return

    _run(receive())


@app.command()
def show(order_id: str) -> None:
    """An order's state record and its history."""
    cfg = _settings()

    async def read():
        client, store = await _store(cfg)
        async with client:
            return await store.read(order_id)

    record, etag = _run(read())
    console.print_json(record.model_dump_json(exclude={"History"}))
    t = Table(title="history")
    for col in ("at", "from", "to", "by", "reason"):
        t.add_column(col)
    for h in record.History:
        t.add_row(h.At.isoformat(), h.From or "", h.To, h.By, h.Reason or "")
    console.print(t)


def _list(state: ProcessState, stuck_only: bool = False, limit: int = 100) -> None:
    cfg = _settings()
    now = datetime.now(UTC)

    async def query():
        client, store = await _store(cfg)
        async with client:
            return await store.query_in_state(state, limit)

    records = _run(query())
    if stuck_only:
        records = [r for r in records if r.CompleteBy and r.CompleteBy < now]
    t = Table(title=f"{len(records)} {'stuck ' if stuck_only else ''}{state.value} orders")
    for col in ("OrderID", "attempt", "failures", "CompleteBy", "LockedBy", "LastError"):
        t.add_column(col)
    for r in records:
        t.add_row(r.id, str(r.Attempt), str(r.FailureCount), r.CompleteBy.isoformat() if r.CompleteBy else "",
                  r.LockedBy or "", (r.LastError or "")[:60])
    console.print(t)


@app.command(name="list")
def list_orders(
    state: ProcessState = typer.Option(ProcessState.ERROR, help="which state"),
    limit: int = typer.Option(100),
) -> None:
    """Orders in one state (Error, CompensationFailed, Processing, ...)."""
    _list(state, limit=limit)


@app.command()
def stuck(limit: int = typer.Option(100)) -> None:
    """Processing orders whose deadline has passed (the Supervisor's next work)."""
    _list(ProcessState.PROCESSING, stuck_only=True, limit=limit)


@app.command()
def resubmit(order_id: str) -> None:
    """Put an Error order back to Pending with a fresh retry budget."""
    cfg = _settings()

    async def write():
        client, store = await _store(cfg)
        async with client:
            return await store.update(order_id, lambda r: sm.resubmit(r, datetime.now(UTC)), ANY_OWNER)

    record, _ = _run(write())
    console.print(f"{order_id}: {record.ProcessState.value}; the starter will pick it up")


@app.command()
def compensate(order_id: str) -> None:
    """Undo an Error or CompensationFailed order's completed steps (again)."""
    cfg = _settings()

    async def write():
        client, store = await _store(cfg)
        async with client:
            return await store.update(
                order_id, lambda r: sm.request_compensation(r, datetime.now(UTC)), ANY_OWNER
            )

    record, _ = _run(write())
    console.print(f"{order_id}: compensation requested; the starter will run it")


def _tail(queue: str, peek: bool, limit: int) -> None:
    cfg = _settings()

    async def read():
        async with servicebus_client(cfg.servicebus) as client:
            receiver = client.get_queue_receiver(queue)
            async with receiver:
                if peek:
                    return [(m, None) for m in await receiver.peek_messages(max_message_count=limit)]
                out = []
                for m in await receiver.receive_messages(max_message_count=limit, max_wait_time=2):
                    out.append((m, None))
                    await receiver.complete_message(m)
                return out

    for message, _ in _run(read()):
        body = b"".join(message.body).decode("utf-8", "replace")
        reason = message.dead_letter_reason or ""
        console.print(f"[bold]{message.message_id}[/] {reason} {message.dead_letter_error_description or ''}")
        console.print(f"  {body[:300]}")


@app.command()
def alerts(peek: bool = typer.Option(True, help="peek (leave them) or receive and complete"),
           limit: int = typer.Option(50)) -> None:
    """Operator alerts from the `alerts` queue."""
    _tail("alerts", peek, limit)


@app.command()
def deadletters(queue: str, limit: int = typer.Option(50)) -> None:
    """Peek the dead-letter queue of QUEUE with reasons."""
    _tail(f"{queue}/$deadletterqueue", True, limit)


def main() -> int:
    """Known failures (bad settings, unreachable servers, domain refusals) end
    with one line, not a traceback."""
    from adapters.settings import SettingsError
    from domain.errors import DomainError

    try:
        app()
    except (SettingsError, DomainError, sm.IllegalTransition) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
