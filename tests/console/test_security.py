"""Who acts, the confirmation form's CSRF token, and payment-data redaction."""

from __future__ import annotations

import pytest

from adapters.settings import AZURE_HINTS
from console import security

URL = "https://orders.example.net/api/console/orders/O-1/resubmit"
LOCAL = {"CONSOLE_LOCAL_MODE": "true"}
V = "2026-01-01T12:00:00+00:00\x1eError\x1e2\x1eFalse"  # a record version
# The console's own origin, configured: never taken from the request's Host.
PUBLIC = {
    "CONSOLE_CSRF_SECRET": "s3",
    "CONSOLE_PUBLIC_URL": "https://orders.example.net/api/console",
}


def test_operator_is_local_in_local_mode_only_and_the_principal_otherwise():
    assert security.operator({}, "http://127.0.0.1:7071/api/console", env=LOCAL) == "local"
    assert security.operator({}, "http://localhost:7071/api/console", env=LOCAL) == "local"
    assert security.operator({}, "http://[::1]:7071/api/console", env=LOCAL) == "local"
    signed_in = {
        "X-MS-CLIENT-PRINCIPAL-NAME": "ada@example.com",
        "X-MS-CLIENT-PRINCIPAL-ID": "id-1",
    }
    azure = {"WEBSITE_SITE_NAME": "app", "CONSOLE_OPERATORS": "id-1"}
    assert security.operator(signed_in, env=azure) == "ada@example.com"
    # signed in, but not on the app's own list: refused by the app, not only by the proxy
    with pytest.raises(security.Forbidden, match="not an operator"):
        security.operator(signed_in, env={**azure, "CONSOLE_OPERATORS": "id-2"})
    for env in ({"WEBSITE_SITE_NAME": "app"}, {}, {"CONSOLE_LOCAL_MODE": "yes"}):
        with pytest.raises(security.Unauthenticated):
            security.operator({}, "http://127.0.0.1:7071/api/console", env=env)
    # local mode is ignored in Azure
    with pytest.raises(security.Unauthenticated):
        security.operator(
            {}, "http://127.0.0.1:7071/api/console", env={**LOCAL, "WEBSITE_SITE_NAME": "app"}
        )


@pytest.mark.parametrize(
    "url", ["http://evil.example.com:7071/api/console", "http://10.0.0.5:7071/api/console", ""]
)
def test_local_mode_answers_loopback_addresses_only(url):
    """A DNS name pointed at 127.0.0.1 (rebinding) or a LAN address gets nothing."""
    with pytest.raises(security.Forbidden):
        security.operator({}, url, env=LOCAL)


def test_the_console_is_off_unless_local_mode_or_confirmed_authentication():
    assert not security.console_enabled({})
    assert not security.console_enabled({"CONSOLE_LOCAL_MODE": "1"})
    assert not security.console_enabled({**LOCAL, "IDENTITY_ENDPOINT": "x"})
    assert security.console_enabled(LOCAL)
    assert security.console_enabled({"CONSOLE_AUTH_CONFIRMED": "true"})
    assert security.console_enabled({"CONSOLE_AUTH_CONFIRMED": "true", "WEBSITE_SITE_NAME": "a"})


def test_links_are_paths_or_the_configured_url_never_the_host():
    url = "https://evil.example.com/api/console/orders/O-1"
    assert security.base_path(url, env={}) == "/api/console"
    assert security.base_path("http://h/console/x", env={}) == "/console"
    assert security.base_path(url, env=PUBLIC) == "https://orders.example.net/api/console"
    # a malformed setting is ignored, not trusted
    assert security.base_path(url, env={"CONSOLE_PUBLIC_URL": "javascript:alert(1)"}) == (
        "/api/console"
    )


def test_a_fresh_token_for_this_operator_order_action_and_version_passes():
    env = {"CONSOLE_CSRF_SECRET": "s3"}
    token = security.form_token("ada", "O-1", "resubmit", V, now=1000, env=env)
    security.check_csrf({}, {"csrf": token}, "ada", "O-1", "resubmit", V, now=1001, env=env)


@pytest.mark.parametrize(
    ("who", "order", "action", "version", "now", "secret"),
    [
        ("eve", "O-1", "resubmit", V, 1001, "s3"),  # another operator
        ("ada", "O-2", "resubmit", V, 1001, "s3"),  # another order
        ("ada", "O-1", "compensate", V, 1001, "s3"),  # another action
        ("ada", "O-1", "resubmit", V + "x", 1001, "s3"),  # the record changed: used already
        ("ada", "O-1", "resubmit", V, 1000 + security.TOKEN_LIFETIME + 1, "s3"),  # expired
        ("ada", "O-1", "resubmit", V, 1001, "other"),  # another app's secret
    ],
)
def test_a_token_for_anything_else_is_refused(who, order, action, version, now, secret):
    token = security.form_token(
        "ada", "O-1", "resubmit", V, now=1000, env={"CONSOLE_CSRF_SECRET": "s3"}
    )
    with pytest.raises(security.Forbidden):
        security.check_csrf(
            {},
            {"csrf": token},
            who,
            order,
            action,
            version,
            now=now,
            env={"CONSOLE_CSRF_SECRET": secret},
        )


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "https://evil.example.com"},
        {"Origin": "http://orders.example.net"},  # scheme differs
        {"Origin": "null"},  # a sandboxed frame of any site
        # Host and Origin both another site's: the Host is never what Origin is checked against
        {"Origin": "https://evil.example.com", "Host": "evil.example.com"},
        {"Origin": "http://127.0.0.1:7071"},  # loopback counts in local mode only
    ],
)
def test_cross_site_posts_are_refused_even_with_a_valid_token(headers):
    token = security.form_token("ada", "O-1", "resubmit", V, now=1000, env=PUBLIC)
    with pytest.raises(security.Forbidden):
        security.check_csrf(
            headers, {"csrf": token}, "ada", "O-1", "resubmit", V, now=1001, env=PUBLIC
        )


@pytest.mark.parametrize(
    ("headers", "env"),
    [
        ({"Origin": "https://orders.example.net", "Sec-Fetch-Site": "same-origin"}, PUBLIC),
        (
            {"Origin": "https://app-1.azurewebsites.net"},
            {
                "CONSOLE_CSRF_SECRET": "s3",
                "WEBSITE_SITE_NAME": "app-1",
                "WEBSITE_HOSTNAME": "app-1.azurewebsites.net",
            },
        ),
        ({"Origin": "http://127.0.0.1:7071"}, {"CONSOLE_CSRF_SECRET": "s3", **LOCAL}),
        ({}, PUBLIC),  # no Origin at all: the token alone
    ],
)
def test_same_origin_post_passes(headers, env):
    token = security.form_token("ada", "O-1", "resubmit", V, now=1000, env=env)
    security.check_csrf(headers, {"csrf": token}, "ada", "O-1", "resubmit", V, now=1001, env=env)


def test_without_a_known_origin_a_post_with_an_origin_is_refused():
    """Outside local mode and Azure, with no CONSOLE_PUBLIC_URL, nothing says
    which origin is ours: refused, and the message says what to set."""
    env = {"CONSOLE_CSRF_SECRET": "s3", "CONSOLE_AUTH_CONFIRMED": "true"}
    token = security.form_token("ada", "O-1", "resubmit", V, now=1000, env=env)
    with pytest.raises(security.Forbidden, match="CONSOLE_PUBLIC_URL"):
        security.check_csrf(
            {"Origin": "https://orders.example.net"},
            {"csrf": token},
            "ada",
            "O-1",
            "resubmit",
            V,
            now=1001,
            env=env,
        )


@pytest.mark.parametrize(
    "form", [{}, {"csrf": ""}, {"csrf": "nodot"}, {"csrf": "123.abc"}, {"csrf": "²³.abc"}]
)
def test_missing_or_forged_tokens_are_refused(form):
    with pytest.raises(security.Forbidden):
        security.check_csrf({}, form, "ada", "O-1", "resubmit", V)


def test_redact_drops_payment_fields_and_masks_card_numbers():
    value = {
        "OrderID": "O-1",
        "PaymentReference": "pay-1",
        "Customer": {"CardNumber": "x", "Name": "Ada"},
        "Note": "card 4111 1111 1111 1111 please",
        "Phone": "0049 30 1234567",
    }
    assert security.redact(value) == {
        "OrderID": "O-1",
        "Customer": {"Name": "Ada"},
        "Note": "card [redacted] please",
        "Phone": "0049 30 1234567",
    }
    assert (
        security.mask_card_numbers("4111111111111112") == "4111111111111112"
    )  # fails Luhn: not a card


def test_azure_is_any_of_its_hints_and_a_blank_principal_is_none():
    for hint in AZURE_HINTS:
        assert security.in_azure({hint: "x"})
        with pytest.raises(security.Unauthenticated):
            security.operator({"x-ms-client-principal-name": " "}, env={hint: "x", **LOCAL})
    assert not security.in_azure({})


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1111 declined",
        "pan=5500-0000-0000-0004;",
        "378282246310005",
        "maestro 6759 6498 2643 8453 ok",
        "twelve 123456789015 end",
    ],
)
def test_luhn_valid_runs_of_12_to_19_digits_are_masked(text):
    masked = security.mask_card_numbers(text)
    assert "[redacted]" in masked
    assert not any(ch.isdigit() for ch in masked.replace("[redacted]", ""))


def test_display_masking_leaves_marked_and_non_text_values_alone():
    from markupsafe import Markup

    assert security.mask_for_display("card 4111111111111111") == "card [redacted]"
    assert security.mask_for_display(security.Unmasked("4111111111111111")) == "4111111111111111"
    assert security.mask_for_display(4111111111111111) == 4111111111111111
    # Markup is a macro's output, each value in it finalized where it was
    # interpolated: passed as is (masked again, a form token broke)
    assert security.mask_for_display(Markup("<b>4111111111111111</b>")) == Markup(
        "<b>4111111111111111</b>"
    )
    assert security.mask_for_display("11 digits 12345678903") == "11 digits 12345678903"


def test_a_card_number_inside_a_macro_and_its_caller_is_masked_where_interpolated():
    from triggers.console import _env

    page = _env.from_string(
        "{% macro box(x) %}[{{ x }}|{{ caller() }}]{% endmacro %}"
        "{% call box(card) %}{{ card }}{% endcall %}"
    ).render(card="4111 1111 1111 1111")
    assert page == "[[redacted]|[redacted]]"


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://127.0.0.1:7071", True),
        ("http://localhost:7071", True),
        ("http://[::1]:7071", True),
        ("https://127.0.0.1:7071", False),  # the local host serves http only
        ("https://localhost:7071", False),
        ("http://127.0.0.1:8000", False),  # another local server is another origin
        ("http://127.0.0.1", False),
        ("http://127.0.0.1:99999", False),
        ("http://evil.example:7071", False),
    ],
)
def test_local_mode_takes_a_loopback_http_origin_on_the_requests_port_only(origin, allowed):
    url = "http://127.0.0.1:7071/api/console/orders/O-1/resubmit"
    assert security.allowed_origin(origin, LOCAL, request_url=url) is allowed
