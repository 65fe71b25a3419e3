"""Every console route answers 403 unless CONSOLE_AUTH_CONFIRMED says
authentication was checked on the deployment (App Service authentication in
Azure) or CONSOLE_LOCAL_MODE is on outside Azure, and with authentication
confirmed refuses a request without its principal header (401), reads as
much as actions; local mode answers loopback addresses only. The
reply-queue peek and the reply queues' dead letters are left out there,
since the app may not read a client's reply queue."""

from __future__ import annotations

import base64
import inspect
import json
from typing import ClassVar

import azure.functions as func
import pytest

import bootstrap
import triggers.console as console_functions
from adapters.settings import AZURE_HINTS
from console import views
from console.security import (
    AUTH_CONFIRMED_SETTING,
    CLAIMS_HEADER,
    LOCAL_MODE_SETTING,
    OPERATOR_ROLE_SETTING,
    OPERATORS_SETTING,
    PRINCIPAL_HEADER,
    PRINCIPAL_ID_HEADER,
)
from tests.console.conftest import pending


class _Deps:
    """What the console's pages get from the root in this test (its
    `console_deps` override): set per test."""

    provider = None


async def _test_deps(durable=None):
    return await _Deps.provider(durable=durable)


BP = console_functions.blueprint(
    bootstrap.build(overrides=bootstrap.Overrides(console_deps=_test_deps))
)

ROUTES = [b._function for b in BP._function_builders]


def _request(
    route: str, headers: dict[str, str], host: str = "https://orders.example.net"
) -> func.HttpRequest:
    path = "/api/" + (
        route.replace("{queue?}", "orders")
        .replace("{queue}", "orders")
        .replace("{sequence:int}", "7")
        .replace("{order_id}", "O-1")
        .replace("{action:alpha}", "resubmit")
    )
    return func.HttpRequest(
        method="GET",
        url=f"{host}{path}",
        headers=headers,
        params={},
        route_params={"order_id": "O-1", "action": "resubmit", "queue": "orders", "sequence": "7"},
        body=b"",
    )


def _route_from_json(fn) -> str:
    return next(
        b["route"]
        for b in json.loads(fn.get_function_json())["bindings"]
        if b["type"] == "httpTrigger"
    )


async def _call(fn, req: func.HttpRequest) -> func.HttpResponse:
    # The durable client input wraps the function; the guard runs before the client is used.
    user = inspect.unwrap(fn.get_user_function())
    extra = {name: None for name in inspect.signature(user).parameters if name != "req"}
    return await user(req, **extra)


def test_every_console_route_is_covered():
    assert len(ROUTES) == 14
    assert all(_route_from_json(fn).startswith("console") for fn in ROUTES)


@pytest.mark.parametrize("hint", AZURE_HINTS)
@pytest.mark.parametrize("fn", ROUTES, ids=lambda fn: fn.get_function_name())
async def test_in_azure_every_route_refuses_a_request_without_a_principal(fn, hint, monkeypatch):
    for name in AZURE_HINTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(hint, "set-by-the-platform")
    monkeypatch.setenv(AUTH_CONFIRMED_SETTING, "true")
    # A header with nothing in it is no principal either.
    for headers in ({}, {PRINCIPAL_HEADER: "  "}):
        response = await _call(fn, _request(_route_from_json(fn), headers))
        assert response.status_code == 401, (fn.get_function_name(), headers)
        body = response.get_body().decode()
        assert "sign in" in body
        # back to the console's path after sign-in: no URL built from the Host header
        assert 'href="/.auth/login/aad?post_login_redirect_uri=%2Fapi%2Fconsole"' in body
        assert "orders.example.net" not in body
        # Refused before anything was read: no cost footer, no data.
        assert "O-1" not in body or fn.get_function_name() in (
            "console_action",
            "console_order",
            "console_find",
        )


def _in_azure(monkeypatch, hint: str, confirmed: str | None) -> None:
    for name in AZURE_HINTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(hint, "set-by-the-platform")
    if confirmed is None:
        monkeypatch.delenv(AUTH_CONFIRMED_SETTING, raising=False)
    else:
        monkeypatch.setenv(AUTH_CONFIRMED_SETTING, confirmed)


@pytest.mark.parametrize("confirmed", [None, "", "false", "no", "yes", "1", "ture"])
@pytest.mark.parametrize("hint", AZURE_HINTS)
@pytest.mark.parametrize("fn", ROUTES, ids=lambda fn: fn.get_function_name())
async def test_in_azure_every_route_is_off_until_authentication_is_confirmed(
    fn, hint, confirmed, monkeypatch
):
    """Even with a principal header (forgeable where the platform does not
    enforce authentication), nothing is shown or done: 403 before any read.
    Only a clear "true" turns the console on; local mode does not, in Azure."""
    _in_azure(monkeypatch, hint, confirmed)
    monkeypatch.setenv(LOCAL_MODE_SETTING, "true")

    async def no_reads(*args, **kwargs):
        raise AssertionError("the disabled console must not read anything")

    monkeypatch.setattr(_Deps, "provider", no_reads)
    for headers in ({}, {PRINCIPAL_HEADER: "eve"}):
        response = await _call(fn, _request(_route_from_json(fn), headers))
        assert response.status_code == 403, (fn.get_function_name(), headers, confirmed)
        body = response.get_body().decode()
        assert AUTH_CONFIRMED_SETTING in body
        assert "eve" not in body
        assert "O-1" not in body
        assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")


OPS_ID = "0b6a1f2e-0000-4000-8000-000000000001"
OPS = {PRINCIPAL_HEADER: "ops@example.net", PRINCIPAL_ID_HEADER: OPS_ID}


@pytest.mark.parametrize("confirmed", ["true", "TRUE", " True "])
async def test_in_azure_a_confirmed_console_answers_a_signed_in_operator(confirmed, monkeypatch):
    _in_azure(monkeypatch, AZURE_HINTS[0], confirmed)
    monkeypatch.setenv(OPERATORS_SETTING, f"someone-else, {OPS_ID.upper()}")
    fn = next(f for f in ROUTES if f.get_function_name() == "console_static")
    assert (await _call(fn, _request("console/static/console.css", OPS))).status_code == 200
    assert (await _call(fn, _request("console/static/console.css", {}))).status_code == 401


def _claims(*roles: str, role_typ: str = "roles") -> str:
    principal = {
        "auth_typ": "aad",
        "name_typ": "name",
        "role_typ": role_typ,
        "claims": [{"typ": "name", "val": "Ops"}, *({"typ": role_typ, "val": r} for r in roles)],
    }
    return base64.b64encode(json.dumps(principal).encode()).decode()


@pytest.mark.parametrize(
    ("env", "headers", "status"),
    [
        # neither list nor role configured: nobody operates, whatever the proxy sent
        ({}, OPS, 403),
        ({OPERATORS_SETTING: OPS_ID}, OPS, 200),
        ({OPERATORS_SETTING: OPS_ID}, {PRINCIPAL_HEADER: "ops@example.net"}, 403),  # no id
        ({OPERATORS_SETTING: OPS_ID}, {**OPS, PRINCIPAL_ID_HEADER: "another-id"}, 403),
        ({OPERATOR_ROLE_SETTING: "Console.Operate"}, OPS, 403),  # no role claim
        ({OPERATOR_ROLE_SETTING: "Console.Operate"}, {**OPS, CLAIMS_HEADER: _claims("X")}, 403),
        (
            {OPERATOR_ROLE_SETTING: "Console.Operate"},
            {**OPS, CLAIMS_HEADER: _claims("Reader", "Console.Operate")},
            200,
        ),
        (
            {OPERATOR_ROLE_SETTING: "Console.Operate"},
            {
                **OPS,
                CLAIMS_HEADER: _claims(
                    "Console.Operate",
                    role_typ="http://schemas.microsoft.com/ws/2008/06/identity/claims/role",
                ),
            },
            200,
        ),
        ({OPERATOR_ROLE_SETTING: "Console.Operate"}, {**OPS, CLAIMS_HEADER: "%%%"}, 403),
        # a group on the list, named in the token's groups claim
        (
            {OPERATORS_SETTING: "ops-group-id"},
            {**OPS, CLAIMS_HEADER: _claims("ops-group-id", role_typ="groups")},
            200,
        ),
    ],
)
async def test_the_app_admits_only_its_configured_operators(env, headers, status, monkeypatch):
    """Issue 45: the principal header alone does not make an operator; the
    app's own list (principal ids) or app role must admit it."""
    _in_azure(monkeypatch, AZURE_HINTS[0], "true")
    for name in (OPERATORS_SETTING, OPERATOR_ROLE_SETTING):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    async def no_reads(*args, **kwargs):
        raise AssertionError("a refused operator must not read anything")

    monkeypatch.setattr(_Deps, "provider", no_reads)
    fn = next(f for f in ROUTES if f.get_function_name() == "console_static")
    response = await _call(fn, _request("console/static/console.css", headers))
    assert response.status_code == status, response.get_body()
    if status == 403:
        body = response.get_body().decode()
        assert OPERATORS_SETTING in body
        assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
    for route in ("console", "console/orders/{order_id}/{action:alpha}"):
        fn = next(f for f in ROUTES if _route_from_json(f) == route)
        if status == 403:
            assert (await _call(fn, _request(route, headers))).status_code == 403


def _off_azure(monkeypatch, local: str | None, confirmed: str | None = None) -> None:
    for name in (*AZURE_HINTS, LOCAL_MODE_SETTING, AUTH_CONFIRMED_SETTING):
        monkeypatch.delenv(name, raising=False)
    if local is not None:
        monkeypatch.setenv(LOCAL_MODE_SETTING, local)
    if confirmed is not None:
        monkeypatch.setenv(AUTH_CONFIRMED_SETTING, confirmed)


@pytest.mark.parametrize("local", [None, "", "false", "1", "yes"])
@pytest.mark.parametrize("fn", ROUTES, ids=lambda fn: fn.get_function_name())
async def test_outside_azure_the_console_fails_closed_without_local_mode(fn, local, monkeypatch):
    """A container or Kubernetes deploy (no Azure hint) is not "local": without
    local mode or confirmed authentication every route answers 403, reading nothing."""
    _off_azure(monkeypatch, local)

    async def no_reads(*args, **kwargs):
        raise AssertionError("the disabled console must not read anything")

    monkeypatch.setattr(_Deps, "provider", no_reads)
    for host in ("http://127.0.0.1:7071", "https://orders.example.net"):
        response = await _call(fn, _request(_route_from_json(fn), {}, host))
        assert response.status_code == 403, (fn.get_function_name(), local, host)
        assert LOCAL_MODE_SETTING in response.get_body().decode()
        assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")


async def test_outside_azure_confirmed_authentication_needs_the_principal(monkeypatch):
    _off_azure(monkeypatch, None, confirmed="true")
    monkeypatch.setenv(OPERATORS_SETTING, OPS_ID)
    fn = next(f for f in ROUTES if f.get_function_name() == "console_static")
    assert (await _call(fn, _request("console/static/console.css", {}))).status_code == 401
    assert (await _call(fn, _request("console/static/console.css", OPS))).status_code == 200


@pytest.mark.parametrize("fn", ROUTES, ids=lambda fn: fn.get_function_name())
async def test_local_mode_answers_loopback_only(fn, monkeypatch):
    _off_azure(monkeypatch, "true")

    async def no_reads(*args, **kwargs):
        raise AssertionError("a refused request must not read anything")

    monkeypatch.setattr(_Deps, "provider", no_reads)
    for host in ("http://evil.example.com:7071", "http://192.168.1.20:7071"):
        response = await _call(fn, _request(_route_from_json(fn), {}, host))
        assert response.status_code == 403, (fn.get_function_name(), host)
        assert "loopback" in response.get_body().decode()


async def test_in_local_mode_the_console_is_on_without_sign_in(monkeypatch):
    _off_azure(monkeypatch, "true")
    fn = next(f for f in ROUTES if f.get_function_name() == "console_static")
    response = await _call(fn, _request("console/static/console.css", {}, "http://127.0.0.1:7071"))
    assert response.status_code == 200


async def test_locally_the_stylesheet_is_served_from_memory(monkeypatch, tmp_path):
    _off_azure(monkeypatch, "true")
    fn = next(f for f in ROUTES if f.get_function_name() == "console_static")
    # The file is not read per request: moving the package's directory away changes nothing.
    monkeypatch.setattr(console_functions, "HERE", tmp_path)
    response = await _call(fn, _request("console/static/console.css", {}, "http://127.0.0.1:7071"))
    assert response.status_code == 200
    assert response.mimetype == "text/css"
    assert (
        response.get_body()
        == (
            console_functions.Path(console_functions.console.__file__).parent
            / "static"
            / "console.css"
        ).read_bytes()
    )


def _page(deps, route: str, template: str, page: str, **context) -> str:
    """A console page as the function renders it."""
    return (
        console_functions._render(_request(route, {}), template, deps, page=page, **context)
        .get_body()
        .decode()
    )


async def test_in_azure_the_order_page_peeks_no_reply_queue(deps, now):
    class Peeker:
        asked: ClassVar[list[str]] = []

        async def peek(self, queue, limit, dead_letter=False, from_sequence=None):
            self.asked.append(queue)
            return []

    record = pending("AZ-1", now)
    await deps.store.create_if_absent(record)
    deps.servicebus = Peeker()
    deps.azure = True
    data = await views.order_detail(deps, "AZ-1")
    assert Peeker.asked == []
    assert data["status_messages"]["messages"] == []
    assert not data["status_messages"]["local_only"]
    assert "replies-webshop" not in deps.queues()
    assert "alerts" in deps.queues()

    html = _page(deps, "console/orders/{order_id}", "order.html", "orders", done=None, **data)
    assert "only the application may read" in html
    assert "local only" not in html
    dead = await views.dead_letters(deps, None, None)
    assert list(dead["per_queue"]) == list(views.WORK_QUEUES)
    assert dead["replies_left_out"]
    html = _page(deps, "console/deadletters", "deadletters.html", "deadletters", **dead)
    assert 'id="replies-left-out"' in html
    assert "replies-webshop" not in html
    with pytest.raises(views.BadRequest):
        await views.dead_letters(deps, "replies-webshop", None)
    assert Peeker.asked.count("replies-webshop") == 0

    deps.azure = False
    Peeker.asked.clear()
    data = await views.order_detail(deps, "AZ-1")
    assert Peeker.asked == ["replies-webshop"]
    assert data["status_messages"]["local_only"]
    assert "replies-webshop" in deps.queues()
    html = _page(deps, "console/orders/{order_id}", "order.html", "orders", done=None, **data)
    assert "local only" in html
