"""The reply bridge raises a reply only when it answers a request the
Scheduler made (ADR 017e); every forgery is dead-lettered ForgedReply and
reaches no orchestration."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from adapters.settlement import SettleKind
from domain.codec import encode
from domain.models import AgentReply, AgentRequest, ReplyOutcome
from domain.signing import SchedulerKeys, new_key, parse_keys, seal_request, sign_reply
from orchestrators.reply_bridge import bridge_reply
from tests.builders import KEYS, agent_request

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class Client:
    def __init__(self) -> None:
        self.raised: list[tuple[str, str]] = []

    async def raise_event(self, instance_id: str, name: str, data=None) -> None:
        self.raised.append((instance_id, name))


def sent(step: str = "charge-payment", action: str = "do", attempt: int = 1) -> AgentRequest:
    """A request as the Scheduler sent it (sealed with the app's keys)."""
    return agent_request("ORD-7", step, attempt, action, T0 + timedelta(minutes=1))


def answer(req: AgentRequest, outcome: ReplyOutcome = ReplyOutcome.OK, **changes) -> AgentReply:
    """What an honest agent answers to `req`, with `changes` applied before
    the agent signature (the strongest forger: one holding an agent key)."""
    reply = AgentReply(
        InstanceId=req.InstanceId,
        OrderID=req.OrderID,
        Step=req.Step,
        Action=req.Action,
        Attempt=req.Attempt,
        AppId=req.AppId,
        ReplyToken=req.ReplyToken,
        EventName=req.ReplyEvent,
        EventId=f"{req.InstanceId}/{req.ReplyEvent}/reply",
        Outcome=outcome,
        Result={"Reference": "R-1"} if outcome is ReplyOutcome.OK else None,
        Error=None if outcome is ReplyOutcome.OK else "declined",
    )
    return sign_reply(KEYS.agents, reply.model_copy(update=changes))


async def bridge(reply: AgentReply):
    client = Client()
    settle = await bridge_reply(encode(reply), client, KEYS)
    return settle, client.raised


async def test_a_genuine_reply_is_raised_on_its_instance():
    req = sent()
    settle, raised = await bridge(answer(req))
    assert settle.kind is SettleKind.COMPLETE
    assert raised == [(req.InstanceId, req.ReplyEvent)]


def _cases():
    req = sent()
    genuine = answer(req)
    other = SchedulerKeys(tokens=parse_keys(new_key()), agents=parse_keys(new_key()))
    yield (
        "no token, no signature",
        genuine.model_copy(update={"ReplyToken": None, "Signature": None}),
    )
    yield "no token", answer(req, ReplyToken=None)
    yield "random token", answer(req, ReplyToken=f"v1.{KEYS.tokens.key_ids[0]}.AAAAAAAA")
    yield (
        "another app's keys",
        answer(seal_request(other, req.model_copy(update={"Signature": None}))),
    )
    # The forged ok of a step in flight whose payment is really declined:
    # the real token, a changed outcome, no agent signature over it.
    yield (
        "real token, changed outcome",
        answer(req, ReplyOutcome.PERMANENT).model_copy(update={"Signature": genuine.Signature}),
    )
    # A step not yet requested: its token cannot exist; the in-flight step's
    # token, moved onto it, verifies for nothing.
    yield (
        "step not yet requested",
        answer(req, Step="arrange-shipment", EventName="reply-arrange-shipment-1"),
    )
    yield "another application", answer(req, AppId="partner-portal")
    yield "another undo try", answer(sent(action="undo"), EventName="reply-charge-payment-undo-1-1")
    yield "attempt not the instance's", answer(sent(attempt=2), InstanceId="ORD-7:1")


@pytest.mark.parametrize(("what", "reply"), list(_cases()), ids=[c[0] for c in _cases()])
async def test_a_forged_reply_is_dead_lettered_and_raises_nothing(what, reply):
    settle, raised = await bridge(reply)
    assert settle.kind is SettleKind.DEAD_LETTER, what
    assert settle.reason == "ForgedReply"
    assert settle.order_id == "ORD-7"  # the alert names the order it aimed at
    assert "no event raised" in (settle.description or "")
    assert raised == []


async def test_a_request_from_a_plan_recorded_before_appids_still_gets_its_answer():
    """An instance in flight across the upgrade replays a plan without AppId:
    its request names no application, consistently in token and reply."""
    req = agent_request("ORD-7", "charge-payment", 1, "do", T0, app_id=None)
    assert req.AppId is None
    settle, raised = await bridge(answer(req))
    assert settle.kind is SettleKind.COMPLETE
    assert raised == [(req.InstanceId, req.ReplyEvent)]
    settle, raised = await bridge(answer(req, AppId="webshop"))  # naming one now: forged
    assert settle.reason == "ForgedReply"
    assert raised == []


async def test_the_send_activity_seals_what_the_plan_says():
    """SchedulerActivities signs every request it sends, with the plan's AppId."""
    from domain.codec import decode
    from domain.signing import check_request, reply_token
    from orchestrators.contracts import SendRequest
    from tests.unit.orchestrators.driver import World

    world = World()
    acts = world.activities()
    for app_id in ("webshop", None):
        await acts.send_agent_request(
            SendRequest(
                InstanceId="ORD-8:1",
                Step="charge-payment",
                Deadline=T0 + timedelta(minutes=1),
                AppId=app_id,
                Payload={"Total": "1.00"},  # as the attempt's input gives it
                Try=0 if app_id else 1,
                Action="do" if app_id else "undo",
            )
        )
    sent = [decode(AgentRequest, body) for body in world.bus.to("agent-requests")]
    assert [r.AppId for r in sent] == ["webshop", None]
    for r in sent:
        assert check_request(KEYS.agents, r) is None
        assert r.ReplyToken == reply_token(KEYS.tokens, r)
