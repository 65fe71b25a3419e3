"""The reply bridge: an AgentReply on `agent-responses` becomes an external
event on the orchestration instance it names.

Duplicate and late replies change nothing: a duplicate raises an event name the
instance has already consumed (each step and attempt has its own name), and a
reply to an instance that has finished, or to an old attempt, finds no waiter
(the host answers 404/410 and we complete the message). Stale attempts cannot
write to the record anyway (LockedBy)."""

from __future__ import annotations

import logging

from adapters.clock import utc_now
from adapters.crashpoints import crash_point
from adapters.settlement import Settle
from domain.codec import decode
from domain.errors import ValidationFailed
from domain.models import AgentReply
from reporting import Alerts

log = logging.getLogger(__name__)

_GONE = ("is gone", "No instance with ID")


async def bridge_reply(body: bytes, client, alerts: Alerts | None = None) -> Settle:
    try:
        reply = decode(AgentReply, body)
    except ValidationFailed as exc:
        if alerts is not None:
            await alerts.raise_alert("InvalidMessage", exc.reason, utc_now())
        return Settle.deadletter("InvalidMessage", exc.reason)
    try:
        await client.raise_event(reply.InstanceId, reply.EventName, reply.model_dump(mode="json"))
    except Exception as exc:  # the durable client raises bare Exception with a message
        if any(marker in str(exc) for marker in _GONE):
            log.info(
                "late reply for %s (%s) ignored: %s", reply.InstanceId, reply.EventName, exc,
                extra={"order_id": reply.OrderID},
            )
            return Settle.complete(reply.OrderID)
        log.warning("raising %s on %s failed: %s", reply.EventName, reply.InstanceId, exc)
        return Settle.abandon(str(exc), reply.OrderID)
    crash_point("bridge.after_raise")
    log.info(
        "reply %s raised on %s (%s)", reply.EventName, reply.InstanceId, reply.Outcome.value,
        extra={"order_id": reply.OrderID},
    )
    return Settle.complete(reply.OrderID)
