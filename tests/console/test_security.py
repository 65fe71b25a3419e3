"""Who acts, the confirmation form's CSRF token, and payment-data redaction."""

from __future__ import annotations

import pytest

from console import security

URL = "https://orders.example.net/api/console/orders/O-1/resubmit"


def test_operator_is_local_off_azure_and_the_principal_in_azure():
    assert security.operator({}, env={}) == "local"
    assert (
        security.operator(
            {"X-MS-CLIENT-PRINCIPAL-NAME": "ada@example.com"}, env={"WEBSITE_SITE_NAME": "app"}
        )
        == "ada@example.com"
    )
    with pytest.raises(security.Forbidden):
        security.operator({}, env={"WEBSITE_SITE_NAME": "app"})


def test_a_fresh_token_for_this_operator_order_and_action_passes():
    env = {"CONSOLE_CSRF_SECRET": "s3"}
    token = security.form_token("ada", "O-1", "resubmit", now=1000, env=env)
    security.check_csrf({}, {"csrf": token}, URL, "ada", "O-1", "resubmit", now=1001, env=env)


@pytest.mark.parametrize(
    ("who", "order", "action", "now", "secret"),
    [
        ("eve", "O-1", "resubmit", 1001, "s3"),  # another operator
        ("ada", "O-2", "resubmit", 1001, "s3"),  # another order
        ("ada", "O-1", "compensate", 1001, "s3"),  # another action
        ("ada", "O-1", "resubmit", 1000 + security.TOKEN_LIFETIME + 1, "s3"),  # expired
        ("ada", "O-1", "resubmit", 1001, "other"),  # another app's secret
    ],
)
def test_a_token_for_anything_else_is_refused(who, order, action, now, secret):
    token = security.form_token(
        "ada", "O-1", "resubmit", now=1000, env={"CONSOLE_CSRF_SECRET": "s3"}
    )
    with pytest.raises(security.Forbidden):
        security.check_csrf(
            {},
            {"csrf": token},
            URL,
            who,
            order,
            action,
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
    ],
)
def test_cross_site_posts_are_refused_even_with_a_valid_token(headers):
    env = {"CONSOLE_CSRF_SECRET": "s3"}
    token = security.form_token("ada", "O-1", "resubmit", now=1000, env=env)
    with pytest.raises(security.Forbidden):
        security.check_csrf(
            headers, {"csrf": token}, URL, "ada", "O-1", "resubmit", now=1001, env=env
        )


def test_same_origin_post_passes():
    env = {"CONSOLE_CSRF_SECRET": "s3"}
    token = security.form_token("ada", "O-1", "resubmit", now=1000, env=env)
    security.check_csrf(
        {"Origin": "https://orders.example.net", "Sec-Fetch-Site": "same-origin"},
        {"csrf": token},
        URL,
        "ada",
        "O-1",
        "resubmit",
        now=1001,
        env=env,
    )


@pytest.mark.parametrize("form", [{}, {"csrf": ""}, {"csrf": "nodot"}, {"csrf": "123.abc"}])
def test_missing_or_forged_tokens_are_refused(form):
    with pytest.raises(security.Forbidden):
        security.check_csrf({}, form, URL, "ada", "O-1", "resubmit")


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
    for hint in security.AZURE_HINTS:
        assert security.in_azure({hint: "x"})
        with pytest.raises(security.Unauthenticated):
            security.operator({"x-ms-client-principal-name": " "}, env={hint: "x"})
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
    masked = security.mask_for_display(Markup("<b>4111111111111111</b>"))
    assert isinstance(masked, Markup)
    assert masked == Markup("<b>[redacted]</b>")
    assert security.mask_for_display("11 digits 12345678903") == "11 digits 12345678903"
