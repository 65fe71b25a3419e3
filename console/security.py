"""The console's security: whether it is on at all (`console_enabled`), who is
acting (`operator`), cross-site request forgery protection (`form_token`,
`check_csrf`) and redaction of card numbers (`mask_for_display`).
Why each works this way: docs/adr/012-console-security.md."""

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

from adapters.settings import MANAGED_IDENTITY_ENDPOINTS

PRINCIPAL_HEADER = "x-ms-client-principal-name"
CSRF_FIELD = "csrf"
LOCAL_OPERATOR = "local"
TOKEN_LIFETIME = 15 * 60  # seconds a confirmation form stays valid
_PROCESS_SECRET = secrets.token_bytes(32)

_PAYMENT_KEY = re.compile(r"payment|card|pan$|cvv|cvc|iban|account.?number|expiry", re.IGNORECASE)
_DIGIT_RUN = re.compile(r"(?<!\d)(?:\d[ -]?){11,18}\d(?!\d)")
AZURE_HINTS = ("WEBSITE_SITE_NAME", *MANAGED_IDENTITY_ENDPOINTS)
AUTH_CONFIRMED_SETTING = "CONSOLE_AUTH_CONFIRMED"
DISABLED_MESSAGE = (
    "The operator console is disabled in this deployment: App Service authentication has not been "
    f'confirmed to protect it ({AUTH_CONFIRMED_SETTING}). See infra/README.md, "The console in Azure".\n'
)


class Forbidden(Exception):
    """The request may not do what it asks; the message is shown to the operator."""


class Unauthenticated(Forbidden):
    """No authenticated principal where one is required (answered with 401)."""


class Unmasked(str):
    """Text the console built itself (a URL part, a form token): rendered as
    is, never taken for a card number. A str subclass, so it is still escaped."""


def in_azure(env: Mapping[str, str] | None = None) -> bool:
    env = env if env is not None else os.environ
    return any(env.get(name) for name in AZURE_HINTS)


def console_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the console may answer at all (see the module docstring)."""
    env = env if env is not None else os.environ
    if not in_azure(env):
        return True
    return (env.get(AUTH_CONFIRMED_SETTING) or "").strip().lower() == "true"


def operator(headers: Mapping[str, str], env: Mapping[str, str] | None = None) -> str:
    """The signed-in operator's name (see the module docstring); raises
    Unauthenticated in Azure when App Service authentication sent none."""
    name = (_header(headers, PRINCIPAL_HEADER) or "").strip()
    if in_azure(env):
        if not name:
            raise Unauthenticated(
                "no authenticated principal: sign in (App Service authentication)"
            )
        return name[:80]
    return LOCAL_OPERATOR


def _secret(env: Mapping[str, str] | None = None) -> bytes:
    configured = (env if env is not None else os.environ).get("CONSOLE_CSRF_SECRET")
    return configured.encode() if configured else _PROCESS_SECRET


def form_token(
    who: str,
    order_id: str,
    action: str,
    now: float | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    expiry = int((now if now is not None else time.time()) + TOKEN_LIFETIME)
    return f"{expiry}.{_sign(who, order_id, action, expiry, env)}"


def _sign(who: str, order_id: str, action: str, expiry: int, env: Mapping[str, str] | None) -> str:
    message = "\x1f".join((who, order_id, action, str(expiry))).encode()
    return hmac.new(_secret(env), message, hashlib.sha256).hexdigest()


def check_csrf(
    headers: Mapping[str, str],
    form: Mapping[str, str],
    request_url: str,
    who: str,
    order_id: str,
    action: str,
    now: float | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
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


def mask_for_display(value: Any) -> Any:
    """The templates' finalize: every rendered string with card numbers masked.
    Markup (already escaped) stays Markup: masking only swaps digits for text
    without markup characters."""
    if isinstance(value, Unmasked) or not isinstance(value, str):
        return value
    masked = mask_card_numbers(value)
    if masked == value:
        return value
    return masked if type(value) is str else type(value)(masked)


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
