"""A step's request to the agents, sealed and sent: by the Scheduler's send
activities, and for an attempt's first step by the Starter itself, right
after it started the attempt (ADR 021l). One builder, so both send the same
message under the same id and duplicate detection drops the second."""

from __future__ import annotations

from collections.abc import Callable

from adapters.ports import MessagePublisher, OrdersRepository
from adapters.servicebus import AGENT_REQUESTS_QUEUE
from domain.codec import encode
from domain.ids import (
    agent_request_message_id,
    app_of_key,
    fencing_token,
    idempotency_key,
    parse_attempt_instance_id,
    reply_event_name,
)
from domain.models import AgentRequest
from domain.signing import SchedulerKeys, seal_request
from domain.steps import DEFAULT_CATALOG, StepCatalog
from orchestrators.contracts import SendRequest, step_payload


class AgentRequests:
    """`keys`: the scheduler's keys, read when a request is sealed (a missing
    key is a SettingsError naming the setting there); `orders`: where a
    request's payload is read when its sender has none; `steps`: the app's
    catalog, whose entry for a step names the order fields its requests carry."""

    def __init__(
        self,
        keys: Callable[[], SchedulerKeys],
        publisher: MessagePublisher,
        orders: OrdersRepository | None = None,
        steps: StepCatalog = DEFAULT_CATALOG,
    ) -> None:
        self._keys = keys
        self._publisher = publisher
        self._orders = orders
        self._steps = steps

    async def with_payload(self, send: SendRequest) -> SendRequest:
        """`send` with the order's step payload, read here only when its sender
        had none (the claimer's read failed); no copy is kept (activities move
        between hosts)."""
        if send.Payload or self._orders is None:
            return send
        order_id, _ = parse_attempt_instance_id(send.InstanceId)
        return send.model_copy(update={"Payload": step_payload(await self._orders.get(order_id))})

    def sealed(self, send: SendRequest) -> AgentRequest:
        """The request `send` describes, sealed: its reply token and signature
        (domain.signing) under the app's keys."""
        order_id, attempt = parse_attempt_instance_id(send.InstanceId)
        request = AgentRequest(
            InstanceId=send.InstanceId,
            OrderID=order_id,
            Step=send.Step,
            Action=send.Action,
            Attempt=attempt,
            AppId=send.AppId or app_of_key(order_id),
            IdempotencyKey=idempotency_key(order_id, send.Step),
            FencingToken=fencing_token(attempt),
            Deadline=send.Deadline,
            ReplyEvent=reply_event_name(send.Step, attempt, send.label),
            Payload=self._steps.part(send.Step, send.Payload),
            ListenUntil=send.ListenUntil,
        )
        return seal_request(self._keys(), request)

    async def send(self, send: SendRequest) -> str:
        """Send `send`'s request under its stable message id; that id."""
        request = self.sealed(await self.with_payload(send))
        message_id = agent_request_message_id(send.InstanceId, send.Step, send.label)
        await self._publisher.send(
            AGENT_REQUESTS_QUEUE,
            encode(request),
            message_id,
            {"OrderID": request.OrderID, "Step": request.Step, "Action": request.Action},
        )
        return message_id
