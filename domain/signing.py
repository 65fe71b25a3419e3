"""Proof of origin for the internal queues: HMAC-SHA256 under keys from the
app's settings, never a secret in code or in a message. Three proofs, each
under its own purpose label so that one is never taken for another: the
reply token (one request's identity, under the reply-token keys only the
Functions app holds), the request signature and the reply signature (the
whole canonical message, under the agent keys). What each binds and why:
docs/adr/017e-internal-queue-keys.md.

A `KeyRing` holds the keys valid now: the first signs, every one verifies
(rotation: add the new key in front, wait, drop the old). A proof reads
`v1.<key id>.<MAC>`; MACs are compared in constant time. Pure: no I/O."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from domain.models import AgentReply, AgentRequest

VERSION = "v1"
MIN_KEY_BYTES = 32
MAX_KEYS = 4

REPLY_TOKEN = "reply-token"
AGENT_REQUEST = "agent-request"
AGENT_REPLY = "agent-reply"


class BadKey(ValueError):
    """A key setting that cannot be used; the message says why (never the key)."""


@dataclass(frozen=True)
class _Key:
    kid: str
    secret: bytes = b""

    def __repr__(self) -> str:  # never print a secret
        return f"_Key({self.kid})"


def key_id(secret: bytes) -> str:
    """A short public fingerprint of a key: names it in proofs and logs."""
    return hashlib.sha256(b"key-id/" + secret).hexdigest()[:8]


def new_key() -> str:
    """A fresh random key as setting text (base64url of 32 random bytes)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(MIN_KEY_BYTES)).decode().rstrip("=")


def _decode_key(text: str, position: int) -> bytes:
    padded = text + "=" * (-len(text) % 4)
    try:
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise BadKey(f"key {position} is not base64") from None
    if len(raw) < MIN_KEY_BYTES:
        raise BadKey(
            f"key {position} has {len(raw)} bytes; at least {MIN_KEY_BYTES} random bytes are needed"
        )
    return raw


class KeyRing:
    """The keys valid now, the current (signing) one first."""

    def __init__(self, secrets_: Sequence[bytes]) -> None:
        if not secrets_:
            raise BadKey("no key given")
        if len(secrets_) > MAX_KEYS:
            raise BadKey(f"{len(secrets_)} keys given; at most {MAX_KEYS} at once")
        keys = [_Key(key_id(s), s) for s in secrets_]
        if len({k.kid for k in keys}) != len(keys):
            raise BadKey("the same key is given twice")
        self._keys = keys

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(k.kid for k in self._keys)

    def __repr__(self) -> str:
        return f"KeyRing({', '.join(self.key_ids)})"

    def prove(self, purpose: str, data: bytes) -> str:
        key = self._keys[0]
        return f"{VERSION}.{key.kid}.{_mac(key.secret, purpose, data)}"

    def verify(self, purpose: str, data: bytes, proof: str | None) -> str | None:
        """None when `proof` is a valid proof of `data` for `purpose` under one
        of the keys; otherwise why not (for the dead letter: no key material)."""
        if not proof:
            return "no proof"
        version, _, rest = proof.partition(".")
        kid, _, mac = rest.partition(".")
        if version != VERSION or not kid or not mac:
            return "not a v1 proof"
        key = next((k for k in self._keys if k.kid == kid), None)
        if key is None:
            return f"unknown key {kid[:8]!r}"
        if not hmac.compare_digest(mac.encode(), _mac(key.secret, purpose, data).encode()):
            return f"does not verify under key {kid}"
        return None


def parse_keys(text: str) -> KeyRing:
    """A key setting's text: keys separated by commas, current first."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise BadKey("empty key")
    return KeyRing([_decode_key(p, i + 1) for i, p in enumerate(parts)])


def _mac(secret: bytes, purpose: str, data: bytes) -> str:
    digest = hmac.new(secret, purpose.encode() + b"\x00" + data, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def canonical(value: Any) -> bytes:
    """One byte string per value: sorted keys, no spaces, ASCII only."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _identity(
    app_id: str | None,
    instance_id: str,
    order_id: str,
    step: str,
    action: str,
    attempt: int,
    event: str,
) -> bytes:
    return canonical(
        {
            "AppId": app_id,
            "InstanceId": instance_id,
            "OrderID": order_id,
            "Step": step,
            "Action": action,
            "Attempt": attempt,
            "Event": event,
        }
    )


def reply_token(keys: KeyRing, request: AgentRequest) -> str:
    """The token the reply to `request` must carry."""
    return keys.prove(
        REPLY_TOKEN,
        _identity(
            request.AppId,
            request.InstanceId,
            request.OrderID,
            request.Step,
            request.Action,
            request.Attempt,
            request.ReplyEvent,
        ),
    )


def check_reply_token(keys: KeyRing, reply: AgentReply) -> str | None:
    """None when the reply's token was made for the request this reply says it
    answers (its own identity fields); otherwise why not."""
    return keys.verify(
        REPLY_TOKEN,
        _identity(
            reply.AppId,
            reply.InstanceId,
            reply.OrderID,
            reply.Step,
            reply.Action,
            reply.Attempt,
            reply.EventName,
        ),
        reply.ReplyToken,
    )


def _content(message: AgentRequest | AgentReply) -> bytes:
    return canonical(message.model_dump(mode="json", exclude={"Signature"}))


def sign_request(keys: KeyRing, request: AgentRequest) -> AgentRequest:
    """`request` with its reply token already set, signed."""
    return request.model_copy(update={"Signature": keys.prove(AGENT_REQUEST, _content(request))})


def check_request(keys: KeyRing, request: AgentRequest) -> str | None:
    return keys.verify(AGENT_REQUEST, _content(request), request.Signature)


def sign_reply(keys: KeyRing, reply: AgentReply) -> AgentReply:
    return reply.model_copy(update={"Signature": keys.prove(AGENT_REPLY, _content(reply))})


def check_reply(keys: KeyRing, reply: AgentReply) -> str | None:
    return keys.verify(AGENT_REPLY, _content(reply), reply.Signature)


@dataclass(frozen=True)
class SchedulerKeys:
    """What the Functions app holds: the reply-token keys (only it) and the
    agent keys (shared with the agents)."""

    tokens: KeyRing
    agents: KeyRing


def seal_request(keys: SchedulerKeys, request: AgentRequest) -> AgentRequest:
    """`request` as the Scheduler sends it: its reply token, then its signature."""
    with_token = request.model_copy(update={"ReplyToken": reply_token(keys.tokens, request)})
    return sign_request(keys.agents, with_token)


def check_scheduler_reply(keys: SchedulerKeys, reply: AgentReply) -> str | None:
    """Why the reply bridge must refuse `reply`, or None: the token must have
    been made for exactly the request it answers, and the signature must be
    an agent's over everything it says."""
    why = check_reply_token(keys.tokens, reply)
    if why is not None:
        return f"reply token: {why}"
    why = check_reply(keys.agents, reply)
    if why is not None:
        return f"signature: {why}"
    return None
