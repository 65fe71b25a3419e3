"""Orders for tests: one valid order payload, overridable field by field."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

from adapters.clock import wait_event
from adapters.settings import AGENT_SIGNING_KEYS, REPLY_TOKEN_KEYS
from domain import state_machine as sm
from domain.errors import NotFoundError
from domain.ids import attempt_instance_id, fencing_token, idempotency_key, reply_event_name
from domain.models import AgentReply, AgentRequest, OrderState
from domain.signing import SchedulerKeys, new_key, parse_keys, reply_token, seal_request, sign_reply

# The internal queues' keys for tests: new for every test run, never in the repo
# (ADR 017e). Processes a test starts get them through their environment.
KEY_SETTINGS = {AGENT_SIGNING_KEYS: new_key(), REPLY_TOKEN_KEYS: new_key()}
KEYS = SchedulerKeys(
    tokens=parse_keys(KEY_SETTINGS[REPLY_TOKEN_KEYS]),
    agents=parse_keys(KEY_SETTINGS[AGENT_SIGNING_KEYS]),
)


def sealed(request: AgentRequest) -> AgentRequest:
    """`request` as the Scheduler's send activity sends it: token and signature."""
    return seal_request(KEYS, request)


def signed_reply(reply: AgentReply, request: AgentRequest | None = None) -> AgentReply:
    """`reply` as an agent sends it: the token of the request it answers
    (`request`, else the one its own fields name), then the agent's signature."""
    if request is None:
        request = AgentRequest(
            InstanceId=reply.InstanceId,
            OrderID=reply.OrderID,
            Step=reply.Step,
            Action=reply.Action,
            Attempt=reply.Attempt,
            AppId=reply.AppId,
            IdempotencyKey=idempotency_key(reply.OrderID, reply.Step),
            FencingToken=fencing_token(reply.Attempt),
            Deadline=datetime(2030, 1, 1).astimezone(),
            ReplyEvent=reply.EventName,
        )
    token = reply_token(KEYS.tokens, request)
    return sign_reply(KEYS.agents, reply.model_copy(update={"ReplyToken": token}))


def order_payload(order_id: str = "ORD-1", **overrides: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "OrderID": order_id,
        "AppId": "webshop",
        "ReplyTo": "replies-webshop",
        "Customer": {"CustomerId": "C-7", "Name": "Ada"},
        "Lines": [
            {"Sku": "SKU-1", "Quantity": 2, "UnitPrice": "10.00"},
            {"Sku": "SKU-2", "Quantity": 1, "UnitPrice": "5.50"},
        ],
        "Total": "25.50",
        "Currency": "EUR",
        "PaymentReference": "pay-ref-42",
    }
    payload.update(overrides)
    return payload


def agent_request(
    order_id: str,
    step: str,
    attempt: int,
    action: str,
    deadline: datetime,
    payload: dict[str, Any] | None = None,
    app_id: str | None = "webshop",
) -> AgentRequest:
    """An AgentRequest with every identity built by domain.ids and sealed
    with the test keys, as the Scheduler's send activity builds it."""
    return sealed(
        AgentRequest(
            InstanceId=attempt_instance_id(order_id, attempt),
            OrderID=order_id,
            Step=step,
            Action=action,
            Attempt=attempt,
            IdempotencyKey=idempotency_key(order_id, step),
            FencingToken=fencing_token(attempt),
            Deadline=deadline,
            ReplyEvent=reply_event_name(step, attempt, action),
            Payload=payload or {},
            AppId=app_id,
        )
    )


class ReadClock:
    """The product's Clock (adapters.clock) reading a test's time; it sleeps for real."""

    def __init__(self, read: Callable[[], datetime]) -> None:
        self._read = read

    def now(self) -> datetime:
        return self._read()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        return await wait_event(event, seconds)


def start_step(record: OrderState, step: str, now: datetime, deadline: datetime) -> OrderState:
    """`record` (claimed) with `step` Running for its attempt until `deadline`,
    which is the record's CompleteBy too: what the claim's marking writes for
    each step it marks (domain.state_machine.claim_marking)."""
    state = sm._running(record, step, now, deadline)
    return record.model_copy(
        update={"Steps": {**record.Steps, step: state}, "CompleteBy": deadline, "UpdatedAt": now},
        deep=True,
    )


async def claim(store: Any, order_id: str, now: datetime, policy: sm.RetryPolicy) -> Any:
    """The Starter's claim of the stored record `order_id`, marking no step
    (its CompleteBy the claim timeout ahead): the claimed record, or None when
    it is absent, not claimable, or another claimer won (store.claim_known)."""
    try:
        record, etag = await store.read(order_id)
    except NotFoundError:
        return None
    won = await store.claim_known(record, etag, now, policy, ([], now + policy.claim_timeout))
    return won[0] if won is not None else None
