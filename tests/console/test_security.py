"""Who acts, the confirmation form's CSRF token, and payment-data redaction."""

from __future__ import annotations

import pytest

from console import security

URL = "https://orders.example.net/api/console/orders/O-1/resubmit"


def test_operator_is_local_off_azure_and_the_principal_in_azure():
    assert security.operator({}, env={}) == "local"
    assert security.operator({"X-MS-CLIENT-PRINCIPAL-NAME": "ada@example.com"},
                             env={"WEBSITE_SITE_NAME": "app"}) == "ada@example.com"
    with pytest.raises(security.Forbidden):
        security.operator({}, env={"WEBSITE_SITE_NAME": "app"})


def test_a_fresh_token_for_this_operator_order_and_action_passes():
    env = {"CONSOLE_CSRF_SECRET": "s3"}
    token = security.form_token("ada", "O-1", "resubmit", now=1000, env=env)
    security.check_csrf({}, {"csrf": token}, URL, "ada", "O-1", "resubmit", now=1001, env=env)


@pytest.mark.parametrize("who, order, action, now, secret", [
    ("eve", "O-1", "resubmit", 1001, "s3"),        # another operator
    ("ada", "O-2", "resubmit", 1001, "s3"),        # another order
    ("ada", "O-1", "compensate", 1001, "s3"),      # another action
    ("ada", "O-1", "resubmit", 1000 + security.TOKEN_LIFETIME + 1, "s3"),  # expired
    ("ada", "O-1", "resubmit", 1001, "other"),     # another app's secret
])
def test_a_token_for_anything_else_is_refused(who, order, action, now, secret):
    token = security.form_token("ada", "O-1", "resubmit", now=1000, env={"CONSOLE_CSRF_SECRET": "s3"})
    with pytest.raises(security.Forbidden):
        security.check_csrf({}, {"csrf": token}, URL, who, order, action, now=now,
                            env={"CONSOLE_CSRF_SECRET": secret})


@pytest.mark.parametrize("headers", [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Origin": "https://evil.example.com"},
    {"Origin": "http://orders.example.net"},  # scheme differs
])
def test_cross_site_posts_are_refused_even_with_a_valid_token(headers):
    env = {"CONSOLE_CSRF_SECRET": "s3"}
    token = security.form_token("ada", "O-1", "resubmit", now=1000, env=env)
    with pytest.raises(security.Forbidden):
        security.check_csrf(headers, {"csrf": token}, URL, "ada", "O-1", "resubmit", now=1001, env=env)


def test_same_origin_post_passes():
    env = {"CONSOLE_CSRF_SECRET": "s3"}
    token = security.form_token("ada", "O-1", "resubmit", now=1000, env=env)
    security.check_csrf({"Origin": "https://orders.example.net", "Sec-Fetch-Site": "same-origin"},
                        {"csrf": token}, URL, "ada", "O-1", "resubmit", now=1001, env=env)


@pytest.mark.parametrize("form", [{}, {"csrf": ""}, {"csrf": "nodot"}, {"csrf": "123.abc"}])
def test_missing_or_forged_tokens_are_refused(form):
    with pytest.raises(security.Forbidden):
        security.check_csrf({}, form, URL, "ada", "O-1", "resubmit")


def test_redact_drops_payment_fields_and_masks_card_numbers():
    value = {"OrderID": "O-1", "PaymentReference": "pay-1", "Customer": {"CardNumber": "x", "Name": "Ada"},
             "Note": "card 4111 1111 1111 1111 please", "Phone": "0049 30 1234567"}
    assert security.redact(value) == {"OrderID": "O-1", "Customer": {"Name": "Ada"},
                                      "Note": "card [redacted] please", "Phone": "0049 30 1234567"}
    assert security.mask_card_numbers("4111111111111112") == "4111111111111112"  # fails Luhn: not a card
