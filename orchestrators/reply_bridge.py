"""The reply bridge: an AgentReply on `agent-responses` becomes an external
event on the orchestration instance it names.

Duplicate and late replies change nothing: a duplicate raises an event name the
instance has already consumed, and a reply to a finished instance or an old
attempt finds no waiter (the host answers 404/410; the message is completed).

A malformed reply is dead-lettered `InvalidMessage`; a well-formed one must
prove it answers a request the Scheduler made, its token made for exactly its
identity and its signature an agent's (ADR 017e), or it is dead-lettered
`ForgedReply` before any event is raised: nothing is buffered for a step not
yet requested. A failed raise is retried after a back-off; anything unexpected
is dead-lettered `ProcessingFailed` (adapters.settlement.MessageGate, ADR 014)."""

from __future__ import annotations

import logging
from typing import Any

from adapters import telemetry
from adapters.durable_client import raise_event
from adapters.servicebus import AGENT_RESPONSES_QUEUE
from adapters.settlement import MessageGate, Settle
from domain.codec import decode
from domain.errors import InstanceGone, ValidationFailed
from domain.ids import parse_attempt_instance_id
from domain.models import AgentReply
from domain.signing import SchedulerKeys, check_scheduler_reply
from orchestrators.contracts import event_payload
from orchestrators.hooks import CrashPoint, no_crash_point

log = logging.getLogger(__name__)

FORGED_REPLY = "ForgedReply"


def _check_reply(body: bytes) -> AgentReply:
    reply = decode(AgentReply, body)
    try:
        order_id, _ = parse_attempt_instance_id(reply.InstanceId)
    except ValueError as exc:
        raise ValidationFailed(f"AgentReply: InstanceId: {exc}") from None
    if order_id != reply.OrderID:
        # Would raise an event on another order's instance.
        raise ValidationFailed(
            f"AgentReply: InstanceId {reply.InstanceId!r} is not an instance of order {reply.OrderID!r}"
        )
    return reply


def _forgery(keys: SchedulerKeys, reply: AgentReply) -> str | None:
    """Why `reply` does not answer a request of the Scheduler's, or None."""
    _, attempt = parse_attempt_instance_id(reply.InstanceId)
    if attempt != reply.Attempt:
        return f"Attempt {reply.Attempt} is not the attempt of instance {reply.InstanceId}"
    return check_scheduler_reply(keys, reply)


async def bridge_reply(
    body: bytes, client, keys: SchedulerKeys, crash_point: CrashPoint = no_crash_point
) -> Settle:
    """What to do with one reply (the gate around it settles and alerts);
    `keys` check it answers a real request."""
    try:
        reply = _check_reply(body)
    except ValidationFailed as exc:
        return Settle.dead_letter("InvalidMessage", exc.reason)
    forged = _forgery(keys, reply)
    if forged is not None:
        # INFO: the ForgedReply alert (aggregated per window) is the operators' line.
        log.info(
            "forged reply %s for %s refused: %s",
            reply.EventName,
            reply.InstanceId,
            forged,
            extra={"order_id": reply.OrderID},
        )
        return Settle.dead_letter(
            FORGED_REPLY,
            f"reply {reply.Outcome.value} to {reply.Action} of step {reply.Step} "
            f"(event {reply.EventName}, instance {reply.InstanceId}, application "
            f"{reply.AppId or '(none)'}) does not answer a request of the Scheduler: "
            f"{forged}; no event raised",
            reply.OrderID,
        )
    telemetry.annotate(
        **{
            telemetry.ORDER_ID: reply.OrderID,
            telemetry.INSTANCE_ID: reply.InstanceId,
            "reply.event": reply.EventName,
            "reply.outcome": reply.Outcome.value,
        }
    )
    try:
        await raise_event(client, reply.InstanceId, reply.EventName, event_payload(reply))
    except InstanceGone as exc:
        log.info(
            "late reply for %s (%s) ignored: %s",
            reply.InstanceId,
            reply.EventName,
            exc,
            extra={"order_id": reply.OrderID},
        )
        return Settle.complete(reply.OrderID)
    except Exception as exc:  # anything else the SDK raised: try again later
        log.warning("raising %s on %s failed: %s", reply.EventName, reply.InstanceId, exc)
        return Settle.retry(f"raising {reply.EventName} failed: {exc}", reply.OrderID)
    crash_point("bridge.after_raise")
    log.info(
        "reply %s raised on %s (%s)",
        reply.EventName,
        reply.InstanceId,
        reply.Outcome.value,
        extra={"order_id": reply.OrderID},
    )
    return Settle.complete(reply.OrderID)


async def on_reply_message(
    message: Any,
    actions: Any,
    client: Any,
    *,
    gate: MessageGate,
    keys: SchedulerKeys,
    crash_point: CrashPoint = no_crash_point,
) -> Settle:
    """The trigger's whole body: gate, bridge, settle, in a span that
    continues the agent's trace; its collaborators come from the root."""
    with telemetry.consume(
        "reply bridge", message, **{"messaging.destination.name": AGENT_RESPONSES_QUEUE}
    ):
        outcome = await gate.run(
            message, actions, lambda body: bridge_reply(body, client, keys, crash_point=crash_point)
        )
        telemetry.annotate(settlement=outcome.kind.value)
        return outcome
