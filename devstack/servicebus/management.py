"""The `<entity>/$management` request/response operations the SDK uses.

Each request is an AMQP message whose application property `operation` names
the operation and whose AmqpValue body is a map of arguments; the reply
carries `statusCode`/`statusDescription` (camelCase, unlike CBS) and, on
failure, `errorCondition`, which the SDK maps to its exception types.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .codec import AMQPTypes, parse_message, typed
from .entities import BrokerError, Queue, Topic

if TYPE_CHECKING:
    from .protocol import Connection

_LOG = logging.getLogger("devstack.servicebus")

#: disposition-status values of update-disposition ("defered" is the SDK's spelling).
_DISPOSITIONS = {
    b"completed": "complete",
    b"abandoned": "abandon",
    b"suspended": "dead-letter",
    b"defered": "defer",
    b"deferred": "defer",
}


@dataclass
class Response:
    """A management reply: status application properties and an optional body."""

    status: dict[str, Any]
    value: Any = None


def _ok(value: Any = None) -> Response:
    return Response({"statusCode": 200, "statusDescription": "OK"}, value)


def _fail(code: int, condition: bytes, description: str) -> Response:
    return Response(
        {
            "statusCode": code,
            "statusDescription": description,
            "errorCondition": typed(AMQPTypes.symbol, condition),
        }
    )


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


# Every handler takes (conn, queue, body), the shape `_OPERATIONS` dispatches on;
# an underscore marks an argument a handler has no use for.


def renew_lock(conn: Connection, _queue: Queue, body: dict) -> Response:
    expirations = [conn.broker.renew(token) for token in body.get(b"lock-tokens") or []]
    return _ok(
        {
            "expirations": typed(
                AMQPTypes.array, [typed(AMQPTypes.timestamp, ms) for ms in expirations]
            )
        }
    )


def peek_message(_conn: Connection, queue: Queue, body: dict) -> Response:
    start = int(body.get(b"from-sequence-number") or 0)
    count = int(body.get(b"message-count") or 1)
    found = queue.peek(start, count, _text(body.get(b"session-id")))
    if not found:
        return Response({"statusCode": 204, "statusDescription": "No messages to peek"})
    return _ok(
        {"messages": [{"message": typed(AMQPTypes.binary, queue.encode(m, m.lock))} for m in found]}
    )


def schedule_message(conn: Connection, queue: Queue, body: dict) -> Response:
    now_ms = conn.broker.clock()
    numbers = []
    for entry in body.get(b"messages") or []:
        parsed = parse_message(entry[b"message"])
        scheduled = parsed.annotations.get(b"x-opt-scheduled-enqueue-time")
        number = queue.accept(
            parsed, now_ms, scheduled_ms=scheduled if isinstance(scheduled, int) else now_ms
        )
        # A duplicate is dropped, as on send; the service still answers with a number.
        numbers.append(number if number is not None else 0)
    queue.pump()
    return _ok(
        {"sequence-numbers": typed(AMQPTypes.array, [typed(AMQPTypes.long, n) for n in numbers])}
    )


def cancel_scheduled_message(_conn: Connection, queue: Queue, body: dict) -> Response:
    queue.cancel_scheduled(int(n) for n in body.get(b"sequence-numbers") or [])
    return _ok()


def receive_by_sequence_number(_conn: Connection, queue: Queue, body: dict) -> Response:
    numbers = [int(n) for n in body.get(b"sequence-numbers") or []]
    # The SDK sends its link settle mode: 1 (second) for PEEK_LOCK, 0 (first) for RECEIVE_AND_DELETE.
    peek_lock = int(body.get(b"receiver-settle-mode") or 0) == 1
    taken = queue.take_deferred(numbers, peek_lock, _text(body.get(b"session-id")))
    messages = []
    for _, payload, lock in taken:
        entry: dict[str, Any] = {"message": typed(AMQPTypes.binary, payload)}
        if lock is not None:
            entry["lock-token"] = typed(AMQPTypes.uuid, lock.token)
        messages.append(entry)
    return _ok({"messages": messages})


def update_disposition(conn: Connection, _queue: Queue, body: dict) -> Response:
    outcome = _DISPOSITIONS.get(body.get(b"disposition-status") or b"")
    if outcome is None:
        return _fail(400, b"com.microsoft:argument-error", "unknown disposition-status")
    for token in body.get(b"lock-tokens") or []:
        conn.broker.settle(
            token,
            outcome,
            _text(body.get(b"deadletter-reason")),
            _text(body.get(b"deadletter-description")),
        )
    return _ok()


def renew_session_lock(conn: Connection, queue: Queue, body: dict) -> Response:
    expiration = conn.broker.renew_session(queue, _text(body.get(b"session-id")))
    return _ok({"expiration": typed(AMQPTypes.timestamp, expiration)})


def get_session_state(_conn: Connection, queue: Queue, body: dict) -> Response:
    session = queue.held_session(_text(body.get(b"session-id")))
    state = session.state
    return _ok(
        {
            "session-state": typed(AMQPTypes.binary, state)
            if state is not None
            else typed(AMQPTypes.null, None)
        }
    )


def set_session_state(_conn: Connection, queue: Queue, body: dict) -> Response:
    state = body.get(b"session-state")
    queue.set_session_state(
        _text(body.get(b"session-id")), bytes(state) if state is not None else None
    )
    return _ok()


#: The SDK's `last-updated-time` for "no filter" (.NET's DateTime.MaxValue, in ms).
_NO_STATE_FILTER_MS = 253402300800000


def get_message_sessions(_conn: Connection, queue: Queue, body: dict) -> Response:
    """ServiceBusClient.list_queue_sessions / list_subscription_sessions (azure-servicebus
    7.15): a page of `top` session ids after `skip`, and the skip of the next page;
    204 (com.microsoft:session-not-found) when the page is empty, as the service answers."""
    if not queue.sessionful:
        return _fail(
            400,
            b"amqp:not-allowed",
            f"entity {queue.path!r} is not session-enabled: it has no sessions to list",
        )
    after = body.get(b"last-updated-time")
    after_ms = _timestamp_ms(after)
    skip = max(int(body.get(b"skip") or 0), 0)
    top = int(body.get(b"top") or 0) or 100
    ids = queue.session_ids(
        None if after_ms is None or after_ms >= _NO_STATE_FILTER_MS else after_ms
    )
    page = ids[skip : skip + top]
    if not page:
        return Response(
            {
                "statusCode": 204,
                "statusDescription": "No sessions",
                "errorCondition": typed(AMQPTypes.symbol, b"com.microsoft:session-not-found"),
            }
        )
    return _ok(
        {
            "skip": typed(AMQPTypes.int, skip + len(page)),
            "sessions-ids": typed(AMQPTypes.array, [typed(AMQPTypes.string, sid) for sid in page]),
        }
    )


def _timestamp_ms(value: Any) -> int | None:
    """An AMQP timestamp as the codec decodes it (milliseconds, or a datetime), or None."""
    if value is None:
        return None
    if isinstance(value, int):
        return value
    timestamp = getattr(value, "timestamp", None)
    return int(timestamp() * 1000) if callable(timestamp) else int(value)


_OPERATIONS: dict[bytes, Callable[[Connection, Queue, dict], Response]] = {
    b"com.microsoft:renew-lock": renew_lock,
    b"com.microsoft:peek-message": peek_message,
    b"com.microsoft:schedule-message": schedule_message,
    b"com.microsoft:cancel-scheduled-message": cancel_scheduled_message,
    b"com.microsoft:receive-by-sequence-number": receive_by_sequence_number,
    b"com.microsoft:update-disposition": update_disposition,
    b"com.microsoft:renew-session-lock": renew_session_lock,
    b"com.microsoft:get-session-state": get_session_state,
    b"com.microsoft:set-session-state": set_session_state,
    b"com.microsoft:get-message-sessions": get_message_sessions,
}


#: What a topic's $management link offers (a topic sender schedules and cancels).
_TOPIC_OPERATIONS = {
    b"com.microsoft:schedule-message",
    b"com.microsoft:cancel-scheduled-message",
}


def handle(conn: Connection, queue: Queue, request: Any) -> Response:
    """Run one management request against `queue` and build its reply."""
    operation = (request.application_properties or {}).get(b"operation")
    handler = _OPERATIONS.get(operation)
    if handler is None:
        return _fail(
            501, b"amqp:not-implemented", f"operation {_text(operation)!r} is not supported"
        )
    body = request.value if isinstance(request.value, dict) else {}
    if isinstance(queue, Topic) and operation not in _TOPIC_OPERATIONS:
        return _fail(
            400,
            b"amqp:not-allowed",
            f"operation {_text(operation)!r} is not available on a topic; use a subscription",
        )
    try:
        return handler(conn, queue, body)
    except BrokerError as exc:
        code = (
            410
            if exc.condition.endswith(b"lock-lost")
            else 404
            if exc.condition.endswith(b"not-found")
            else 403
        )
        return _fail(code, exc.condition, exc.description)
    except Exception as exc:  # a malformed request gets an error reply, not a dead connection
        _LOG.exception("management operation %r failed", operation)
        return _fail(500, b"amqp:internal-error", str(exc))
