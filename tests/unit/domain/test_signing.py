"""domain.signing: what proves a request comes from the Scheduler and a reply
answers one of its requests (ADR 017e), and that nothing else does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from domain.codec import decode, encode
from domain.errors import ValidationFailed
from domain.models import AgentReply, AgentRequest, ReplyOutcome
from domain.signing import (
    BadKey,
    KeyRing,
    SchedulerKeys,
    check_reply_token,
    check_request,
    check_scheduler_reply,
    key_id,
    new_key,
    parse_keys,
    reply_token,
    seal_request,
    sign_reply,
)
from tests.builders import KEYS, agent_request

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def request(**changes) -> AgentRequest:
    base = agent_request("ORD-1", "charge-payment", 2, "do", T0 + timedelta(minutes=1))
    return seal_request(KEYS, base.model_copy(update=changes)) if changes else base


def reply_to(req: AgentRequest, **changes) -> AgentReply:
    """The reply an honest agent sends to `req` (echo, then sign)."""
    reply = AgentReply(
        InstanceId=req.InstanceId,
        OrderID=req.OrderID,
        Step=req.Step,
        Action=req.Action,
        Attempt=req.Attempt,
        AppId=req.AppId,
        ReplyToken=req.ReplyToken,
        EventName=req.ReplyEvent,
        EventId=f"{req.InstanceId}/reply",
        Outcome=ReplyOutcome.OK,
        Result={"Reference": "R-1"},
    )
    return sign_reply(KEYS.agents, reply.model_copy(update=changes))


def test_a_sealed_request_verifies_after_the_wire_and_its_reply_too():
    req = decode(AgentRequest, encode(request()))
    assert req.ReplyToken
    assert req.Signature
    assert check_request(KEYS.agents, req) is None
    reply = decode(AgentReply, encode(reply_to(req)))
    assert check_scheduler_reply(KEYS, reply) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("FencingToken", 999),
        ("Action", "undo"),
        ("OrderID", "ORD-2"),
        ("IdempotencyKey", "ORD-2/charge-payment"),
        ("Deadline", T0 + timedelta(days=1)),
        ("ListenUntil", T0 + timedelta(days=1)),
        ("Payload", {"Total": "1000000.00"}),
        ("AppId", "partner-portal"),
        ("ReplyEvent", "reply-charge-payment-undo-1-2"),
        ("Step", "arrange-shipment"),
    ],
)
def test_a_request_changed_in_any_field_no_longer_verifies(field, value):
    changed = request().model_copy(update={field: value})
    assert check_request(KEYS.agents, changed) is not None


def test_an_unsigned_request_and_one_signed_with_another_key_are_refused():
    req = request()
    assert check_request(KEYS.agents, req.model_copy(update={"Signature": None})) == "no proof"
    other = SchedulerKeys(tokens=parse_keys(new_key()), agents=parse_keys(new_key()))
    forged = seal_request(other, req.model_copy(update={"Signature": None}))
    assert "unknown key" in (check_request(KEYS.agents, forged) or "")
    garbage = req.model_copy(update={"Signature": f"v1.{KEYS.agents.key_ids[0]}.AAAA"})
    assert "does not verify" in (check_request(KEYS.agents, garbage) or "")


def test_a_reply_token_is_bound_to_exactly_one_request():
    """A token copied from one request verifies for no other: not another
    step (one not requested yet), attempt, action, undo try or application."""
    req = request()
    genuine = reply_to(req)
    assert check_reply_token(KEYS.tokens, genuine) is None
    for change in (
        {"Step": "arrange-shipment", "EventName": "reply-arrange-shipment-2"},
        {"Action": "undo", "EventName": "reply-charge-payment-undo-0-2"},
        {"EventName": "reply-charge-payment-undo-1-2"},
        {"AppId": "partner-portal"},
        {"AppId": None},
        {"InstanceId": "ORD-1:3", "Attempt": 3},
        {"OrderID": "ORD-9", "InstanceId": "ORD-9:2"},
    ):
        moved = reply_to(req, **change)  # a valid agent signature, the copied token
        assert check_reply_token(KEYS.tokens, moved) is not None, change
        assert check_scheduler_reply(KEYS, moved) is not None, change


def test_a_real_token_does_not_let_anyone_change_what_the_reply_says():
    req = request()
    said = reply_to(req).model_copy(
        update={"Outcome": ReplyOutcome.PERMANENT, "Result": None, "Error": "declined"}
    )
    assert check_reply_token(KEYS.tokens, said) is None  # the token is the real one
    assert "signature" in (check_scheduler_reply(KEYS, said) or "")


def test_an_agent_key_cannot_make_a_reply_token():
    """Agents hold the agent keys, never the reply-token keys: a token made
    under the agent keys (a compromised worker's best try) is refused."""
    req = request()
    minted = reply_token(KEYS.agents, req)
    reply = reply_to(req).model_copy(update={"ReplyToken": minted})
    assert check_scheduler_reply(KEYS, sign_reply(KEYS.agents, reply)) is not None


def test_rotation_signs_with_the_first_key_and_verifies_with_either():
    old, new = new_key(), new_key()
    before = parse_keys(old)
    during = parse_keys(f"{new},{old}")
    after = parse_keys(new)
    req = request().model_copy(update={"Signature": None})
    signed_before = seal_request(SchedulerKeys(before, before), req)
    signed_during = seal_request(SchedulerKeys(during, during), req)
    assert check_request(during, signed_before) is None
    assert check_request(before, signed_during) is not None  # signed with the new key
    assert check_request(after, signed_during) is None
    assert check_request(after, signed_before) is not None  # the old key is gone
    assert during.key_ids[0] == key_id(parse_keys(new)._keys[0].secret)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("a,,b", "empty"),
        ("not base64!", "not base64"),
        ("c2hvcnQ", "at least 32"),
    ],
)
def test_bad_key_settings_are_refused_without_quoting_them(text, says):
    with pytest.raises(BadKey, match=says) as caught:
        parse_keys(text)
    assert text not in str(caught.value) or not text


def test_the_same_key_twice_and_too_many_keys_are_refused():
    k = new_key()
    with pytest.raises(BadKey, match="twice"):
        parse_keys(f"{k},{k}")
    with pytest.raises(BadKey, match="at most"):
        parse_keys(",".join(new_key() for _ in range(5)))


def test_no_key_material_in_reprs():
    ring = parse_keys(new_key())
    assert repr(ring) == f"KeyRing({ring.key_ids[0]})"
    assert "secret" not in repr(ring._keys[0])


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=20),
)
payloads = st.dictionaries(
    st.text(st.characters(min_codepoint=0x41, max_codepoint=0x7A), min_size=1, max_size=8),
    st.recursive(json_scalars, lambda c: st.lists(c, max_size=3), max_leaves=6),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(payload=payloads, microseconds=st.integers(0, 999_999))
def test_a_signature_survives_the_wire_for_any_payload(payload, microseconds):
    """The signature covers the canonical form of the decoded message, so
    the receiver computes the very bytes the sender signed."""
    deadline = T0 + timedelta(microseconds=microseconds)
    req = request(Payload=payload, Deadline=deadline)
    try:
        received = decode(AgentRequest, encode(req))
    except ValidationFailed:
        assume(False)  # a payload the contract refuses is not this test's
        return
    assert check_request(KEYS.agents, received) is None


def test_a_key_ring_needs_a_key():
    with pytest.raises(BadKey):
        KeyRing([])
