"""Forged messages on the internal queues, through the whole local stack
(ADR 017e; issue 22's list): every forged reply on `agent-responses` and
every forged request on `agent-requests` is dead-lettered with a reason that
says it proved nothing and is counted in exactly one alert (its own, naming
its message id, or its kind's aggregate), calls
nothing at the remote service, and changes no order: each order ends as it
really would. The forger knows every id (instance, step, attempt, event
name, key id) but holds no key; one case uses the stack's own keys to sign a
request for a step no agent knows (version skew), which is refused too."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode

from domain.errors import NotFoundError
from domain.ids import idempotency_key, order_key, reply_event_name
from domain.models import AgentRequest, ProcessState, StepStatus
from domain.signing import seal_request
from tests.e2e.conftest import E2E

pytestmark = [pytest.mark.timeout(600)]

REQUESTS, REPLIES = "agent-requests", "agent-responses"


def _reply(order_id: str, step: str, outcome: str = "ok", **changes) -> dict:
    order_id = order_key("webshop", order_id)  # how the system names the webshop's order
    body = {
        "SchemaVersion": 1,
        "InstanceId": f"{order_id}:1",
        "OrderID": order_id,
        "Step": step,
        "Action": "do",
        "Attempt": 1,
        "AppId": "webshop",
        "ReplyToken": None,
        "Signature": None,
        "EventName": reply_event_name(step, 1),
        "EventId": f"{order_id}:1/{reply_event_name(step, 1)}/reply",
        "Outcome": outcome,
        "Result": {"Reference": "forged"} if outcome == "ok" else None,
        "Error": None if outcome == "ok" else "card declined",
    }
    body.update(changes)
    return body


def _request(order_id: str, step: str, action: str = "do", **changes) -> dict:
    order_id = order_key("webshop", order_id)
    label = "do" if action == "do" else "undo-0"
    body = {
        "SchemaVersion": 1,
        "InstanceId": f"{order_id}:1",
        "OrderID": order_id,
        "Step": step,
        "Action": action,
        "Attempt": 1,
        "AppId": "webshop",
        "ReplyToken": None,
        "Signature": None,
        "IdempotencyKey": f"{order_id}/{step}",
        "FencingToken": 1,
        "Deadline": (datetime.now(UTC) + timedelta(seconds=60)).isoformat(),
        "ReplyEvent": reply_event_name(step, 1, label),
        "Payload": {"Total": "1.00"},
        "ListenUntil": None,
    }
    body.update(changes)
    return body


class Forger:
    def __init__(self, e2e: E2E) -> None:
        self.e2e = e2e
        self.sent: dict[str, tuple[str, str]] = {}  # message id -> (queue, reason expected)
        keys = e2e.settings.scheduler_keys()
        self.kid = keys.tokens.key_ids[0]  # public: it is in every token

    async def send(self, queue: str, body: dict, reason: str, what: str) -> str:
        mid = f"{self.e2e.prefix}-forged-{what}-{uuid.uuid4().hex[:6]}"
        async with self.e2e.bus.get_queue_sender(queue) as sender:
            await sender.send_messages(ServiceBusMessage(json.dumps(body), message_id=mid))
        self.sent[mid] = (queue, reason)
        return mid

    async def settled(self, timeout: float = 60) -> tuple[dict[str, str], Counter, set[str]]:
        """Every forged message's dead-letter reason; the alerts' counts per
        kind (an aggregate counts `Count`: docs/operations.md, "Alerts"), and
        the message ids the alerts name (an aggregate its first and last)."""
        dead: dict[str, str] = {}
        counts: Counter = Counter()
        named: set[str] = set()
        expected = Counter(reason for _, reason in self.sent.values())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and set(dead) != set(self.sent):
            for queue in (REQUESTS, REPLIES):
                for m in await _drain(self.e2e, f"{queue}/$deadletterqueue"):
                    dead[m.message_id] = m.dead_letter_reason
            await asyncio.sleep(0.5)
        # An alert is queued before its dead letter is settled, an aggregate
        # when its window ends (ALERT_WINDOW_SECONDS, short here).
        while time.monotonic() < deadline + 30:
            for m in await _drain(self.e2e, "alerts"):
                alert = json.loads(b"".join(m.body))
                if alert.get("Kind") in expected:
                    counts[alert["Kind"]] += alert.get("Count", 1)
                    named.add(alert.get("MessageId"))
                    named.add((alert.get("Last") or {}).get("MessageId", alert.get("MessageId")))
            if counts == expected:
                break
            await asyncio.sleep(1)
        await asyncio.sleep(2)  # nothing more comes
        for m in await _drain(self.e2e, "alerts"):
            alert = json.loads(b"".join(m.body))
            counts[alert.get("Kind")] += alert.get("Count", 1)
        return dead, counts, named


async def _drain(e2e: E2E, queue: str, idle: float = 1.0) -> list:
    out = []
    async with e2e.bus.get_queue_receiver(
        queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        while True:
            batch = await receiver.receive_messages(max_message_count=100, max_wait_time=idle)
            if not batch:
                return out
            out.extend(batch)


async def _calls(e2e: E2E, order_id: str) -> list[dict]:
    order_id = order_key("webshop", order_id)
    async with e2e.http.get(f"{e2e.remote}/_admin/requests", params={"order_id": order_id}) as r:
        assert r.status == 200, await r.text()
        return (await r.json())["requests"]


async def test_every_forged_reply_and_request_is_refused_and_changes_nothing(stack):
    async with E2E(stack) as e2e:
        forger = Forger(e2e)
        declined, steady, early, fenced = e2e.orders(4)
        ghost = f"{e2e.prefix}-ghost"
        # The declined order's payment is really declined, after a delay that
        # keeps its charge in flight; the steady order's charge is slow too;
        # the early order's reservation is slow (its charge not yet requested).
        await e2e.decline_charge(declined.OrderID)
        for order, service, op in (
            (declined, "payment", "charge"),
            (steady, "payment", "charge"),
            (early, "inventory", "reserve"),
        ):
            await e2e.fault(
                kind="latency",
                service=service,
                operation=op,
                order_id=order.OrderID,
                seconds=8,
                count=1,
            )

        # Before the fenced order exists: a request with FencingToken 999.
        await forger.send(
            REQUESTS,
            _request(fenced.OrderID, "charge-payment", FencingToken=999),
            "ForgedRequest",
            "fence-999",
        )
        await forger.send(
            REQUESTS, _request(ghost, "charge-payment"), "ForgedRequest", "ghost-charge"
        )
        await forger.send(
            REQUESTS, _request(steady.OrderID, "launch-rockets"), "ForgedRequest", "unknown-step"
        )
        # A signed request for a step no agent knows (the stack's own keys: version skew).
        signed = seal_request(
            e2e.settings.scheduler_keys(),
            AgentRequest.model_validate(
                _request(
                    ghost,
                    "launch-rockets",
                    IdempotencyKey=f"{order_key('webshop', ghost)}/launch-rockets",
                    Deadline=datetime.now(UTC) + timedelta(seconds=60),
                )
            ),
        )
        await forger.send(
            REQUESTS, signed.model_dump(mode="json"), "UnknownStep", "unknown-step-signed"
        )
        await asyncio.sleep(2)  # the fence-999 request is refused before the order exists
        await e2e.post([declined, steady, early, fenced])

        def running(order, step):
            return lambda rs: (
                order.OrderID in rs and rs[order.OrderID].Steps[step].Status is StepStatus.RUNNING
            )

        # Each forgery goes out the moment its target step is in flight (the
        # three are in flight at about the same time: watched together).
        kid = forger.kid
        moments = [
            (
                running(declined, "charge-payment"),
                [
                    (REPLIES, _reply(declined.OrderID, "charge-payment"), "ForgedReply", "ok"),
                    (
                        REPLIES,
                        _reply(
                            declined.OrderID,
                            "charge-payment",
                            ReplyToken=f"v1.{kid}.{uuid.uuid4().hex}{uuid.uuid4().hex}",
                        ),
                        "ForgedReply",
                        "ok-guessed-token",
                    ),
                ],
            ),
            (
                running(steady, "charge-payment"),
                [
                    (
                        REPLIES,
                        _reply(steady.OrderID, "charge-payment", "permanent"),
                        "ForgedReply",
                        "permanent",
                    ),
                    (
                        REPLIES,
                        _reply(steady.OrderID, "charge-payment", AppId="partner-portal"),
                        "ForgedReply",
                        "other-application",
                    ),
                    (
                        REQUESTS,
                        _request(steady.OrderID, "charge-payment", "undo"),
                        "ForgedRequest",
                        "undo-live",
                    ),
                ],
            ),
            (
                running(early, "reserve-inventory"),
                [
                    (
                        REPLIES,
                        _reply(early.OrderID, "charge-payment"),
                        "ForgedReply",
                        "step-not-yet-requested",
                    )
                ],
            ),
        ]

        async def watched() -> dict:
            # Point reads of the three orders: a scan of every state takes
            # seconds on a loaded machine, long enough to miss an 8 s window.
            out = {}
            for order in (declined, steady, early):
                with contextlib.suppress(NotFoundError):
                    out[order.OrderID] = (
                        await e2e.store.read(order_key("webshop", order.OrderID))
                    )[0]
            return out

        # A moment's forgeries go out in the background: sending five of them
        # (a link each) can take longer than another target's window on a
        # loaded machine, and the watch must not pause while they go (CI, stop 40).
        sending: list[asyncio.Task] = []
        deadline = time.monotonic() + 60
        while moments and time.monotonic() < deadline:
            records = await watched()
            for moment in [m for m in moments if m[0](records)]:
                moments.remove(moment)
                sending += [
                    asyncio.create_task(forger.send(queue, body, reason, what))
                    for queue, body, reason, what in moment[1]
                ]
            await asyncio.sleep(0.2)
        await asyncio.gather(*sending)
        assert not moments, "a target step was never seen in flight"

        ids = {o.OrderID for o in (declined, steady, early, fenced)}
        records = await e2e.wait_terminal(ids)
        # Each order ends as it really would.
        assert records[declined.OrderID].ProcessState is ProcessState.COMPENSATED
        for order in (steady, early, fenced):
            assert records[order.OrderID].ProcessState is ProcessState.PROCESSED, order.OrderID
            assert records[order.OrderID].Attempt == 1  # no retry: the fence was never poisoned
        # The early order's charge was really made (the forged reply was not kept).
        assert any(c["operation"] == "charge" for c in await _calls(e2e, early.OrderID))
        # One charge call for the fenced order: its own (the forged one was never made).
        charges = [c for c in await _calls(e2e, fenced.OrderID) if c["operation"] == "charge"]
        assert sum(c["count"] for c in charges) == 1
        assert await _calls(e2e, ghost) == []
        assert not any(
            c["operation"] in ("refund", "release") for c in await _calls(e2e, steady.OrderID)
        )

        # A refund for a Processed order: refused, the record unchanged but for
        # its outbox. The Supervisor may park the Processed status again while
        # the attempt's index entry is due and its discard not yet flushed
        # (ADR 021k: a resend under the same message id). With 6 s step
        # timeouts the steady order ends about 4 s before its deadline: in CI
        # at 219006e the record gained, during this check, a Processed entry
        # with the finishing write's time and no tries, which is that park.
        def unchanged(record):
            return record.model_copy(update={"PendingStatus": None})

        before, _ = await e2e.store.read(order_key("webshop", steady.OrderID))
        await forger.send(
            REQUESTS,
            _request(steady.OrderID, "charge-payment", "undo"),
            "ForgedRequest",
            "refund-processed",
        )
        dead, counts, named = await forger.settled()
        after, _ = await e2e.store.read(order_key("webshop", steady.OrderID))
        assert unchanged(after) == unchanged(before)
        assert not any(c["operation"] == "refund" for c in await _calls(e2e, steady.OrderID))

        expected = {mid: reason for mid, (_, reason) in forger.sent.items()}
        assert dead == expected
        # Each forgery counted in exactly one alert (its own, or its kind's
        # aggregate), and every alert names forgeries only.
        assert counts == Counter(reason for _, reason in forger.sent.values())
        assert named <= set(forger.sent)
        assert idempotency_key(steady.OrderID, "charge-payment")  # names stay valid
        assert await e2e.check(ids, refused={}) == []
