"""The client boundary: what any text or JSON from outside must satisfy before
the rest of the code sees it (exact JSON, the text policy `check_text`, the
OrderID grammar), and `clean_text` for text our own code makes from outside
text. The rules and why: docs/adr/013-message-contracts.md."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

MAX_DEPTH = 32

# Contexts passed to pydantic: WIRE means "this came from outside: check, never clean".
WIRE = {"wire": True}

# Refused in any text field: controls, format characters (bidi overrides,
# zero-width, BOM), lone surrogates, line and paragraph separators.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

ORDER_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ORDER_ID_RULE = (
    "1-64 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"
)


class BoundaryError(ValueError):
    """The input breaks the boundary's rules; the message says which and where."""


def check_text(value: str) -> str:
    """Raises ValueError (which pydantic reports with the field's path) unless
    `value` satisfies the text policy."""
    if not value:
        raise ValueError("must not be empty")
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            name = unicodedata.name(ch, "") or f"a {unicodedata.category(ch)} character"
            raise ValueError(f"character U+{ord(ch):04X} ({name}) at position {i} is not allowed")
    if value != value.strip():
        raise ValueError("must not start or end with whitespace")
    return value


def clean_text(value: str, max_length: int, empty: str = "(empty)") -> str:
    """Make produced text satisfy the policy: refused characters become
    U+FFFD (so a reader sees that something was there), surrounding whitespace
    goes, and the result fits `max_length`."""
    out = "".join(
        "\ufffd" if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES else ch for ch in value
    )
    out = out.strip()
    if len(out) > max_length:
        out = out[: max_length - 1].rstrip() + "…"
    return out or empty


def check_order_id(order_id: str) -> str:
    """Order ids become Cosmos ids, parts of Durable instance ids, idempotency
    keys and Service Bus message ids: a safe alphabet (no ':' or '/', which
    those use as separators), matched in full."""
    if not isinstance(order_id, str) or not ORDER_ID_PATTERN.fullmatch(order_id):
        raise ValueError(f"OrderID {order_id!r} must be {ORDER_ID_RULE}")
    return order_id


def readable_order_id(data: Any) -> str | None:
    """The OrderID of a (possibly invalid) message when one can be read and is
    well formed, so an alert about it can name the order; never the raw text."""
    if isinstance(data, bytes | bytearray | str):
        try:
            data = json.loads(data)
        except (ValueError, RecursionError):
            return None
    if isinstance(data, dict):
        value = data.get("OrderID")
        if isinstance(value, str) and ORDER_ID_PATTERN.fullmatch(value):
            return value
    return None


# --- exact JSON ------------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BoundaryError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise BoundaryError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BoundaryError(f"number {text[:40]} is out of range")
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=_finite
)


def exact_json(raw: bytes, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `raw` as exactly one JSON value under the boundary's rules, or
    raise BoundaryError naming the first rule broken."""
    if len(raw) > max_bytes:
        raise BoundaryError(f"body is {len(raw)} bytes; the limit is {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BoundaryError(f"body is not UTF-8 (byte {exc.start})") from None
    if text.startswith("\ufeff"):
        raise BoundaryError("body starts with a byte order mark")
    # Refuse deep nesting before parsing: the parser recurses per level.
    if json_depth(text, max_depth) > max_depth:
        raise BoundaryError(f"JSON is nested more than {max_depth} levels deep")
    try:
        value = _DECODER.decode(text)  # json.loads, less a decoder built per call
    except BoundaryError:
        raise
    except json.JSONDecodeError as exc:
        raise BoundaryError(
            f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise BoundaryError(f"JSON is nested more than {max_depth} levels deep") from None
    _no_lone_surrogates(value, "")
    return value


def _no_lone_surrogates(value: Any, where: str) -> None:
    r"""A "\ud800" escape decodes to a character no UTF-8 text can hold."""
    if isinstance(value, str):
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            raise BoundaryError(f"{where or '(body)'}: string holds a lone surrogate escape")
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            _no_lone_surrogates(key, path)
            _no_lone_surrogates(item, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _no_lone_surrogates(item, f"{where}.{i}" if where else str(i))


def json_depth(text: str, limit: int) -> int:
    """How deep JSON brackets nest in `text` (strings skipped), counting only
    up to `limit` + 1: linear and without recursion, so safe before parsing."""
    depth = top = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > top:
                top = depth
                if top > limit:
                    return top
        elif ch in "]}":
            depth -= 1
    return top
