"""Property: every message on a queue the app consumes is either accepted as
a valid contract or dead-lettered with one documented reason and alerted; a
refused message writes no record; nothing raises out of a handler.

Hypothesis generates hostile bodies (spoiled fields, broken JSON, every AMQP
body kind) and application properties, mixed with valid messages. Each one is
sent to the real Service Bus emulator, received, and handed to the function
as registered (submit_order, agent_requests, reply_bridge) with a recording
message-actions object, against the real Cosmos server; then settled as the
function asked. Example counts are modest (CI has 2 cores): raise them with
HOSTILE_EXAMPLES."""

from __future__ import annotations

import asyncio
import json
import os
import re
import unicodedata
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes
from azure.servicebus.amqp import AmqpAnnotatedMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bootstrap
from agents.agent import Agent
from agents.messaging import RequestProcessor, ServiceBusReplySender
from console.peek import QueuePeeker
from domain.codec import decode
from domain.errors import NotFoundError, ValidationFailed
from domain.ids import order_key
from domain.models import AgentReply, AgentRequest, OrderSubmitted
from orchestrators.contracts import event_payload, reply_from_event
from reporting import Alerts
from tests.builders import KEYS, agent_request, order_payload, signed_reply
from tests.integration.app_env import INGRESS, Bus, RecordingActions, app_env, registered  # noqa: F401
from tests.property.strategies import (
    application_properties,
    hostile_text,
    json_values,
    raw_hostile_json,
    spoiled_orders,
)
from tests.unit.agents.conftest import POLICY
from tests.unit.agents.fakes import T0, FakeClock, FakeRemote
from triggers import agents as agent_triggers
from triggers import scheduler as scheduler_triggers
from triggers.submit import function_name, register

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

DOCUMENTED_REASONS = {
    "InvalidMessage",
    "ReplyQueueNotAllowed",
    "AppIdMismatch",
    "OrderConflict",
    "RetriesExhausted",
    "ProcessingFailed",
    # Internal queues: a message that does not prove where it comes from (ADR 017e).
    "ForgedRequest",
    "UnknownStep",
    "ForgedReply",
}
EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "15"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

ORDERS = INGRESS["webshop"]  # the property's messages arrive as the webshop's


# The app's root, as function_app builds it (settings from app_env's
# environment); the agent's trigger is over a root of its own, handed the
# processor of the running test (the `agent_processor` fixture).
ROOT = bootstrap.build()
_PROCESSOR: list[RequestProcessor] = []


async def _test_processor() -> RequestProcessor:
    return _PROCESSOR[-1]


AGENT_ROOT = bootstrap.build(overrides=bootstrap.Overrides(request_processor=_test_processor))


def _submit_function():
    import azure.durable_functions as df

    blueprint = df.Blueprint()
    register(blueprint, INGRESS, ROOT)
    # past the Durable middleware: run without a client (no fast path)
    return registered(blueprint, function_name("webshop")).__wrapped__


SUBMIT = _submit_function()
AGENT = registered(agent_triggers.blueprint(AGENT_ROOT), "agent_requests")
# The durable-client middleware builds the client from the host's JSON; the
# function it wraps is what runs after that, so it gets a recording client.
BRIDGE = registered(scheduler_triggers.blueprint(ROOT), "reply_bridge").__wrapped__

BODY_KINDS = ["data", "data-chunks", "value", "sequence", "value-map", "sequence-ints"]

# --- an oracle for "valid", independent of domain.boundary ---------------------------

_BAD = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\u2028\u2029\u00ad]"
)


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def oracle_accepts_text(body: bytes) -> bool:
    """No duplicate keys, and every string value is non-empty, trimmed and
    free of control, bidi and zero-width characters."""
    seen_dup = False

    def hook(pairs):
        nonlocal seen_dup
        keys = [k for k, _ in pairs]
        seen_dup |= len(keys) != len(set(keys))
        return dict(pairs)

    try:
        data = json.loads(body, object_pairs_hook=hook)
    except ValueError:
        return False
    if seen_dup:
        return False
    for s in _strings(data):
        if not s or s != s.strip() or _BAD.search(s):
            return False
        if any(unicodedata.category(c) in ("Cf", "Cs") for c in s):
            return False
    return True


# --- sending any body kind -------------------------------------------------------------


def _clean_props(props: dict | None) -> dict | None:
    if props is None:
        return None
    # A client cannot send a lone surrogate through AMQP either.
    return {
        k: (v.encode("utf-8", "replace").decode() if isinstance(v, str) else v)
        for k, v in props.items()
    }


def _amqp_typed(value: Any) -> Any:
    """A JSON value as another SDK would put it in an AMQP map: the Python SDK
    encodes every int as a 32-bit int and refuses a larger one, while a
    JavaScript or Proton sender sends a long (or, past 64 bits, a double)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return value
        if -(2**63) <= value < 2**63:
            return {TYPE: AMQPTypes.long, VALUE: value}
        return float(value)
    if isinstance(value, dict):
        return {k: _amqp_typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_amqp_typed(v) for v in value]
    return value


# The SDK's AMQP decoder refuses a value nested deeper than 64 levels (as
# .NET's does), so a receiver never gets one: the broker redelivers it until
# its max delivery count dead-letters it, and no function sees it. Deeper maps
# are sent at this depth, still twice the product's own limit (32). Much
# deeper ones (some 300 levels) cannot even be encoded: the encoder overflows
# the stack and raises with a context chain as deep, which Hypothesis cannot
# hash (a CI failure of 2026-12-04).
SDK_MAX_NESTING = 64


def _nesting(value: Any) -> int:
    """How deep containers nest in a JSON value (iteratively: it may be deep)."""
    top, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            top = max(top, depth + 1)
            stack.extend(
                (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
    return top


def _nested_list(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def amqp_message(body: bytes, kind: str, message_id: str, props: dict | None):
    props = _clean_props(props)
    if kind == "data":
        return ServiceBusMessage(body, message_id=message_id, application_properties=props)
    common = {"properties": {"message_id": message_id}, "application_properties": props}
    if kind == "data-chunks":
        half = len(body) // 2
        return AmqpAnnotatedMessage(data_body=[body[:half], body[half:]], **common)
    if kind == "value":
        return AmqpAnnotatedMessage(value_body=body, **common)
    if kind == "sequence":
        third = len(body) // 3
        return AmqpAnnotatedMessage(sequence_body=[[body[:third], body[third:]]], **common)
    if kind == "value-map":
        try:
            value = json.loads(body)
            # AMQP strings are UTF-8: a lone surrogate cannot even be sent.
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except (ValueError, UnicodeEncodeError):
            value = {"OrderID": "x"}
        except RecursionError:  # deeper than json.loads goes: as deep as can be received
            value = {"OrderID": "x", "Deep": _nested_list(SDK_MAX_NESTING - 1)}
        if _nesting(value) > SDK_MAX_NESTING:
            # No receiver can read it: see SDK_MAX_NESTING.
            value = {"OrderID": "x", "Deep": _nested_list(SDK_MAX_NESTING - 1)}
        return AmqpAnnotatedMessage(
            value_body=_amqp_typed(value) if isinstance(value, dict) and value else {"a": 1},
            **common,
        )
    return AmqpAnnotatedMessage(sequence_body=[[1, 2, 3]], **common)


class Queue:
    """One queue's sender and PEEK_LOCK receiver, kept open for a test."""

    def __init__(self, bus: Bus, name: str) -> None:
        self.bus, self.name = bus, name
        self.sender = bus.client.get_queue_sender(name)
        self.receiver = bus.client.get_queue_receiver(
            name, receive_mode=ServiceBusReceiveMode.PEEK_LOCK
        )

    async def __aenter__(self):
        await self.sender.__aenter__()
        await self.receiver.__aenter__()
        return self

    async def __aexit__(self, *exc):
        await self.receiver.__aexit__(*exc)
        await self.sender.__aexit__(*exc)

    async def deliver(self, message, function, **extra) -> tuple:
        """Send, receive, run the function as the host would, settle as asked.
        An exception out of the function fails the property."""
        await self.sender.send_messages(message)
        received = await self.receiver.receive_messages(max_message_count=1, max_wait_time=10)
        assert received, f"the message did not arrive on {self.name}"
        got = received[0]
        actions = RecordingActions()
        await function(message=got, message_actions=actions, **extra)  # must not raise
        assert len(actions.calls) == 1, actions.calls
        call = actions.calls[0]
        if call[0] == "complete":
            await self.receiver.complete_message(got)
        elif call[0] == "deadletter":
            await self.receiver.dead_letter_message(got, reason=call[1], error_description=call[2])
        else:
            await self.receiver.abandon_message(got)
        return call


def _parsed(message: Any) -> dict:
    """A JSON body parsed, others (value or sequence bodies of hostile
    messages) as {"raw": ...}."""
    from adapters.settlement import BodyRefused, read_body

    try:
        parsed = json.loads(read_body(message))
    except (BodyRefused, ValueError, RecursionError):
        parsed = {"raw": repr(message.body)}
    return parsed if isinstance(parsed, dict) else {"raw": parsed}


async def drain(bus: Bus, queue: str, wait: float = 0.1) -> list[dict]:
    """Receive and delete everything on `queue`."""
    out = []
    receiver = bus.client.get_queue_receiver(
        queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    )
    async with receiver:
        while batch := await receiver.receive_messages(max_message_count=100, max_wait_time=wait):
            out += [_parsed(message) for message in batch]
    return out


class OpenBus(Bus):
    """The test's Service Bus client with its links kept open across the
    Hypothesis examples: opening and closing a link costs about a second on
    the local emulator (console/peek.py), more than an example's own work.

    `arrived(queue)` is what was sent to `queue` since the last look, peeked
    (nothing received or waited for): every send the checks look for (an
    agent's reply, an alert window's flush) was awaited before they look, so
    it is on the queue already."""

    def __init__(self, connection_string: str) -> None:
        super().__init__(connection_string)
        self._queues: dict[str, Queue] = {}
        self._peeker = QueuePeeker(self.client)
        self._next: dict[str, int] = {}

    async def queue(self, name: str) -> Queue:
        if name not in self._queues:
            self._queues[name] = await Queue(self, name).__aenter__()
        return self._queues[name]

    async def arrived(self, queue: str) -> list[dict]:
        out: list[dict] = []
        while page := await self._peeker.peek(queue, 100, from_sequence=self._next.get(queue)):
            out += [_parsed(message) for message in page]
            self._next[queue] = page[-1].sequence_number + 1
        return out

    async def close(self) -> None:
        for queue in self._queues.values():
            await queue.__aexit__(None, None, None)
        await self._peeker.close()
        await super().close()


async def alerts_by_message_id(bus: OpenBus, alerts: Any) -> dict[str, list[dict]]:
    """The alerts sent since the last look by the message each names, once
    `alerts` (the process's Alerts, or the agent's processor) has sent its
    open windows: each example then starts a window of its own, and its one
    dead letter is that window's first alert, named by its message id
    (reporting.alerts)."""
    await alerts.close()
    out: dict[str, list[dict]] = {}
    for alert in await bus.arrived("alerts"):
        out.setdefault(alert.get("MessageId"), []).append(alert)
    return out


def check_dead_letters_alerted(dead: dict[str, str], alerts: dict[str, list[dict]]) -> None:
    for message_id, reason in dead.items():
        got = alerts.get(message_id, [])
        assert [a["Kind"] for a in got] == [reason], (message_id, reason, got)


@pytest.fixture
async def bus(app_env, servicebus_emulator):  # noqa: F811
    bus = OpenBus(servicebus_emulator.connection_string)
    await asyncio.gather(
        *(
            drain(bus, queue)
            for queue in (
                ORDERS,
                "agent-requests",
                "agent-responses",
                "alerts",
                "replies-webshop",
                f"{ORDERS}/$deadletterqueue",
                "agent-requests/$deadletterqueue",
                "agent-responses/$deadletterqueue",
            )
        )
    )
    yield bus
    await bus.close()
    await ROOT.close()


# --- orders --------------------------------------------------------------------------


@st.composite
def valid_orders(draw, order_id: str) -> bytes:
    lines = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "Sku": st.from_regex(r"[A-Z]{3}-[0-9]{1,4}", fullmatch=True),
                    "Quantity": st.integers(1, 20),
                    "UnitPrice": st.decimals(0, 999, places=2).map(lambda d: f"{d:.2f}"),
                }
            ),
            min_size=1,
            max_size=4,
        )
    )
    total = sum(Decimal(line["UnitPrice"]) * line["Quantity"] for line in lines)
    return json.dumps(order_payload(order_id, Lines=lines, Total=f"{total:.2f}")).encode()


def order_bodies(order_id: str):
    return st.one_of(
        valid_orders(order_id),
        spoiled_orders(order_id),
        raw_hostile_json(order_id),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=64),
    )


@SETTINGS
@given(data=st.data())
async def test_every_order_message_is_accepted_valid_or_dead_lettered_with_a_reason(bus, data):
    c = await ROOT.container()
    dead: dict[str, str] = {}
    orders = await bus.queue(ORDERS)
    order_id = f"P-{uuid.uuid4().hex[:12]}"
    body = data.draw(order_bodies(order_id), label="body")
    kind = data.draw(st.sampled_from(BODY_KINDS), label="kind")
    props = data.draw(application_properties, label="properties")
    message_id = f"prop-{uuid.uuid4().hex}"
    call = await orders.deliver(amqp_message(body, kind, message_id, props), SUBMIT, client=None)
    if call[0] == "complete":
        assert kind not in ("value-map", "sequence-ints")
        order = decode(OrderSubmitted, body)  # accepted only as a valid contract
        assert order.AppId == "webshop"  # the queue's application, whatever else the body says
        assert oracle_accepts_text(body)
        record, _ = await c.store.read(order_key(order.AppId, order.OrderID))
        assert record.OrderDigest == order.digest()
    else:
        assert call[0] == "deadletter", call
        assert call[1] in DOCUMENTED_REASONS, call
        assert call[2], "a dead letter says why"
        dead[message_id] = call[1]
        for oid in {order_id, _readable(body)} - {None}:
            for key in (oid, order_key("webshop", oid)):
                with pytest.raises(NotFoundError):
                    await c.store.read(key)
                with pytest.raises(NotFoundError):
                    await c.orders.get(key)
    check_dead_letters_alerted(
        dead, await alerts_by_message_id(bus, ROOT.alerts_over((await ROOT.container()).publisher))
    )


@pytest.mark.parametrize("depth", [250, 999, 3000])
async def test_a_value_map_too_deep_for_the_sdk_is_sent_as_deep_as_it_can_be(bus, depth):
    # The strategy's deepest bodies (raw_hostile_json "deep", up to 3,000
    # levels) once made the SDK's encoder overflow the stack inside the test,
    # a failure Hypothesis could not even report, and any past 64 levels never
    # reach a receiver. They are now sent at SDK_MAX_NESTING levels, still
    # deeper than the product reads.
    order_id = f"P-{uuid.uuid4().hex[:12]}"
    body = b'{"OrderID": "%s", "Deep": ' % order_id.encode() + b"[" * depth + b"]" * depth + b"}"
    message = amqp_message(body, "value-map", f"deep-{uuid.uuid4().hex}", None)
    assert _nesting(message.body) == SDK_MAX_NESTING
    orders = await bus.queue(ORDERS)
    call = await orders.deliver(message, SUBMIT, client=None)
    assert call[:2] == ("deadletter", "InvalidMessage"), call


def _readable(body: bytes) -> str | None:
    from domain.boundary import readable_order_id

    return readable_order_id(body)


# --- agent requests ------------------------------------------------------------------


def valid_request_body(order_id: str, attempt: int) -> bytes:
    request = agent_request(order_id, "charge-payment", attempt, "do", T0 + timedelta(hours=1))
    return request.model_dump_json().encode()


@st.composite
def request_bodies(draw, order_id: str) -> bytes:
    valid = json.loads(valid_request_body(order_id, 1))
    choice = draw(st.sampled_from(["valid", "spoil", "raw", "any"]))
    if choice == "valid":
        return valid_request_body(order_id, draw(st.integers(1, 5)))
    if choice == "spoil":
        key = draw(st.sampled_from([*sorted(valid), "Extra"]))
        valid[key] = draw(st.one_of(hostile_text, json_values, st.sampled_from([1.0, True, 0, -1])))
        return json.dumps(valid).encode()
    if choice == "raw":
        text = json.dumps(valid)
        return draw(
            st.sampled_from(
                [
                    ("{" + '"OrderID": "other", ' + text[1:]).encode(),
                    text.replace('"Attempt": 1', '"Attempt": NaN').encode(),
                    b"[" * 100 + b"]" * 100,
                    text.encode()[: len(text) // 2],
                ]
            )
        )
    return json.dumps(draw(json_values)).encode()


@pytest.fixture
async def agent_processor(bus):
    from adapters.servicebus import ServiceBusPublisher

    clock = FakeClock()
    processor = RequestProcessor(
        Agent(FakeRemote(clock), clock, POLICY),
        ServiceBusReplySender(bus.client, "agent-responses"),
        Alerts(ServiceBusPublisher(bus.client)),
        keys=KEYS.agents,
    )
    _PROCESSOR.append(processor)
    yield processor
    _PROCESSOR.remove(processor)


@SETTINGS
@given(data=st.data())
async def test_every_agent_request_is_answered_or_dead_lettered_with_a_reason(
    bus, agent_processor, data
):
    dead: dict[str, str] = {}
    requests = await bus.queue("agent-requests")
    order_id = f"R-{uuid.uuid4().hex[:12]}"
    body = data.draw(request_bodies(order_id), label="body")
    kind = data.draw(st.sampled_from(BODY_KINDS), label="kind")
    message_id = f"req-{uuid.uuid4().hex}"
    call = await requests.deliver(
        amqp_message(body, kind, message_id, data.draw(application_properties)), AGENT
    )
    if call[0] == "complete":
        request = decode(AgentRequest, body)
        assert oracle_accepts_text(body)
        # the processor awaited the reply's send before it settled
        replies = [r for r in await bus.arrived("agent-responses") if r.get("OrderID") == order_id]
        assert [r["OrderID"] for r in replies] == [request.OrderID]
    else:
        assert call[0] == "deadletter", call
        assert call[1] in DOCUMENTED_REASONS, call
        replies = await bus.arrived("agent-responses")
        assert [r for r in replies if r.get("OrderID") == order_id] == []
        dead[message_id] = call[1]
    check_dead_letters_alerted(dead, await alerts_by_message_id(bus, agent_processor))


# --- agent responses -----------------------------------------------------------------


class RecordingDurableClient:
    """The durable client's raise_event, recorded; some instances are gone."""

    def __init__(self) -> None:
        self.raised: list[tuple[str, str, dict]] = []

    async def raise_event(self, instance_id: str, event_name: str, event_data: Any = None) -> None:
        if instance_id.endswith(":3"):
            raise Exception(f"No instance with ID '{instance_id}' found.")
        self.raised.append((instance_id, event_name, event_data))


@st.composite
def reply_bodies(draw, order_id: str) -> bytes:
    attempt = draw(st.integers(1, 3))
    base = {
        "InstanceId": f"{order_id}:{attempt}",
        "OrderID": order_id,
        "Step": "charge-payment",
        "Action": "do",
        "Attempt": attempt,
        "EventName": f"reply-charge-payment-{attempt}",
        "EventId": f"{order_id}:{attempt}/reply",
        "Outcome": "ok",
        "Result": {"Reference": "R-1"},
        "Error": None,
    }
    choice = draw(st.sampled_from(["valid", "valid-error", "spoil", "other-order", "any"]))
    if choice == "valid-error":
        base.update(Outcome="permanent", Result=None, Error="card declined")
    if choice != "any":
        # As an agent sends it: the request's token, the agent's signature.
        base = signed_reply(AgentReply.model_validate(base)).model_dump(mode="json")
    if choice == "spoil":
        key = draw(st.sampled_from([*sorted(base), "Extra"]))
        base[key] = draw(st.one_of(hostile_text, json_values, st.sampled_from([1.0, True, 0])))
    elif choice == "other-order":
        base["InstanceId"] = f"Q-{uuid.uuid4().hex[:8]}:1"
    elif choice == "any":
        return json.dumps(draw(json_values)).encode()
    return json.dumps(base).encode()


@SETTINGS
@given(data=st.data())
async def test_every_agent_reply_reaches_the_workflow_valid_or_is_dead_lettered(bus, data):
    client = RecordingDurableClient()
    dead: dict[str, str] = {}
    responses = await bus.queue("agent-responses")
    order_id = f"B-{uuid.uuid4().hex[:12]}"
    body = data.draw(reply_bodies(order_id), label="body")
    kind = data.draw(st.sampled_from(BODY_KINDS), label="kind")
    message_id = f"rep-{uuid.uuid4().hex}"
    call = await responses.deliver(
        amqp_message(body, kind, message_id, data.draw(application_properties)),
        BRIDGE,
        client=client,
    )
    if call[0] == "complete":
        reply = decode(AgentReply, body)
        assert oracle_accepts_text(body)
        if not reply.InstanceId.endswith(":3"):
            [(instance, event, payload)] = client.raised
            assert (instance, event) == (reply.InstanceId, reply.EventName)
            # The reply as the bridge raises it (orchestrators.contracts.event_payload,
            # ADR 021h): its answer as sent, on the instance and under the event name
            # its checked token binds, without that identity or its seal.
            assert payload == event_payload(reply)
            # A workflow reads of it what it read of the whole reply before.
            whole = reply.model_dump(mode="json", exclude={"ReplyToken", "Signature"})
            was, now = reply_from_event(whole), reply_from_event(payload)
            assert (now.Outcome, now.Error, now.Calls) == (was.Outcome, was.Error, was.Calls)
            assert (now.Result or {}).get("Reference") == (was.Result or {}).get("Reference")
    else:
        assert call[0] == "deadletter", call
        assert call[1] in DOCUMENTED_REASONS, call
        assert client.raised == [], "a refused reply never reaches the workflow"
        dead[message_id] = call[1]
    check_dead_letters_alerted(
        dead, await alerts_by_message_id(bus, ROOT.alerts_over((await ROOT.container()).publisher))
    )


# --- the boundary alone, fast: many more examples -------------------------------------


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_decode_refuses_with_validation_failed_or_returns_a_valid_order(data):
    body = data.draw(order_bodies("ORD-1"))
    try:
        order = decode(OrderSubmitted, body)
    except ValidationFailed as exc:
        reason = exc.reason
    else:
        reason = None
    if reason is not None:
        assert reason.startswith("OrderSubmitted: ")
        return
    assert oracle_accepts_text(body)
    assert order.SchemaVersion == 1
    assert type(order.SchemaVersion) is int
