"""A hostile sender on the internal queues (ADR 017e): at any moment of a
schedule it forges well-formed replies on `agent-responses` and requests on
`agent-requests` with the right ids (real instance ids, steps, event names,
tokens and signatures it peeked from the queues) and a missing or wrong proof.

Its invariant, checked with the others (`check`): a forged message changes no
record, reaches no orchestration, calls nothing remote (no fencing token of
its own is ever seen by the remote service), is dead-lettered with a reason
that says it proved nothing, and raises exactly one alert.

It draws from its own random stream (`hostile/{seed}`), so a schedule without
it is the schedule it always was. In the foreign-senders world it is also an
insider holding the agents' signing key (a compromised agent host, ADR 017e:
"not even an agent can" answer a request never made): Options.insider_replies
`ok` replies to a request it peeked, signed with that key but with no reply
token, from a stream of its own (`hostile/insider/{seed}`). Its messages are sent fault-free (no delay
or duplicate drawn for them): the faults of the schedule still hit their
deliveries (crashes, lock expiries)."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from adapters.settlement import ORIGINAL_ID_PROPERTY
from domain.codec import decode, encode
from domain.ids import reply_event_name
from domain.models import AgentReply
from domain.signing import sign_reply

from .bus import later_copy
from .world import START

if TYPE_CHECKING:
    from .observed import Observed as Simulation  # what it reads of the schedule

REQUESTS, REPLIES = "agent-requests", "agent-responses"
# What a refused forgery is dead-lettered with (agents.messaging, orchestrators.reply_bridge).
REFUSED = {"ForgedRequest", "UnknownStep", "ForgedReply"}
ALERT_KINDS = frozenset(REFUSED)
FORGED_FENCE = 999
PREFIX = "forged/"

REPLY_KINDS = (
    "ok-no-proof",  # an ok for a step in flight: no token, no signature
    "ok-guessed-token",  # a token of the right shape under the real key id
    "permanent-real-token",  # the real token, a changed outcome, a copied signature
    "next-step-real-token",  # a step not yet requested, the in-flight step's token
    "other-application",  # the real token, another AppId
)
# The insider's (Options.insider_replies): what each must be refused as.
INSIDER_KINDS = ("agent-key-no-token", "agent-key-lax-time")
EXPECTED = {"agent-key-lax-time": frozenset({"InvalidMessage"})}
REQUEST_KINDS = (
    "fence-999",  # FencingToken 999 for an order (perhaps before it exists)
    "undo-live",  # an undo for a live order with a copied signature
    "unknown-step",
    "ghost-charge",  # a charge for an order that never exists
    "refund",  # a refund (undo of the charge), unsigned
    "changed-payload",  # a real request, its payload changed, its signature kept
)


class Hostile:
    def __init__(self, sim: Simulation, count: int, insiders: int = 0) -> None:
        self.sim = sim
        self.count = count
        self.insiders = insiders
        self.rng = random.Random(f"hostile/{sim.seed}")
        self.insider_rng = random.Random(f"hostile/insider/{sim.seed}")
        self.forged: dict[str, tuple[str, str]] = {}  # message id -> (queue, kind)
        self.effects: list[str] = []
        steps = sim.o.steps
        self.steps = steps.names
        # The step a ghost charge and a forged refund aim at: the one whose
        # provider refuses orders (the payment, in domain/steps.json).
        self.money = ([s for s in steps.steps if s.refusal is not None] or steps.steps)[0].name

    @property
    def pending(self) -> int:
        """Forgeries not sent yet."""
        return self.count + self.insiders - len(self.forged)

    # --- wiring -----------------------------------------------------------------------

    def install(self) -> None:
        """Watch what a forged message's handler does (it must do nothing),
        and schedule the forgeries."""
        sim = self.sim
        on_call, raise_event = sim.remote.on_call, sim.durable.raise_event
        on_write = sim.state_c.on_write

        # Every call reaches the services through `SimRemote.answer` (the
        # product's HTTP adapter over sim.remote.SimSession), which tells
        # `on_call` as the call starts; `SimRemote.call` is not on that path.
        def watched_call(c, timeout: float | None = None) -> None:
            if c.fencing_token == FORGED_FENCE or self._forged_actor():
                self.effects.append(
                    f"{self._actor()} made {c.service}/{c.operation} for {c.idempotency_key} "
                    f"with fencing token {c.fencing_token}"
                )
            if on_call is not None:
                on_call(c, timeout)

        async def watched_raise(instance_id: str, event_name: str, *args: Any, **kwargs: Any):
            if self._forged_actor():
                self.effects.append(f"{self._actor()} raised {event_name} on {instance_id}")
            return await raise_event(instance_id, event_name, *args, **kwargs)

        def watched_write(old, new) -> None:
            if self._forged_actor():
                self.effects.append(f"{self._actor()} wrote the record of {new.get('id')}")
            if on_write is not None:
                on_write(old, new)

        sim.remote.on_call = watched_call
        sim.durable.raise_event = watched_raise  # type: ignore[method-assign]
        sim.state_c.on_write = watched_write
        window = sim.o.fault_window
        for n in range(self.count):
            at = START + timedelta(seconds=round(self.rng.uniform(0, window), 3))
            sim.world.at(at, "hostile", lambda n=n: self._forge(n))
        for n in range(self.insiders):
            at = START + timedelta(seconds=round(self.insider_rng.uniform(0, window), 3))
            sim.world.at(at, "hostile", lambda n=n: self._forge_insider(n))

    def _actor(self) -> str:
        return self.sim.world._names.get(asyncio.current_task(), "")

    def _forged_actor(self) -> bool:
        name = self._actor()
        return name.startswith((f"agent:{PREFIX}", f"bridge:{PREFIX}"))

    # --- forging ----------------------------------------------------------------------

    def _real_requests(self) -> list[dict]:
        """What it peeked: every genuine request sent so far."""
        out = []
        for m in self.sim.bus.queue(REQUESTS).sent:
            if m.message_id.startswith(PREFIX):
                continue
            try:
                out.append(json.loads(m.body))
            except ValueError:
                continue
        return out

    def _forge(self, n: int) -> None:
        seen = self._real_requests()
        if self.rng.random() < 0.5:
            kind = self.rng.choice(REPLY_KINDS)
            body = self._reply(kind, seen)
            queue = REPLIES
        else:
            kind = self.rng.choice(REQUEST_KINDS)
            body = self._request(kind, seen)
            queue = REQUESTS
        message_id = f"{PREFIX}{n}"
        self.forged[message_id] = (queue, kind)
        self.sim.world.counters["forged"] += 1
        self.sim.world.log(f"hostile {kind} -> {queue} {message_id}")
        self.sim.bus.send(queue, json.dumps(body).encode(), message_id, fault_free=True)

    def _forge_insider(self, n: int) -> None:
        """A reply from a holder of the agents' signing key, to a request it
        peeked (or made up), `ok`, signed:

        - `agent-key-no-token`: with no reply token, which only the
          Scheduler can make (ADR 017e: not even an agent can answer a
          request never made), so the bridge refuses it `ForgedReply`;
        - `agent-key-lax-time`: with the request's own token, as an agent of
          another build would answer, its call record's time written as Unix
          seconds, as some JSON libraries write a timestamp: the contract
          coerces no type (ADR 013), so the bridge refuses it
          `InvalidMessage` before it reads anything (its signature is over
          the canonical form, which reads that time as the same instant)."""
        rng = self.insider_rng
        kind = rng.choice(INSIDER_KINDS)
        seen = self._real_requests()
        body = self._reply("ok-no-proof", seen, rng)
        at = self.sim.world.clock.now.replace(microsecond=0)
        body["Calls"] = [{"At": at.isoformat(), "Ms": 200, "Outcome": "ok"}]
        if kind == "agent-key-lax-time":
            body["ReplyToken"] = next(
                (
                    r.get("ReplyToken")
                    for r in reversed(seen)
                    if (r["InstanceId"], r["ReplyEvent"]) == (body["InstanceId"], body["EventName"])
                ),
                None,
            )
        keys = self.sim.settings.scheduler_keys().agents
        wire = json.loads(encode(sign_reply(keys, decode(AgentReply, json.dumps(body)))))
        if kind == "agent-key-lax-time":
            wire["Calls"][0]["At"] = int(at.timestamp())
        message_id = f"{PREFIX}insider-{n}"
        self.forged[message_id] = (REPLIES, kind)
        self.sim.world.counters["forged"] += 1
        self.sim.world.log(f"hostile {kind} -> {REPLIES} {message_id}")
        self.sim.bus.send(REPLIES, json.dumps(wire).encode(), message_id, fault_free=True)

    def _target(self, seen: list[dict], rng: random.Random | None = None) -> dict:
        """A request to aim at: the latest genuine one (likely in flight), or
        one made up from an order id and a step when none was sent yet."""
        rng = rng or self.rng
        if seen and rng.random() < 0.8:
            return dict(seen[-1] if rng.random() < 0.6 else rng.choice(seen))
        oid = rng.choice(self.sim.order_ids)
        step = rng.choice(self.steps)
        attempt = rng.randint(1, 3)
        return {
            "SchemaVersion": 1,
            "InstanceId": f"{oid}:{attempt}",
            "OrderID": oid,
            "Step": step,
            "Action": "do",
            "Attempt": attempt,
            "AppId": "webshop",
            "ReplyToken": None,
            "Signature": None,
            "IdempotencyKey": f"{oid}/{step}",
            "FencingToken": attempt,
            "Deadline": (self.sim.world.clock.now + timedelta(seconds=20)).isoformat(),
            "ReplyEvent": reply_event_name(step, attempt),
            "Payload": {},
            "ListenUntil": None,
        }

    def _reply(self, kind: str, seen: list[dict], rng: random.Random | None = None) -> dict:
        req = self._target(seen, rng)
        reply: dict[str, Any] = {
            "SchemaVersion": 1,
            "InstanceId": req["InstanceId"],
            "OrderID": req["OrderID"],
            "Step": req["Step"],
            "Action": req["Action"],
            "Attempt": req["Attempt"],
            "AppId": req.get("AppId"),
            "ReplyToken": None,
            "Signature": None,
            "EventName": req["ReplyEvent"],
            "EventId": f"{req['InstanceId']}/{req['ReplyEvent']}/reply",
            "Outcome": "ok",
            "Result": {"Reference": "forged", "Status": "done"},
            "Error": None,
        }
        real_token = req.get("ReplyToken")
        if kind == "ok-guessed-token":
            kid = (real_token or "v1.00000000.x").split(".")[1]
            reply["ReplyToken"] = f"v1.{kid}.{self.rng.getrandbits(256):064x}"[:60]
        elif kind == "permanent-real-token":
            reply.update(
                ReplyToken=real_token,
                Signature=req.get("Signature"),  # a request's signature, not a reply's
                Outcome="permanent",
                Result=None,
                Error="card declined",
            )
        elif kind == "next-step-real-token":
            later = [s for s in self.steps if s != req["Step"]]
            step = self.rng.choice(later)
            reply.update(
                Step=step,
                Action="do",
                EventName=reply_event_name(step, req["Attempt"]),
                ReplyToken=real_token,
            )
        elif kind == "other-application":
            reply.update(AppId="partner-portal", ReplyToken=real_token)
        return reply

    def _request(self, kind: str, seen: list[dict]) -> dict:
        req = self._target(seen)
        if kind == "fence-999":
            oid = self.rng.choice(self.sim.order_ids)  # perhaps not submitted yet
            step = self.rng.choice(self.steps)
            req.update(
                InstanceId=f"{oid}:1",
                OrderID=oid,
                Step=step,
                Action="do",
                Attempt=1,
                IdempotencyKey=f"{oid}/{step}",
                ReplyEvent=reply_event_name(step, 1),
                FencingToken=FORGED_FENCE,
                Signature=None,
            )
        elif kind == "undo-live":
            req.update(
                Action="undo", ReplyEvent=reply_event_name(req["Step"], req["Attempt"], "undo-0")
            )  # the signature, if any, is the "do" request's
        elif kind == "unknown-step":
            req.update(Step="launch-rockets", IdempotencyKey=f"{req['OrderID']}/launch-rockets")
        elif kind == "ghost-charge":
            oid = f"ORD-{self.sim.seed}-ghost"
            req.update(
                InstanceId=f"{oid}:1",
                OrderID=oid,
                Step=self.money,
                Action="do",
                Attempt=1,
                IdempotencyKey=f"{oid}/{self.money}",
                FencingToken=1,
                ReplyEvent=reply_event_name(self.money, 1),
                Signature=None,
            )
        elif kind == "refund":
            req.update(
                Step=self.money,
                Action="undo",
                IdempotencyKey=f"{req['OrderID']}/{self.money}",
                ReplyEvent=reply_event_name(self.money, req["Attempt"], "undo-0"),
                Signature=None,
            )
        elif kind == "changed-payload":
            req["Payload"] = {**(req.get("Payload") or {}), "Total": "0.01"}
        # Far enough ahead that an agent fooled by it would have time to call.
        req["Deadline"] = (self.sim.world.clock.now + timedelta(seconds=30)).isoformat()
        return req

    # --- the invariant ----------------------------------------------------------------

    def check(self) -> None:
        sim = self.sim
        alerts: dict[str, int] = {}
        # The gate may carry a message on as a delayed copy (its alert could not
        # be queued yet), named by the broker; the copy says whose it is.
        origin: dict[str, str] = {}
        for queue in {q for q, _ in self.forged.values()}:
            for m in sim.bus.queue(queue).sent:
                origin[m.message_id] = str(m.props.get(ORIGINAL_ID_PROPERTY) or m.message_id)

        def _origin(message_id: str) -> str:
            return origin.get(message_id, message_id)

        queue_of = {mid: queue for mid, (queue, _) in self.forged.items()}
        expired: set[str] = set()
        for m in sim.alert_messages():
            raised_by = json.loads(m.body).get("MessageId") or ""
            mid = _origin(raised_by)
            if not mid.startswith(PREFIX):
                continue
            # An alert raised by a message that waited past its queue's time
            # to live (PT1H on the agents' queues) could not be raised in
            # Azure: Service Bus expires the message first, into the
            # dead-letter queue, which the platform's dead-letter alert rule
            # reports (infra/README.md). The bus keeps it through a whole-app
            # outage (seeds 100271, 263: a back-off copy, or a duplicate of
            # one, handled 8 days later, after the alerts queue's one-day
            # duplicate window). Such alerts stand for that one expiry: they
            # alert the forgery only when nothing else did (seed 100621).
            queue = queue_of.get(mid)
            if queue is not None and sim.bus.outlived_ttl(queue, raised_by, m.visible_at):
                expired.add(mid)
                continue
            alerts[mid] = alerts.get(mid, 0) + 1
        for mid in expired:
            alerts.setdefault(mid, 1)
        for mid, (queue, kind) in sorted(self.forged.items()):
            dead = [m for m in sim.bus.queue(queue).dead if _origin(m.message_id) == mid]
            if not dead:
                live = any(_origin(m.message_id) == mid for m in sim.bus.queue(queue).messages)
                sim.fail(
                    "forged message refused",
                    f"{mid} ({kind}) on {queue} was "
                    + ("never settled" if live else "completed as if genuine"),
                )
                continue
            # The lineage's verdict: a refusal on any of its messages (the
            # original or a back-off copy); every other dead letter of it must
            # be the broker's and explained: every delivery faulted (counting
            # one the gate could only abandon because the send of its next
            # copy faulted: seed 400174, sim.bus.Bus.copy_send_faulted), or the
            # gate carried the message on in a copy the queue accepted (the
            # copy's schedule applied with its answer lost, so the gate also
            # abandoned the delivery) and the lineage was refused (seed 54).
            expected = EXPECTED.get(kind, REFUSED)
            refused = [m for m in dead if m.dead_letter_reason in expected]
            reason = refused[0].dead_letter_reason if refused else "every delivery faulted"
            for m in dead:
                if m.dead_letter_reason in expected:
                    continue
                broker = m.dead_letter_reason == "MaxDeliveryCountExceeded"
                if broker and sim.bus.every_delivery_faulted(m):
                    continue  # the broker's verdict, which no handler can prevent
                if broker and refused and any(later_copy(m, c) for c in sim.bus.queue(queue).sent):
                    continue
                reason = m.dead_letter_reason or "no reason"
                break
            if reason not in (*expected, "every delivery faulted"):
                sim.fail("forged message refused", f"{mid} ({kind}) dead-lettered {reason}")
            # A refusal whose alert and next copy could both not be sent
            # (seed 100014: three deliveries lost at receive, the fourth met a
            # failed alert send and a refused copy) once went with its log
            # event only; the agent and the gate now hold that alert
            # (Alerts.hold) and send it once the alerts queue takes it, so it
            # is owed like any other (as for the gate's, _unfinished_dead_letter).
            # None is owed when no handler ever judged it: every delivery
            # faulted and the broker dead-lettered it (seed 11001128: four
            # receives lost with the message locked, one lock lost), which
            # the same rule reports; a handler that alerted and whose
            # dead-lettering then faulted still sent the one.
            unjudged = not refused and reason == "every delivery faulted"
            if alerts.get(mid, 0) != 1 and not (unjudged and alerts.get(mid, 0) == 0):
                sim.fail(
                    "forged message alerted once",
                    f"{mid} ({kind}): {alerts.get(mid, 0)} alerts",
                )
        for effect in self.effects[:1]:
            sim.fail("forged message changes nothing", effect)
