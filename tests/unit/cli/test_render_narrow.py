"""At 80 columns the operator tools wrap, never cut: a dead letter's
description, an alert's reason, a record's times and last error."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from rich.console import Console

from cli import render
from tests.unit.cli.test_render import Msg, shown

LONG = (
    "the message could not be processed after 10 deliveries: Cosmos DB answered 503 "
    "ServiceUnavailable for the state record read, retried with backoff and gave up at "
    "2026-01-01T12:00:00.123456+00:00; nothing was changed"
)


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=80), out


def _squeezed(text: str) -> str:
    return "".join(text.split())


def test_a_dead_letter_description_is_whole_at_80_columns():
    console, out = _console()
    render.print_dead_letters(
        console, "orders-webshop", shown(Msg([b"{}"], reason="ProcessingFailed", description=LONG))
    )
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert _squeezed(LONG) in _squeezed(text)
    assert "…" not in text


def test_an_alert_reason_is_whole_at_80_columns():
    console, out = _console()
    body = (
        '{"Kind": "RetriesExhausted", "OrderID": "O-1", "Timestamp": '
        f'"2026-01-01T12:00:00.123456+00:00", "Reason": "{LONG}"}}'
    ).encode()
    render.print_alerts(console, shown(Msg([body])))
    text = out.getvalue()
    assert _squeezed(LONG) in _squeezed(text)
    assert "2026-01-01T12:00:00.123456+00:00" in text


def test_state_counts_name_every_state():
    console, out = _console()
    render.print_counts(console, "{total} orders by state", {"Pending": 2, "Error": 1})
    text = out.getvalue()
    assert "3 orders by state" in text
    assert "Pending  2" in text


def test_records_table_folds_instead_of_cutting_on_a_wide_terminal():
    class R:
        id, Attempt, FailureCount, LockedBy, LastError = "O-1", 2, 1, None, LONG
        CompleteBy = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)

    out = io.StringIO()
    Console(file=out, width=150).print(render.records_table("1 Error orders", [R()]))
    text = out.getvalue()
    assert _squeezed(LONG) in _squeezed(text.replace("│", ""))
    assert _squeezed(R.CompleteBy.isoformat()) in _squeezed(text.replace("│", ""))
