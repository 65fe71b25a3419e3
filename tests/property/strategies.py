"""Hypothesis strategies for what a hostile or careless client sends: text
with markup, control, bidirectional and zero-width characters; JSON that
breaks the boundary's rules; contract-shaped bodies with one field spoiled;
every AMQP body kind; application properties of any type."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from tests.builders import order_payload

NASTY_CHARS = [
    "\x00",
    "\n",
    "\r",
    "\t",
    "\x1b",
    "\x7f",
    "\u202e",
    "\u202d",
    "\u2066",
    "\u200b",
    "\u200d",
    "\ufeff",
    "\u2028",
    "\u00ad",
    "\ud800",
    " ",
    "\u00a0",
    "[",
    "]",
    "[/]",
    "[link=http://evil]",
    "\\",
    '"',
    "'",
    "/",
    ":",
    "#",
    "?",
    "%",
    "é",
    "漢",
    "🙂",
]

hostile_text = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(NASTY_CHARS) | st.text(max_size=3), max_size=8).map("".join),
    st.sampled_from(
        ["", " ", "ORD-1\n", " ORD-1", "ORD-1 ", "[bold]x", "[/]", "x" * 300, "a/b", "a:b"]
    ),
)


def _json_value(depth: int = 2):
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        hostile_text,
    )
    if depth == 0:
        return scalars
    inner = _json_value(depth - 1)
    return st.one_of(
        scalars, st.lists(inner, max_size=3), st.dictionaries(hostile_text, inner, max_size=3)
    )


json_values = _json_value()


def _spoil(payload: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(payload))
    target = data
    for key in path[:-1]:
        target = target[key][0] if isinstance(target[key], list) else target[key]
    target[path[-1]] = value
    return data


ORDER_FIELDS = [
    ["OrderID"],
    ["AppId"],
    ["ReplyTo"],
    ["Currency"],
    ["PaymentReference"],
    ["Total"],
    ["SchemaVersion"],
    ["Customer", "CustomerId"],
    ["Customer", "Name"],
    ["Lines", "Sku"],
    ["Lines", "Quantity"],
    ["Lines", "UnitPrice"],
    ["Lines"],
    ["Customer"],
    ["Extra"],
]


@st.composite
def spoiled_orders(draw, order_id: str) -> bytes:
    """A valid order with one field replaced by something hostile."""
    path = draw(st.sampled_from(ORDER_FIELDS))
    value = draw(
        st.one_of(hostile_text, json_values, st.sampled_from([1.0, True, "1", 1e300, -1, 0]))
    )
    return json.dumps(_spoil(order_payload(order_id), path, value)).encode()


@st.composite
def raw_hostile_json(draw, order_id: str) -> bytes:
    """Bodies that break the JSON rules while looking like an order."""
    valid = json.dumps(order_payload(order_id))
    kind = draw(
        st.sampled_from(
            ["dup", "nan", "inf", "deep", "bom", "trailing", "utf8", "truncated", "huge", "empty"]
        )
    )
    if kind == "dup":
        key = draw(st.sampled_from(["OrderID", "AppId", "ReplyTo", "Total"]))
        other = json.dumps(draw(hostile_text))
        return ("{" + f'"{key}": {other}, ' + valid[1:]).encode()
    if kind == "nan":
        return valid.replace('"25.50"', "NaN").encode()
    if kind == "inf":
        return valid.replace(
            '"25.50"', draw(st.sampled_from(["Infinity", "-Infinity", "1e400"]))
        ).encode()
    if kind == "deep":
        n = draw(st.integers(33, 3000))
        return valid[:-1].encode() + b', "Deep": ' + b"[" * n + b"]" * n + b"}"
    if kind == "bom":
        return "\ufeff".encode() + valid.encode()
    if kind == "trailing":
        return valid.encode() + draw(st.sampled_from([b"{}", b"x", b",1"]))
    if kind == "utf8":
        return valid.encode().replace(
            b"Ada", draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"]))
        )
    if kind == "truncated":
        return valid.encode()[: draw(st.integers(0, len(valid) - 1))]
    if kind == "huge":
        return valid[:-1].encode() + b', "Pad": "' + b"x" * 70_000 + b'"}'
    return b""


def order_total(lines: list[dict[str, Any]]) -> str:
    return f"{sum(Decimal(line['UnitPrice']) * line['Quantity'] for line in lines):.2f}"


application_properties = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(
            ["x-retry-count", "x-original-message-id", "traceparent", "OrderID", "Kind"]
        ),
        st.one_of(st.integers(-5, 10**6), st.booleans(), hostile_text, st.floats(allow_nan=False)),
        max_size=3,
    ),
)
