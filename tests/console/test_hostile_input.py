"""What a hostile or careless caller can send the console: query parameters
out of every bound, page tokens that decode to anything, a replayed
confirmation, another site's Origin; and what a hostile sender can leave on a
dead-letter queue: any AMQP body kind, JSON nested 10,000 deep. Each is
answered 400/403 with a message and the security headers, never 500, and a
dead-letter page always renders. Property-based where the input space is
open (Hypothesis), against the real Cosmos server and Service Bus emulator
where a server is involved."""

from __future__ import annotations

import base64
import html
import inspect
import json
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from urllib.parse import urlencode

import azure.functions as func
import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.amqp import AmqpAnnotatedMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bootstrap
import triggers.console as console_functions
from adapters.settings import AZURE_HINTS
from console import views
from console.peek import QueuePeeker
from console.security import AUTH_CONFIRMED_SETTING, LOCAL_MODE_SETTING
from domain import state_machine as sm
from tests.console.conftest import errored_by_supervisor
from tests.console.conftest import settings as console_settings

HOST = "http://127.0.0.1:7071"


class _Deps:
    """What the console's pages get from the root in this test (its
    `console_deps` override): set per test."""

    provider = None


async def _test_deps(durable=None):
    return await _Deps.provider(durable=durable)


BP = console_functions.blueprint(
    bootstrap.build(overrides=bootstrap.Overrides(console_deps=_test_deps))
)

ROUTES = {b._function.get_function_name(): b._function for b in BP._function_builders}


def _b64(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.fixture
def local(monkeypatch, deps):
    """Local mode, with the console's views reading the test's real stores."""
    for name in (*AZURE_HINTS, AUTH_CONFIRMED_SETTING):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(LOCAL_MODE_SETTING, "true")
    monkeypatch.setenv("CONSOLE_CSRF_SECRET", "test-secret")

    async def real_deps(durable=None):
        deps.durable = durable
        return deps

    monkeypatch.setattr(_Deps, "provider", real_deps)
    return deps


def _request(
    method: str,
    path: str,
    params: dict[str, str] | None = None,
    route: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    host: str = HOST,
) -> func.HttpRequest:
    query = f"?{urlencode(params)}" if params else ""
    return func.HttpRequest(
        method=method,
        url=f"{host}/api/console{path}{query}",
        headers=headers or {},
        params=params or {},
        route_params=route or {},
        body=body,
    )


async def _call(name: str, req: func.HttpRequest) -> func.HttpResponse:
    user = inspect.unwrap(ROUTES[name].get_user_function())
    extra = {p: None for p in inspect.signature(user).parameters if p != "req"}
    return await user(req, **extra)


def _refused_with_a_message(response: func.HttpResponse, status: int) -> str:
    body = html.unescape(response.get_body().decode())
    assert response.status_code == status, body
    assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert 'id="error-message"' in body
    return body


# --- query parameters --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "path", "params", "route", "says"),
    [
        ("console_orders", "/orders", {"older": "99999999999"}, {}, "'older'"),
        ("console_orders", "/orders", {"older": "1" + "0" * 30}, {}, "'older'"),
        ("console_orders", "/orders", {"older": "10**30"}, {}, "'older'"),
        ("console_orders", "/orders", {"older": "0"}, {}, "'older'"),
        ("console_orders", "/orders", {"older": "²"}, {}, "'older'"),
        ("console_orders", "/orders", {"page": _b64([1])}, {}, "page token"),
        ("console_orders", "/orders", {"page": _b64(1)}, {}, "page token"),
        ("console_orders", "/orders", {"page": "%%%"}, {}, "page token"),
        ("console_orders", "/orders", {"page": "x" * 600}, {}, "page token"),
        ("console_orders", "/orders", {"state": "Nope"}, {}, "unknown state"),
        ("console_orders", "/orders", {"app": "<b>"}, {}, "application id"),
        ("console_stuck", "/stuck", {"page": _b64([1])}, {}, "page token"),
        ("console_stuck", "/stuck", {"page": _b64(1)}, {}, "page token"),
        ("console_alerts", "/alerts", {"from": "²"}, {}, "'from'"),
        ("console_alerts", "/alerts", {"from": "99999999999999999999"}, {}, "'from'"),
        ("console_alerts", "/alerts", {"from": "-1"}, {}, "'from'"),
        (
            "console_deadletters",
            "/deadletters/alerts",
            {"from": "²"},
            {"queue": "alerts"},
            "'from'",
        ),
        ("console_deadletters", "/deadletters", {"from": "٣"}, {}, "'from'"),
    ],
)
async def test_out_of_bounds_parameters_answer_400_with_a_message(
    local, name, path, params, route, says
):
    response = await _call(name, _request("GET", path, params, route))
    assert says in _refused_with_a_message(response, 400)


async def test_an_unknown_dead_letter_queue_is_404(local):
    response = await _call(
        "console_deadletters", _request("GET", "/deadletters/nope", route={"queue": "nope"})
    )
    _refused_with_a_message(response, 404)


_text = st.text(st.characters(codec="utf-8"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["state", "app", "older", "newer", "prefix", "customer", "page", "other"]),
        st.one_of(
            _text,
            st.integers(-(10**40), 10**40).map(str),
            st.sampled_from(["Error", "Processed", "webshop", "²", "10**30"]),
            st.recursive(
                st.none() | st.integers() | st.text(max_size=5),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3)
                ),
                max_leaves=6,
            ).map(_b64),
        ),
    )
)
def test_any_orders_query_is_parsed_or_refused_with_bad_request(params):
    """The whole input space of the orders list: parse_filters returns bounded
    values or raises BadRequest; nothing else escapes (a 500)."""
    try:
        filters = views.parse_filters(params)
    except views.BadRequest as exc:
        refused = str(exc)
    else:
        refused = None
    if refused is not None:
        assert refused
        return
    assert filters["state"] in [*views.STATES, views.ANY_STATE]
    assert filters["older"] is None or 1 <= filters["older"] <= views.MAX_OLDER_MINUTES
    assert filters["newer"] is None or 1 <= filters["newer"] <= views.MAX_OLDER_MINUTES
    assert filters["prefix"] is None or views._ORDER_ID_PREFIX.fullmatch(filters["prefix"])
    assert filters["customer"] is None or len(filters["customer"]) <= 64
    # the bound is one that date arithmetic takes
    if filters["older"]:
        datetime.now(UTC) - __import__("datetime").timedelta(minutes=filters["older"])
    if filters["page"] is not None:
        assert isinstance(views.decode_page_token(filters["page"]), str)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), _text, st.integers(-(10**30), 10**30).map(str)))
def test_any_from_parameter_is_a_bounded_sequence_or_refused(raw):
    try:
        value = views.parse_sequence(raw)
    except views.BadRequest as exc:
        refused = str(exc)
    else:
        refused = None
    if refused is not None:
        assert "'from'" in refused
        return
    assert value is None or 0 <= value <= views.MAX_SEQUENCE


# --- actions: single use, origin, redirects ------------------------------------------------


async def _confirm_then_post(action: str, order_id: str, headers: dict[str, str] | None = None):
    route = {"order_id": order_id, "action": action}
    page = await _call(
        "console_action", _request("GET", f"/orders/{order_id}/{action}", route=route)
    )
    assert page.status_code == 200, page.get_body()
    form = page.get_body().decode()
    token = form.split('name="csrf" value="', 1)[1].split('"', 1)[0]

    async def post(extra: dict[str, str] | None = None) -> func.HttpResponse:
        return await _call(
            "console_action",
            _request(
                "POST",
                f"/orders/{order_id}/{action}",
                route=route,
                headers={
                    "Origin": HOST,
                    "Sec-Fetch-Site": "same-origin",
                    **(headers or {}),
                    **(extra or {}),
                },
                body=urlencode({"csrf": token, "reason": "cause fixed"}).encode(),
            ),
        )

    return form, post


async def test_a_compensate_confirmation_acts_once_and_its_replay_is_refused(local, now):
    record = errored_by_supervisor("RP-1", now)
    await local.store.create_if_absent(record)
    form, post = await _confirm_then_post("compensate", "RP-1")
    assert 'action="/api/console/orders/RP-1/compensate"' in form  # a path, not a URL
    first = await post()
    assert first.status_code == 303
    # Post/Redirect/Get to a path: no URL built from the Host header
    assert first.headers["Location"] == "/api/console/orders/RP-1?done=compensate"
    after, _ = await local.store.read("RP-1")
    assert after.CompensationRequested
    # The order is still Error, so the transition itself would be taken again
    # (request_compensation accepts a repeat): only the token stops the replay.
    sm.request_compensation(after, now, by="operator:local")
    replay = await post()
    assert "already used" in _refused_with_a_message(replay, 403)
    final, _ = await local.store.read("RP-1")
    assert sum(1 for h in final.History if h.By == "operator:local") == 1


async def test_a_resubmit_confirmation_acts_once(local, now):
    record = errored_by_supervisor("RP-2", now)
    await local.store.create_if_absent(record)
    _, post = await _confirm_then_post("resubmit", "RP-2")
    assert (await post()).status_code == 303
    replay = await post()
    _refused_with_a_message(replay, 403)
    final, _ = await local.store.read("RP-2")
    assert sum(1 for h in final.History if h.By == "operator:local") == 1


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example.com"},
        {"Origin": "https://evil.example.com", "Host": "evil.example.com"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "https://127.0.0.1:7071"},  # the local host serves no https
        {"Origin": "http://127.0.0.1:8000"},  # another local server
        {"Origin": "http://localhost:7071", "Sec-Fetch-Site": "same-site"},
    ],
)
async def test_a_valid_token_from_another_origin_does_nothing(local, now, headers):
    oid = f"OR-{uuid.uuid4().hex[:6]}"
    await local.store.create_if_absent(errored_by_supervisor(oid, now))
    _, post = await _confirm_then_post("resubmit", oid, headers=headers)
    _refused_with_a_message(await post(), 403)
    record, _ = await local.store.read(oid)
    assert not any(h.By.startswith("operator:") for h in record.History)


# --- dead letters: any body renders -----------------------------------------------------

DEEP = "[" * 10_000 + "]" * 10_000


def _fake(body, body_type="data", **extra):
    """A peeked message as console.views reads it (its attributes only)."""
    return SimpleNamespace(
        body=body,
        body_type=SimpleNamespace(value=body_type),
        message_id=extra.get("message_id", "m"),
        sequence_number=extra.get("sequence_number", 1),
        enqueued_time_utc=extra.get("enqueued", datetime.now(UTC)),
        dead_letter_reason=extra.get("reason", "InvalidMessage"),
        dead_letter_error_description=extra.get("description"),
        delivery_count=extra.get("delivery_count", 1),
        application_properties=extra.get("properties"),
    )


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_anything = st.one_of(
    _json_values,
    st.binary(max_size=200),
    st.builds(lambda n: "[" * n + "]" * n, st.integers(0, 20_000)),
    st.builds(lambda n: '{"a":' * n + "1" + "}" * n, st.integers(0, 5_000)),
)


def _render_dead_letters(messages: list[dict]) -> str:
    req = _request("GET", "/deadletters/alerts")
    return (
        console_functions._render(
            req,
            "deadletters.html",
            None,
            page="deadletters",
            queues=["alerts"],
            queue="alerts",
            replies_left_out=False,
            counts={"alerts": {"count": len(messages), "more": False}},
            peeked={"messages": messages, "error": None, "next": None},
        )
        .get_body()
        .decode()
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=_anything,
    body_type=st.sampled_from(["data", "value", "sequence", "weird"]),
    wrap=st.sampled_from(["as-is", "sections", "bytes"]),
    props=st.one_of(
        st.none(),
        st.dictionaries(
            st.one_of(st.text(max_size=5), st.binary(max_size=5)), _json_values, max_size=3
        ),
    ),
    message_id=st.one_of(st.none(), st.text(max_size=10), st.integers(), st.uuids()),
)
def test_any_dead_letter_renders(body, body_type, wrap, props, message_id):
    if wrap == "bytes" and isinstance(body, str):
        body = body.encode()
    if wrap == "sections" and isinstance(body, bytes | str):
        body = iter([body])
    if body_type == "sequence" and not isinstance(body, bytes | str):
        body = iter([body if isinstance(body, list) else [body]])
    message = views.message_view(
        _fake(body, body_type, properties=props, message_id=message_id), 400
    )
    assert isinstance(message["body"], str)
    assert len(message["body"]) <= 401
    page = _render_dead_letters([message])
    assert "<script" not in page.lower()


def test_a_body_that_raises_when_read_renders_as_unreadable():
    class Broken:
        @property
        def body(self):
            raise RuntimeError("decoder exploded")

        body_type = SimpleNamespace(value="data")
        message_id = "b"
        sequence_number = 7
        enqueued_time_utc = None
        dead_letter_reason = "X"
        dead_letter_error_description = None
        delivery_count = 1
        application_properties = None

    message = views.message_view(Broken(), 400)
    assert message["note"] == "body unreadable (RuntimeError)"
    assert message["sequence"] == 7
    assert "body unreadable" in _render_dead_letters([message])


async def test_the_dead_letter_page_renders_every_amqp_body_kind_from_the_emulator(
    servicebus_emulator,
):
    """The bodies the boundary refuses, really on a dead-letter queue: nested
    10,000 deep, AMQP value null/int/list/map, a sequence of ints. The page
    shows each, and paging past them works."""
    queue = f"console-dlq-{uuid.uuid4().hex[:8]}"
    emulator = servicebus_emulator.start({queue: {"MaxDeliveryCount": 3, "LockDuration": "PT5S"}})
    sent = {
        "deep": ServiceBusMessage(DEEP, message_id="deep"),
        "value-int": AmqpAnnotatedMessage(value_body=42, properties={"message_id": "value-int"}),
        "value-list": AmqpAnnotatedMessage(
            value_body=[1, [2, None]], properties={"message_id": "value-list"}
        ),
        "value-map": AmqpAnnotatedMessage(
            value_body={"a": {"b": 1}}, properties={"message_id": "value-map"}
        ),
        "sequence": AmqpAnnotatedMessage(
            sequence_body=[[1, 2, 3]], properties={"message_id": "sequence"}
        ),
        "value-null": AmqpAnnotatedMessage(
            value_body=None, properties={"message_id": "value-null"}
        ),
        "ok": ServiceBusMessage(json.dumps({"OrderID": "O-9"}), message_id="ok"),
    }
    async with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        async with client.get_queue_sender(queue) as sender:
            for message in sent.values():
                await sender.send_messages(message)
        async with client.get_queue_receiver(queue) as receiver:
            got = []
            for _ in range(10):
                got += await receiver.receive_messages(max_message_count=10, max_wait_time=2)
                if len(got) >= len(sent):
                    break
            for m in got:
                await receiver.dead_letter_message(
                    m, reason="InvalidMessage", error_description="refused"
                )
        peeker = QueuePeeker(client)
        deps = views.Deps(
            settings=console_settings(), store=None, reads=None, orders=None, servicebus=peeker
        )
        try:
            first = await views.peek(deps, queue, limit=4, dead_letter=True)
            rest = await views.peek(
                deps, queue, limit=4, dead_letter=True, from_sequence=first["next"]
            )
        finally:
            await peeker.close()
    shown = {m["id"]: m for m in first["messages"] + rest["messages"]}
    assert set(shown) == set(sent)
    assert "nested deeper than" in shown["deep"]["note"]
    assert shown["value-int"]["body"] == "42"
    assert "AMQP value body" in shown["value-map"]["note"]
    assert "AMQP sequence body" in shown["sequence"]["note"]
    assert '"OrderID": "O-9"' in shown["ok"]["body"]
    page = _render_dead_letters(first["messages"] + rest["messages"])
    for mid in sent:
        assert mid in page


async def test_anything_unforeseen_is_a_500_page_with_the_security_headers(local, monkeypatch):
    async def broken(deps):
        raise RuntimeError("a bug")

    monkeypatch.setattr(views, "overview", broken)
    response = await _call("console_overview", _request("GET", ""))
    body = _refused_with_a_message(response, 500)
    assert "a bug" not in body  # the log has it, not the page
