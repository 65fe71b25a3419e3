"""Who is acting, cross-site request forgery protection, and redaction.

Identity. In Azure the console runs behind App Service authentication, which
strips any client-sent `x-ms-client-principal-*` header and sets its own for a
signed-in user: the principal's name is the operator recorded in the order's
history. In Azure (WEBSITE_SITE_NAME is set) a request without it is refused,
so a console deployed without authentication cannot act. Locally the operator
is "local".

CSRF. Double-submit token: the form page sets a random token in a cookie
(HttpOnly, SameSite=Strict, Secure on https) and in a hidden field; a POST
must carry both, equal. A cross-site page can neither read the cookie nor make
the browser send it (SameSite=Strict), and a browser's `Sec-Fetch-Site` /
`Origin` naming another site is refused outright. It is stateless, so any
instance of the app can check any form.

Redaction. No payment data is shown: keys that name payment data are dropped
from anything displayed, and any digit run that looks like a card number
(13-19 digits passing Luhn) is masked, in case a malformed message carries
one where it should not."""

from __future__ import annotations

import hmac
import os
import re
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

PRINCIPAL_HEADER = "x-ms-client-principal-name"
CSRF_COOKIE = "console_csrf"
CSRF_FIELD = "csrf"
LOCAL_OPERATOR = "local"

_PAYMENT_KEY = re.compile(r"payment|card|pan$|cvv|cvc|iban|account.?number|expiry", re.IGNORECASE)
_DIGIT_RUN = re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)")


class Forbidden(Exception):
    """The request may not do what it asks; the message is shown to the operator."""


def in_azure(env: Mapping[str, str] | None = None) -> bool:
    return bool((env if env is not None else os.environ).get("WEBSITE_SITE_NAME"))


def operator(headers: Mapping[str, str], env: Mapping[str, str] | None = None) -> str:
    """The acting operator's name (see the module docstring)."""
    name = _header(headers, PRINCIPAL_HEADER)
    if in_azure(env):
        if not name:
            raise Forbidden("no authenticated principal: enable App Service authentication for the console")
        return name.strip()[:80]
    return LOCAL_OPERATOR


def new_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_cookie(token: str, secure: bool) -> str:
    return (f"{CSRF_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
            + ("; Secure" if secure else ""))


def cookie_token(headers: Mapping[str, str]) -> str | None:
    raw = _header(headers, "cookie") or ""
    for part in raw.split(";"):
        name, _, value = part.strip().partition("=")
        if name == CSRF_COOKIE and value:
            return value
    return None


def check_csrf(headers: Mapping[str, str], form: Mapping[str, str], request_url: str) -> None:
    """Raise Forbidden unless the POST came from our own form."""
    site = (_header(headers, "sec-fetch-site") or "").lower()
    if site and site not in ("same-origin", "none"):
        raise Forbidden("cross-site request refused")
    origin = _header(headers, "origin")
    if origin and origin != "null":
        ours = urlsplit(request_url)
        theirs = urlsplit(origin)
        if (theirs.scheme, theirs.netloc) != (ours.scheme, ours.netloc):
            raise Forbidden("request from another origin refused")
    cookie = cookie_token(headers)
    field = form.get(CSRF_FIELD)
    if not cookie or not field or not hmac.compare_digest(cookie, field):
        raise Forbidden("missing or wrong form token; reload the page and confirm again")


def redact(value: Any) -> Any:
    """A copy of `value` with payment data removed (see the module docstring)."""
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items() if not _PAYMENT_KEY.search(str(k))}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return mask_card_numbers(value)
    return value


def mask_card_numbers(text: str) -> str:
    def mask(m: re.Match[str]) -> str:
        digits = re.sub(r"\D", "", m.group(0))
        return "[redacted]" if _luhn(digits) else m.group(0)

    return _DIGIT_RUN.sub(mask, text)


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for k, v in headers.items():
            if k.lower() == name:
                return v
    return value
