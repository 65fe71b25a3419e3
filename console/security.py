"""Who is acting, cross-site request forgery protection, and redaction.

Identity. In Azure the console runs behind App Service authentication, which
strips any client-sent `x-ms-client-principal-*` header and sets its own for a
signed-in user: the principal's name is the operator recorded in the order's
history. In Azure (WEBSITE_SITE_NAME is set) a request without it is refused,
so a console deployed without authentication cannot act. Locally the operator
is "local".

CSRF. The confirmation form carries a signed token: an HMAC, under the
app setting CONSOLE_CSRF_SECRET, of (operator, order, action, expiry). The
POST must bring it back unexpired and for exactly that operator, order and
action; a cross-site page cannot read our form to learn it, and a browser's
`Sec-Fetch-Site` / `Origin` naming another site is refused outright. It needs
no session or cookie, so any instance of the app can check any form as long
as they share the secret (without the setting each process makes its own,
which is right for one local host and wrong for a scaled-out app). Cookies
are avoided also because the local host drops Set-Cookie headers (it ignores
the cookies the worker's converter extracts; see docs/console.md).

Redaction. No payment data is shown: keys that name payment data are dropped
from anything displayed, and any digit run that looks like a card number
(13-19 digits passing Luhn) is masked, in case a malformed message carries
one where it should not."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

PRINCIPAL_HEADER = "x-ms-client-principal-name"
CSRF_FIELD = "csrf"
LOCAL_OPERATOR = "local"
TOKEN_LIFETIME = 15 * 60  # seconds a confirmation form stays valid
_PROCESS_SECRET = secrets.token_bytes(32)

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


def _secret(env: Mapping[str, str] | None = None) -> bytes:
    configured = (env if env is not None else os.environ).get("CONSOLE_CSRF_SECRET")
    return configured.encode() if configured else _PROCESS_SECRET


def form_token(who: str, order_id: str, action: str, now: float | None = None,
               env: Mapping[str, str] | None = None) -> str:
    expiry = int((now if now is not None else time.time()) + TOKEN_LIFETIME)
    return f"{expiry}.{_sign(who, order_id, action, expiry, env)}"


def _sign(who: str, order_id: str, action: str, expiry: int, env: Mapping[str, str] | None) -> str:
    message = "\x1f".join((who, order_id, action, str(expiry))).encode()
    return hmac.new(_secret(env), message, hashlib.sha256).hexdigest()


def check_csrf(headers: Mapping[str, str], form: Mapping[str, str], request_url: str, who: str,
               order_id: str, action: str, now: float | None = None,
               env: Mapping[str, str] | None = None) -> None:
    """Raise Forbidden unless the POST came from our own, fresh confirmation form
    for this operator, order and action."""
    site = (_header(headers, "sec-fetch-site") or "").lower()
    if site and site not in ("same-origin", "none"):
        raise Forbidden("cross-site request refused")
    origin = _header(headers, "origin")
    if origin and origin != "null":
        ours = urlsplit(request_url)
        theirs = urlsplit(origin)
        if (theirs.scheme, theirs.netloc) != (ours.scheme, ours.netloc):
            raise Forbidden("request from another origin refused")
    expiry_raw, _, signature = (form.get(CSRF_FIELD) or "").partition(".")
    if not expiry_raw.isdigit() or not signature:
        raise Forbidden("missing form token; open the confirmation page again")
    expiry = int(expiry_raw)
    expected = _sign(who, order_id, action, expiry, env)
    if not hmac.compare_digest(expected, signature):
        raise Forbidden("wrong form token; open the confirmation page again")
    if expiry < (now if now is not None else time.time()):
        raise Forbidden("the confirmation expired; open it again")


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
