"""Identity and fencing, each built by one named function.

- attempt instance id  `{OrderID}:{Attempt}`  owns the record for one attempt
  (LockedBy) and names that attempt's orchestration instance.
- idempotency key      `{OrderID}/{step}`     stable across attempts: the remote
  service applies one side effect per key.
- fencing token        the Attempt number: remote services reject a token lower
  than one they have already seen.
- request message id   `{instance id}/{step}` stable across re-sends of one
  request, so Service Bus duplicate detection drops repeats.
- reply event name     unique per step and attempt (SDK issue #507: two buffered
  events with one name lose the first).
- reply message id     `{instance id}/{reply event}/reply`."""

from __future__ import annotations

import hashlib
import re

_ORDER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_STEP = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


def check_order_id(order_id: str) -> str:
    """Order ids become parts of instance ids, keys and message ids: keep them
    to a safe alphabet (no ':' or '/', which those use as separators)."""
    if not _ORDER_ID.fullmatch(order_id):
        raise ValueError(
            f"OrderID {order_id!r} must be 1-64 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return order_id


def _check_step(step: str) -> str:
    if not _STEP.match(step):
        raise ValueError(f"step name {step!r} must be lowercase letters, digits and '-'")
    return step


def attempt_instance_id(order_id: str, attempt: int) -> str:
    if attempt < 1:
        raise ValueError("attempts are numbered from 1")
    return f"{check_order_id(order_id)}:{attempt}"


def parse_attempt_instance_id(instance_id: str) -> tuple[str, int]:
    """Inverse of attempt_instance_id; ValueError on anything else."""
    order_id, sep, attempt = instance_id.rpartition(":")
    if not sep or not attempt.isdigit():
        raise ValueError(f"{instance_id!r} is not an attempt instance id")
    return check_order_id(order_id), int(attempt)


def idempotency_key(order_id: str, step: str) -> str:
    return f"{check_order_id(order_id)}/{_check_step(step)}"


def fencing_token(attempt: int) -> int:
    if attempt < 1:
        raise ValueError("attempts are numbered from 1")
    return attempt


def agent_request_message_id(instance_id: str, step: str, action: str = "do") -> str:
    """`action` separates a step's request from its compensation's request."""
    parse_attempt_instance_id(instance_id)
    suffix = "" if action == "do" else f"/{action}"
    return f"{instance_id}/{_check_step(step)}{suffix}"


def agent_reply_message_id(instance_id: str, reply_event: str) -> str:
    """The reply to one request: keyed by the reply event, which is unique per
    step, attempt and undo try, so a second undo try's reply is not taken for
    a re-send of the first. Hashed when long, to stay within the contract."""
    reply_id = f"{instance_id}/{reply_event}/reply"
    if len(reply_id) > 100:
        reply_id = "reply-" + hashlib.sha256(reply_id.encode()).hexdigest()[:48]
    return reply_id


def reply_event_name(step: str, attempt: int, action: str = "do") -> str:
    suffix = "" if action == "do" else f"-{action}"
    return f"reply-{_check_step(step)}{suffix}-{attempt}"


def status_message_id(order_id: str, status: str, qualifier: str = "") -> str:
    """Stable id per (order, status[, step/attempt]) so a status re-sent after a
    crash is dropped by the reply queue's duplicate detection."""
    tail = f"/{qualifier}" if qualifier else ""
    return f"{check_order_id(order_id)}/status/{status}{tail}"
