"""Identity and fencing, each built by one named function.

- order key            `{app}:{OrderID}`      the id and partition key of the
  order's state record and orders-DB document; it names the application
  (`app_tag`): an OrderID is unique per application only (docs/adr/017f-order-keys.md).
  A bare OrderID passes for a key too (tests and tools); Submit never writes one.
- attempt instance id  `{order key}:{Attempt}` owns the record for one attempt
  (LockedBy) and names that attempt's orchestration instance.
- idempotency key      `{order key}/{step}`   stable across attempts: the remote
  service applies one side effect per key.
- fencing token        the Attempt number: remote services reject a token lower
  than one they have already seen.
- request message id   `{instance id}/{step}` stable across re-sends of one
  request, so Service Bus duplicate detection drops repeats.
- reply event name     unique per step and attempt (SDK issue #507: two buffered
  events with one name lose the first).
- reply message id     `{instance id}/{reply event}/reply`.
- status message id    `{OrderID}/status/{status}[/...]`: the client's own
  OrderID, since its reply queue is its own (the key never reaches a client)."""

from __future__ import annotations

import hashlib
import re

from domain.boundary import ORDER_ID_PATTERN, check_order_id

STEP_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
_STEP = re.compile(STEP_NAME_PATTERN)

# Bounded so that a key (at most 81 characters) leaves room for the attempt and
# the step in a Durable instance id (100), an idempotency key (120) and a
# request message id (128).
MAX_APP_TAG = 16
_APP_TAG = r"(?:[a-z0-9][a-z0-9-]{0,15}|[a-z0-9][a-z0-9-]{6}~[0-9a-f]{8})"
ORDER_KEY_PATTERN = rf"^(?:{_APP_TAG}:)?{ORDER_ID_PATTERN.pattern}$"
ORDER_KEY_MAX_LENGTH = MAX_APP_TAG + 1 + 64
_ORDER_KEY = re.compile(ORDER_KEY_PATTERN)
APP_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
_APP_ID = re.compile(APP_ID_PATTERN)
MAX_MESSAGE_ID = 128  # Service Bus's limit


def bounded_id(
    full: str, prefix: str, source: str | None = None, limit: int = MAX_MESSAGE_ID, digits: int = 64
) -> str:
    """`full`, or when it is longer than `limit` one stable id in its place:
    `prefix` and `digits` hex digits of the SHA-256 of `source` (`full` unless given)."""
    if len(full) <= limit:
        return full
    text = full if source is None else source
    return prefix + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:digits]


# The smoke application (deploy/smoke.py): its orders travel the whole path but
# the agents answer from a built-in no-op (agents.smoke), so a smoke order
# reserves, charges and ships nothing. Only its ingress queue gives this AppId.
SMOKE_APP_ID = "smoke"


def app_tag(app_id: str) -> str:
    """The application's part of its order keys: the AppId itself up to
    MAX_APP_TAG characters, else its first 7 characters, '~' ('~' is not in
    the AppId alphabet) and 8 hex digits of its SHA-256 (adapters.settings
    refuses a registry where two tags meet)."""
    if not _APP_ID.fullmatch(app_id):
        raise ValueError(f"AppId {app_id!r} must be 1-64 lowercase letters, digits or '-'")
    if len(app_id) <= MAX_APP_TAG:
        return app_id
    return f"{app_id[:7]}~{hashlib.sha256(app_id.encode()).hexdigest()[:8]}"


def order_key(app_id: str, order_id: str) -> str:
    """The key of `app_id`'s order `order_id` (see the module docstring)."""
    return f"{app_tag(app_id)}:{check_order_id(order_id)}"


def app_of_key(key: str) -> str | None:
    """The AppId an order key names in full: its tag when the tag is the AppId
    itself (app_tag: up to MAX_APP_TAG characters); None for a shortened tag
    or a bare OrderID."""
    tag, sep, _ = key.partition(":")
    return tag if sep and "~" not in tag else None


def is_smoke_order(key: str, app_id: str | None = None) -> bool:
    """Whether an order (its key, and its AppId when known) is the smoke
    application's; the key alone answers, since no two applications share a tag."""
    if app_id == SMOKE_APP_ID:
        return True
    tag, sep, _ = key.partition(":")
    return bool(sep) and tag == app_tag(SMOKE_APP_ID)


def check_order_key(key: str) -> str:
    """An order key: `{app}:{OrderID}` (or a bare OrderID, see the module docstring)."""
    if not isinstance(key, str) or not _ORDER_KEY.fullmatch(key):
        raise ValueError(
            f"order key {key!r} must be '<app>:<OrderID>' (OrderID: 1-64 letters, digits, "
            "'.', '_' or '-', starting with a letter or digit)"
        )
    return key


def client_order_id(key: str) -> str:
    """The client's own OrderID of an order key (what its status messages carry)."""
    return check_order_key(key).rpartition(":")[2]


def _check_step(step: str) -> str:
    if not _STEP.match(step):
        raise ValueError(f"step name {step!r} must be lowercase letters, digits and '-'")
    return step


def attempt_instance_id(key: str, attempt: int) -> str:
    if attempt < 1:
        raise ValueError("attempts are numbered from 1")
    return f"{check_order_key(key)}:{attempt}"


def parse_attempt_instance_id(instance_id: str) -> tuple[str, int]:
    """Inverse of attempt_instance_id: (order key, attempt); ValueError on
    anything else."""
    key, sep, attempt = instance_id.rpartition(":")
    if not sep or not attempt.isdigit():
        raise ValueError(f"{instance_id!r} is not an attempt instance id")
    return check_order_key(key), int(attempt)


def idempotency_key(key: str, step: str) -> str:
    return f"{check_order_key(key)}/{_check_step(step)}"


def fencing_token(attempt: int) -> int:
    if attempt < 1:
        raise ValueError("attempts are numbered from 1")
    return attempt


def agent_request_message_id(instance_id: str, step: str, action: str = "do") -> str:
    """`action` separates a step's request from its compensation's request."""
    parse_attempt_instance_id(instance_id)
    suffix = "" if action == "do" else f"/{action}"
    # Only a long application tag, a long OrderID and a long step together
    # are hashed; hashed, it stays one stable id per request.
    return bounded_id(f"{instance_id}/{_check_step(step)}{suffix}", "request-", digits=48)


def agent_reply_message_id(instance_id: str, reply_event: str) -> str:
    """The reply to one request, keyed by the reply event (unique per step,
    attempt and undo try). Hashed when long, to stay within the contract."""
    return bounded_id(f"{instance_id}/{reply_event}/reply", "reply-", limit=100, digits=48)


def reply_event_name(step: str, attempt: int, action: str = "do") -> str:
    suffix = "" if action == "do" else f"-{action}"
    return f"reply-{_check_step(step)}{suffix}-{attempt}"


def status_message_id(key: str, status: str, qualifier: str = "") -> str:
    """Stable per (order, status[, qualifier]), named by the client's OrderID
    (the reply queue is the application's own)."""
    tail = f"/{qualifier}" if qualifier else ""
    return f"{client_order_id(key)}/status/{status}{tail}"


def outbox_alert_message_id(key: str, status_id: str) -> str:
    """The alert that rides with a terminal status in the outbox, one per
    (order, status id): named by the order key, since the alerts queue is
    shared by every application and a status id names only the OrderID."""
    _, sep, rest = status_id.partition("/status/")
    source = f"{key}/status/{rest}" if sep else status_id
    return bounded_id(f"alert/{source}", "alert/", source)
