"""The operator tools print client text literally and never crash on what a
client sent: hostile text in every field they print, every AMQP body kind."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus.amqp import AmqpMessageBodyType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from cli import render
from console.views import message_view
from domain.models import HistoryEntry, OrderState, ProcessState
from tests.property.strategies import hostile_text

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Msg:
    """What the tools read off a peeked message."""

    def __init__(
        self,
        body,
        kind=AmqpMessageBodyType.DATA,
        message_id="m-1",
        reason=None,
        description=None,
        enqueued=T0,
        sequence_number=1,
    ):
        self._body, self.body_type = body, kind
        self.message_id, self.dead_letter_reason = message_id, reason
        self.dead_letter_error_description = description
        self.enqueued_time_utc, self.sequence_number = enqueued, sequence_number
        self.application_properties, self.delivery_count = None, 1

    @property
    def body(self):
        # The SDK hands a fresh generator per access for data and sequence bodies.
        if self.body_type is AmqpMessageBodyType.VALUE:
            return self._body
        return iter(self._body)


def shown(*messages: Msg) -> list[dict]:
    """The messages as the tools print them: as the console shows them."""
    return [message_view(m, 4096) for m in messages]


def console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, color_system="truecolor", force_terminal=True), out


def plain(out: io.StringIO) -> str:
    text = out.getvalue()
    # No escape sequence a client wrote survives: only rich's own SGR codes.
    return text


def alert(**fields) -> dict:
    data = {
        "Kind": "InvalidMessage",
        "OrderID": "ORD-1",
        "Reason": "r",
        "Timestamp": "2026-01-01T00:00:00Z",
        "MessageId": "m-1",
        "Queue": "orders",
        **fields,
    }
    return shown(Msg([json.dumps(data).encode()]))[0]


MARKUP = "[link=http://evil.example]click[/link] [/] [bold red]x"


@pytest.mark.parametrize("field", ["Kind", "OrderID", "Reason", "Timestamp", "MessageId", "Queue"])
def test_markup_in_any_alert_field_is_printed_literally(field):
    c, out = console()
    render.print_alerts(c, [alert(**{field: MARKUP})])
    text = out.getvalue()
    assert "1 of 1 alerts" in text
    assert "[link=http://evil.example]click[/link]" in text
    assert "\x1b]8;" not in text  # no terminal hyperlink was made


def test_control_and_bidi_characters_are_shown_as_escapes_not_sent_to_the_terminal():
    c, out = console()
    render.print_alerts(c, [alert(OrderID="A\x1b[2J\u202eB", Reason="line1\nline2\u200b")])
    text = out.getvalue()
    assert "\x1b[2J" not in text
    assert "\u202e" not in text
    assert "\u200b" not in text
    assert "A\\x1b[2J\\u202eB" in text
    assert "line1\\x0aline2\\u200b" in text


@pytest.mark.parametrize(
    "message",
    [
        Msg({b"Kind": b"x"}, AmqpMessageBodyType.VALUE),
        Msg(None, AmqpMessageBodyType.VALUE),
        Msg(5, AmqpMessageBodyType.VALUE),
        Msg([[1, b"x"]], AmqpMessageBodyType.SEQUENCE),
        Msg([b"\xff\xfe not utf-8"]),
        Msg([b"[1, 2]"]),
        Msg([b'{"Kind": 5, "Reason": null, "OrderID": ["x"]}']),
        Msg([b""], message_id=None),
    ],
)
def test_no_alert_body_crashes_the_alerts_command(message):
    c, out = console()
    render.print_alerts(c, shown(message))
    assert "1 of 1 alerts" in out.getvalue()


def test_zero_alerts_and_no_dead_letters_are_said():
    c, out = console()
    render.print_alerts(c, [])
    render.print_dead_letters(c, "orders", [])
    assert "0 alerts" in out.getvalue()
    assert "no dead letters on orders" in out.getvalue()


def test_alerts_are_newest_first_unless_asked():
    old, new = alert(Reason="old"), alert(Reason="new")
    old["enqueued"], new["enqueued"] = T0, T0 + timedelta(minutes=1)
    c, out = console()
    render.print_alerts(c, [old, new], limit=1)
    assert "new" in out.getvalue()
    assert "old" not in out.getvalue().replace("oldest", "")
    c, out = console()
    render.print_alerts(c, [new, old], newest_first=False, limit=1)
    assert "  old" in out.getvalue()


@pytest.mark.parametrize(
    "message",
    [
        Msg([MARKUP.encode()], message_id=MARKUP, reason=MARKUP, description=MARKUP),
        Msg({b"a": 1}, AmqpMessageBodyType.VALUE, reason="InvalidMessage"),
        Msg([[b"{"]], AmqpMessageBodyType.SEQUENCE, message_id=None, reason=None, description=None),
        Msg([b"\x1b]8;;http://evil\x1b\\x\x1b]8;;\x1b\\"], reason="\u202eevil"),
    ],
)
def test_dead_letters_print_every_field_literally(message):
    c, out = console()
    render.print_dead_letters(c, "orders", shown(message))
    text = out.getvalue()
    assert "1 dead letters on orders" in text
    assert "\x1b]8;" not in text
    assert "\u202e" not in text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(["Kind", "OrderID", "Reason", "Timestamp", "MessageId", "Queue"]),
        hostile_text,
    ),
    hostile_text,
    hostile_text,
    hostile_text,
)
def test_any_text_in_any_field_prints_without_error_or_raw_controls(
    fields, mid, reason, description
):
    c, out = console()
    render.print_alerts(c, [alert(**fields)])
    message = Msg(
        [json.dumps(fields).encode()], message_id=mid, reason=reason, description=description
    )
    render.print_dead_letters(c, "orders", shown(message))
    raw = Msg([mid.encode("utf-8", "surrogatepass")], message_id=None)
    render.print_dead_letters(c, "orders", shown(raw))
    written = out.getvalue()
    for ch in "\x00\x1b\u202e\u200b\u2028":
        # rich writes ESC for its own colours only: strip those, nothing else may remain
        if ch == "\x1b":
            import re

            written = re.sub(r"\x1b\[[0-9;]*m", "", written)
        assert ch not in written


def test_the_watch_table_and_record_tables_escape_client_text():
    latest = {"A\u202eB": "[bold]Processed", MARKUP: "Received\n"}
    c, out = console()
    c.print(render.status_table("replies-[x]", latest))
    record = OrderState.model_construct(
        id="ORD-1\u202e",
        ProcessState=ProcessState.ERROR,
        LockedBy=MARKUP,
        Attempt=1,
        FailureCount=2,
        CompleteBy=None,
        LastError="boom\x1b[2J",
        AppId="webshop",
        ReplyTo="replies-webshop",
        History=[
            HistoryEntry.model_construct(
                At=T0, From=None, To=ProcessState.ERROR, By=MARKUP, Reason="\u202eevil"
            )
        ],
    )
    c.print(render.records_table("1 Error orders", [record]))
    text = out.getvalue()
    assert "\u202e" not in text
    assert "\x1b[2J" not in text
    assert "\x1b]8;" not in text
    assert "[bold]Processed" in text
    assert "A\\u202eB" in text


def test_status_reading_skips_what_is_not_a_status():
    (status, no_id, value) = shown(
        Msg([b'{"OrderID": "A", "Status": "Received"}']),
        Msg([b'{"OrderID": 1}']),
        Msg({b"x": 1}, AmqpMessageBodyType.VALUE),
    )
    assert render.read_status(status) == ("A", "Received")
    assert render.read_status(no_id) is None
    assert render.read_status(value) is None


def test_an_aggregate_alert_shows_its_count_and_its_last_alert():
    out = io.StringIO()
    c = Console(file=out, width=200, color_system=None)
    last = {"Reason": "r", "Timestamp": "2026-01-01T00:00:59Z", "MessageId": "m-9"}
    render.print_alerts(c, [alert(Kind="ForgedRequest", Count=999, Last=last), alert()])
    lines = out.getvalue().splitlines()
    forged = next(line for line in lines if line.startswith("ForgedRequest"))
    assert "x999 last 2026-01-01T00:00:59Z" in forged
    single = next(line for line in lines if line.startswith("InvalidMessage"))
    assert " x" not in single.split(" order ")[0]
