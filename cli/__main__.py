"""The client and operator tool, `python -m cli --help` (the commands:
docs/operations.md). It reads and acts through console.views, as the console
does; text that clients wrote is printed through cli.render."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import typer
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import MessagingEntityNotFoundError, ServiceBusError
from rich.console import Console
from rich.live import Live
from rich.text import Text

from adapters.servicebus import (
    ALERTS_QUEUE,
    servicebus_client,
)
from adapters.settings import Settings
from adapters.state_store import CosmosStateStore
from cli import orders as order_source
from cli import render
from cli.config import tool_settings
from cli.render import visible
from console import actions, views
from console.security import Forbidden, record_version
from domain import state_machine as sm
from domain.codec import encode
from domain.ids import bounded_id, check_order_key
from domain.models import ProcessState

app = typer.Typer(
    help="Post orders, watch their status, and operate the order pipeline.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
T = TypeVar("T")

TERMINAL_STATUSES = {"Processed", "Failed", "Rejected", "Compensated", "CompensationFailed"}


def _with_store(use: Callable[[CosmosStateStore], Awaitable[T]]) -> T:
    """Run `use` on the state store, with a Cosmos client opened for it and closed after."""
    cfg = tool_settings()

    async def run() -> T:
        import bootstrap  # only for the commands that need the store

        async with bootstrap.state_store(cfg) as store:
            return await use(store)

    return asyncio.run(run())


@app.command()
def post(
    app_id: str = typer.Option("webshop", "--app", help="the submitting application's id"),
    count: int = typer.Option(1, help="how many orders to generate"),
    file: Path | None = typer.Option(None, help="a JSON file with one order or a list of them"),
    reply_to: str | None = typer.Option(
        None, help="reply queue (default: the app's registered one)"
    ),
    prefix: str | None = typer.Option(None, help="OrderID prefix for generated orders"),
    seed: int | None = typer.Option(None, help="random seed for generated orders"),
) -> None:
    """Post orders to application APP's ingress queue (`orders-APP` by default)."""
    cfg = tool_settings()
    queue = reply_to or cfg.reply_queues.get(app_id)
    if queue is None:
        raise typer.BadParameter(
            f"application {app_id!r} has no registered reply queue; pass --reply-to"
        )
    # Submit takes the AppId from the queue an order arrives on (ADR 010).
    ingress = cfg.ingress_queues.get(app_id)
    if ingress is None:
        raise typer.BadParameter(
            f"application {app_id!r} has no ingress queue (ORDER_INGRESS_QUEUES)"
        )
    if file is not None:
        orders = [
            (str(o.get("OrderID", "?")) if isinstance(o, dict) else "?", json.dumps(o).encode())
            for o in order_source.from_file(file)
        ]
    else:
        generated = order_source.generate(app_id, queue, count, prefix, seed)
        orders = [(o.OrderID, encode(o)) for o in generated]
    asyncio.run(_send(cfg, ingress, [_submit_message(oid, body) for oid, body in orders]))
    for oid, _ in orders[:5]:
        console.print(Text.assemble("posted ", render.literal(oid, 80)))
    if len(orders) > 5:
        console.print(f"... and {len(orders) - 5} more")
    console.print(
        Text(
            f"{len(orders)} orders posted to {render.visible(ingress)} as {render.visible(app_id)} "
            f"(replies to {render.visible(queue)})"
        )
    )


async def _send(cfg: Settings, queue: str, messages: list[ServiceBusMessage]) -> None:
    """`messages` to `queue`, a hundred a batch."""
    async with (
        servicebus_client(cfg.servicebus) as client,
        client.get_queue_sender(queue) as sender,
    ):
        for start in range(0, len(messages), 100):
            await sender.send_messages(messages[start : start + 100])


def _submit_message(order_id: str, body: bytes) -> ServiceBusMessage:
    """An order as a client sends it, with the message id `submit/{OrderID}`
    (a digest of the OrderID where that is longer than a message id may be)."""
    mid = bounded_id(f"submit/{order_id}", "submit/", order_id)
    return ServiceBusMessage(body, message_id=mid, content_type="application/json")


@app.command()
def watch(
    app_id: str = typer.Option("webshop", "--app"),
    expect: int = typer.Option(0, help="stop when this many orders reached a final status"),
    timeout: float = typer.Option(300, help="seconds to watch"),
    consume: bool = typer.Option(
        False, help="receive and delete the statuses (the client's job); default: peek, leave them"
    ),
) -> None:
    """Watch the app's reply queue, a live line per order (peeked: the
    statuses stay for the application; --consume removes them)."""
    cfg = tool_settings()
    queue = cfg.reply_queues.get(app_id)
    if queue is None:
        raise typer.BadParameter(f"application {app_id!r} has no registered reply queue")
    asyncio.run(_watch(cfg, queue, expect, timeout, consume))


async def _watch(cfg: Settings, queue: str, expect: int, timeout: float, consume: bool) -> None:
    """A live table of the last status of each order on `queue`, until
    `expect` orders reached a final status or `timeout` seconds passed."""
    latest: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE if consume else ServiceBusReceiveMode.PEEK_LOCK
    async with (
        servicebus_client(cfg.servicebus) as client,
        client.get_queue_receiver(queue, receive_mode=mode) as receiver,
    ):
        table = render.status_table(queue, latest)
        with Live(table, console=console, refresh_per_second=4) as live:
            next_sequence = 0
            while time.monotonic() < deadline:
                if consume:
                    batch = await receiver.receive_messages(max_message_count=50, max_wait_time=1)
                else:
                    batch = await receiver.peek_messages(
                        max_message_count=50, sequence_number=next_sequence
                    )
                    if batch:
                        next_sequence = max(m.sequence_number or 0 for m in batch) + 1
                    else:
                        await asyncio.sleep(1)
                for status in (render.read_status(views.message_view(m, 0)) for m in batch):
                    if status is not None:
                        latest[status[0]] = status[1]
                live.update(render.status_table(queue, latest))
                if expect and sum(s in TERMINAL_STATUSES for s in latest.values()) >= expect:
                    return


def _order_id(order_id: str) -> str:
    """An order key: `{app}:{OrderID}` (or a bare OrderID written before keys named the application)."""
    try:
        return check_order_key(order_id)
    except ValueError as exc:
        raise ToolError(str(exc)) from None


class ToolError(Exception):
    """A refusal the tool explains in one line."""


@app.command()
def show(
    order_id: str,
    as_json: bool = typer.Option(False, "--json", help="the whole record as JSON"),
) -> None:
    """An order in a few lines: state, attempt, times, last error, steps,
    compensation, history. --json prints the whole record."""
    order_id = _order_id(order_id)
    record, _etag = _with_store(lambda store: store.read(order_id))
    if as_json:
        render.print_record_json(console, record)
    else:
        render.print_summary(console, record)


@app.command(name="list")
def list_orders(
    state: ProcessState | None = typer.Option(
        None, help="which state; without it, how many orders are in each"
    ),
    limit: int = typer.Option(100),
) -> None:
    """Orders in one state (Error, CompensationFailed, Processing, ...), or
    without --state the number of orders in each state."""
    if state is None:
        counts = _with_store(views.state_counts)
        render.print_counts(console, "{total} orders by state", counts)
        console.print(Text("list one state: python -m cli list --state STATE", style="dim"))
        return
    records = _with_store(lambda store: store.query_in_state(state, limit))
    render.print_records(console, f"{len(records)} {state.value} orders", records)


@app.command()
def stuck(limit: int = typer.Option(100)) -> None:
    """Processing orders whose deadline has passed (the Supervisor's next
    work), by the Supervisor's own query, as the console's stuck page."""
    now = datetime.now(UTC)
    found, _ = _with_store(lambda store: store.query_expired(now, views.EPOCH, limit))
    render.print_records(console, f"{len(found)} stuck Processing orders", [r for r, _ in found])


REASON_HELP = "why (recorded with your name in the order's history; asked when not given)"
OPERATOR_HELP = "your name as the history records it (default: $CLI_OPERATOR, else your login)"
YES_HELP = "act without asking for confirmation"


def _operator(name: str | None) -> str:
    """Who is acting: --operator, else $CLI_OPERATOR, else the login name."""
    import getpass
    import os

    raw = name or os.environ.get("CLI_OPERATOR") or ""
    if not raw:
        try:
            raw = getpass.getuser()
        except (OSError, KeyError):  # no login name on this machine (a bare container)
            raw = ""
    try:
        return actions.check_operator(raw)
    except actions.RefusedInput as exc:
        raise ToolError(f"{exc} (--operator NAME)") from None


def _asked(given: str | None, question: str, yes: bool) -> str | None:
    """The reason (--reason, else asked for on the terminal or stdin) once the
    operator confirmed `question` (--yes, else no unless y or yes); None,
    with "nothing done" printed, when not confirmed."""
    try:
        raw = given if given is not None else typer.prompt("Why (recorded with your name)")
    except typer.Abort:  # nothing to read the answer from
        raise ToolError("say why: --reason TEXT (it is recorded with your name)") from None
    try:
        why = actions.check_reason(raw)
    except actions.RefusedInput as exc:
        raise ToolError(str(exc)) from None
    try:
        if yes or typer.confirm(question, default=False):
            return why
    except typer.Abort:  # nothing to read the answer from
        raise ToolError("not confirmed; nothing done (answer at a terminal, or --yes)") from None
    console.print(Text("nothing done"))
    return None


def _order_action(action: str, order_id: str, reason: str | None, name: str | None, yes: bool):
    """An order action as the console's: show the order, ask why and to
    confirm, then act only if the record is still the version shown."""
    checked = _order_id(order_id)
    who = _operator(name)
    record, _ = _with_store(lambda store: store.read(checked))
    # refused here, in one line, when the state does not allow the action
    actions.apply(record, action, who, "-", datetime.now(UTC))
    title, explanation = actions.ORDER_ACTIONS[action]
    render.print_action_target(console, record, title, explanation, who)
    why = _asked(reason, f"{title} {visible(checked)} as {visible(who)}?", yes)
    if why is None:
        return None
    version = record_version(record)
    return _on_views(
        lambda deps: views.act(deps, checked, action, who, why, expected_version=version),
        store=True,
    )


def _order_command(action: str, doc: str, done: str) -> None:
    """`python -m cli ACTION ORDER_ID`: `_order_action`, then `done` printed
    (`{state}`: the order's state after)."""

    def command(
        order_id: str,
        reason: str | None = typer.Option(None, "--reason", "-r", help=REASON_HELP),
        operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
        yes: bool = typer.Option(False, "--yes", "-y", help=YES_HELP),
    ) -> None:
        record = _order_action(action, order_id, reason, operator, yes)
        if record is not None:
            said = done.format(state=record.ProcessState.value)
            console.print(Text(f"{visible(record.id)}: {said}"))

    command.__doc__ = doc
    app.command(name=action)(command)


_order_command(
    "resubmit",
    "Put an Error order back to Pending with a fresh retry budget.",
    "{state}; the starter will pick it up",
)
_order_command(
    "compensate",
    "Undo an Error or CompensationFailed order's completed steps (again).",
    "compensation requested; the starter will run it",
)
_order_command(
    "retry",
    "Take a Pending order in its long retry now, not at its next try.",
    "due now; the starter will pick it up",
)


_QUEUE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,259}")
PEEK_CAP = 10_000


BODY_LIMIT = 4096  # characters of a message's body kept for printing


async def _peek_all(deps: views.Deps, queue: str, dead_letter: bool = False) -> list[dict]:
    """The messages of `queue` (or its dead letters) as console.views shows
    them, PEEK_CAP at most."""
    found = await deps.servicebus.peek_all(queue, PEEK_CAP, dead_letter)
    apps = views.queue_apps(deps.settings)
    return [views.message_view(m, BODY_LIMIT, queue, apps) for m in found[:PEEK_CAP]]


@app.command()
def alerts(
    limit: int = typer.Option(50, help="how many to show"),
    oldest_first: bool = typer.Option(False, help="oldest first (default: newest first)"),
) -> None:
    """Operator alerts from the `alerts` queue, peeked, newest first (the
    console acknowledges or closes one, recording who and why)."""
    messages = _on_views(lambda deps: _peek_all(deps, ALERTS_QUEUE))
    render.print_alerts(console, messages, newest_first=not oldest_first, limit=limit)


@app.command()
def deadletters(
    queue: str | None = typer.Argument(None, help="one queue; without it, every queue"),
    limit: int = typer.Option(50, help="dead letters shown per queue"),
    resend: int | None = typer.Option(
        None, help="resend dead letter SEQ of QUEUE (RetriesExhausted/ProcessingFailed only)"
    ),
    discard: int | None = typer.Option(None, help="discard dead letter SEQ of QUEUE"),
    reason: str | None = typer.Option(None, "--reason", "-r", help=REASON_HELP),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help=YES_HELP),
) -> None:
    """Peek the dead letters of QUEUE (or of every queue), with reasons and
    sequence numbers; or resend or discard one, as the console does."""
    if queue is not None and not _QUEUE_NAME.fullmatch(queue):
        raise ToolError(f"{queue!r} is not a queue name (lowercase letters, digits, '.', '_', '-')")
    if resend is not None or discard is not None:
        if queue is None or (resend is not None and discard is not None):
            raise ToolError("name one queue and one of --resend SEQ or --discard SEQ")
        action, sequence = ("resend", resend) if resend is not None else ("discard", discard)
        assert sequence is not None
        _dead_letter_action(queue, sequence, action, reason, operator, yes)
        return
    if queue is not None:
        messages = _on_views(lambda deps: _peek_all(deps, queue, dead_letter=True))
        render.print_dead_letters(console, queue, messages[:limit])
        return
    found = _on_views(_dead_letters_everywhere)
    for name, messages in found.items():
        if messages:
            render.print_dead_letters(console, name, messages[:limit])
    # last, so that the counts stay on the screen after a long list
    counts = {name: len(m) for name, m in found.items()}
    render.print_counts(console, "{total} dead letters on {names} queues", counts)


async def _dead_letters_everywhere(deps: views.Deps) -> dict[str, list[dict]]:
    """The dead letters of every queue the console shows; a queue that
    cannot be read is said to be skipped."""
    found: dict[str, list[dict]] = {}
    for name in deps.queues():
        try:
            found[name] = await _peek_all(deps, name, dead_letter=True)
        except ServiceBusError as exc:
            missing = isinstance(exc, MessagingEntityNotFoundError)
            said = f"{name}: " + ("no such queue" if missing else str(exc).splitlines()[0])
            console.print(Text.assemble(("skipped: ", "yellow"), render.literal(said)))
    return found


def _on_views(use: Callable[[views.Deps], Awaitable[T]], store: bool = False) -> T:
    """Run `use` on console.views over a Service Bus client of its own (and
    the state store, with `store`); a refusal of the views is a ToolError."""
    from adapters.servicebus import ServiceBusPublisher
    from console.peek import QueuePeeker

    cfg = tool_settings()

    async def run() -> T:
        import bootstrap

        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(servicebus_client(cfg.servicebus))
            peeker, publisher = QueuePeeker(client), ServiceBusPublisher(client)
            stack.push_async_callback(peeker.close)
            stack.push_async_callback(publisher.close)
            found = await stack.enter_async_context(bootstrap.state_store(cfg)) if store else None
            deps = views.Deps(
                settings=cfg,
                store=cast(Any, found),
                reads=cast(Any, None),
                orders=None,
                servicebus=peeker,
                publisher=publisher,
                azure=False,
            )
            return await use(deps)

    try:
        return asyncio.run(run())
    except (views.BadRequest, Forbidden) as exc:  # NotFound too; Forbidden: the order changed
        raise ToolError(str(exc)) from None


def _dead_letter_action(
    queue: str, sequence: int, action: str, reason: str | None, name: str | None, yes: bool
) -> None:
    """Show the dead letter, ask why and for confirmation (not inside the
    event loop), then resend or discard it as the console does."""
    who = _operator(name)
    shown = _on_views(lambda deps: views.dead_letter(deps, queue, sequence))
    title, explanation = views.DEAD_LETTER_ACTIONS[action]
    render.print_dead_letter_target(console, queue, shown, title, explanation, who)
    why = _asked(reason, f"{title} dead letter {sequence} of {queue} as {visible(who)}?", yes)
    if why is None:
        return
    _on_views(lambda deps: views.act_on_dead_letter(deps, queue, sequence, action, who, why))
    done = "resent" if action == "resend" else "discarded"
    console.print(Text(f"dead letter {sequence} of {queue} {done} by {visible(who)}"))


@app.command()
def statuses(
    queue: str | None = typer.Argument(
        None,
        help="one reply queue (or alerts: alerts left after their status went); without it, all",
    ),
    resend: bool = typer.Option(False, help="resend QUEUE's parked statuses now (the oldest 50)"),
    order: str | None = typer.Option(None, help="with --resend: only this order's status"),
    reason: str | None = typer.Option(None, "--reason", "-r", help=REASON_HELP),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
    yes: bool = typer.Option(False, "--yes", "-y", help=YES_HELP),
) -> None:
    """Terminal statuses their reply queue refused, parked in their order's
    outbox; or resend them now (--resend), as the console does."""
    if (resend or order) and queue is None:
        raise ToolError("name the reply queue: statuses QUEUE --resend [--order ORDER_ID]")
    order_id = _order_id(order) if order is not None else None
    parked = _on_views(lambda deps: views.parked_statuses(deps, queue, order_id), store=True)
    render.print_parked(console, parked)
    if not resend or not parked["entries"]:
        return
    assert queue is not None
    who = _operator(operator)
    title, explanation = views.STATUS_ACTIONS["resend"]
    console.print(Text(explanation))
    count = len(parked["entries"][: views.PAGE_SIZE])
    why = _asked(reason, f"{title} {count} to {queue} as {visible(who)}?", yes)
    if why is None:
        return
    said = _on_views(
        lambda deps: views.resend_statuses(deps, queue, order_id, who, why), store=True
    )
    refused = "; the queue refused the next, which stays parked" if said["refused"] else ""
    console.print(Text(f"{said['sent']} resent to {queue} by {visible(who)}{refused}"))


@app.command()
def trace(
    order_id: str,
    path: Path | None = typer.Option(
        None,
        "--file",
        envvar="OTEL_TRACES_FILE",
        help="the OTLP/JSON-lines spans file (default: $OTEL_TRACES_FILE, as the app writes it)",
    ),
) -> None:
    """One order's spans as a tree per trace (one trace per attempt), with durations."""
    from cli import trace as traces

    order_id = _order_id(order_id)
    if path is None:
        raise ToolError(
            "no spans file: pass --file or set OTEL_TRACES_FILE (the app must run with it set)"
        )
    found = traces.load(path, order_id)
    if not found:
        raise ToolError(
            f"no spans of order {order_id} in {path} (spans are written about a second after they end)"
        )
    traces.print_traces(console, order_id, found)


def main() -> int:
    """Known failures (bad settings, unreachable servers, domain refusals) end
    with one line, not a traceback."""
    from azure.core.exceptions import ServiceRequestError

    from adapters.settings import SettingsError
    from cli.config import connection_hint
    from domain.errors import DomainError

    try:
        app()
    except MessagingEntityNotFoundError as exc:
        return _error(f"no such queue: {str(exc).splitlines()[0]}")
    except (SettingsError, DomainError, sm.IllegalTransition, ToolError) as exc:
        return _error(str(exc))
    except FileNotFoundError as exc:
        return _error(f"no such file: {exc.filename}")
    except json.JSONDecodeError as exc:
        return _error(f"not valid JSON: {exc}")
    except ServiceBusError as exc:
        return _error(
            f"Service Bus: {exc}".splitlines()[0] + connection_hint("ServiceBusConnection")
        )
    except ServiceRequestError as exc:  # the Cosmos endpoint does not answer
        return _error(f"Cosmos DB: {exc}".splitlines()[0] + connection_hint("CosmosDbConnection"))
    except OSError as exc:
        return _error(f"{type(exc).__name__}: {exc}")
    return 0


def _error(text: str) -> int:
    console.print(Text.assemble(("error: ", "red"), render.literal(text, 500)))
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
