"""The console's security: whether it is on at all (`console_enabled`), who is
acting (`operator`), where links point (`base_path`), cross-site request
forgery protection (`form_token`, `check_csrf`, single use through
`record_version`) and redaction of card numbers (`mask_for_display`).
Why each works this way: docs/adr/012-console-security.md."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from markupsafe import Markup

from adapters.settings import in_azure
from domain.models import passes_luhn

PRINCIPAL_HEADER = "x-ms-client-principal-name"
PRINCIPAL_ID_HEADER = "x-ms-client-principal-id"
CLAIMS_HEADER = "x-ms-client-principal"  # base64 JSON of the token's claims (Easy Auth)
OPERATORS_SETTING = "CONSOLE_OPERATORS"
OPERATOR_ROLE_SETTING = "CONSOLE_OPERATOR_ROLE"
_ROLE_CLAIMS = ("roles", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role")
CSRF_FIELD = "csrf"
LOCAL_OPERATOR = "local"
TOKEN_LIFETIME = 15 * 60  # seconds a confirmation form stays valid
_PROCESS_SECRET = secrets.token_bytes(32)

_PAYMENT_KEY = re.compile(r"payment|card|pan$|cvv|cvc|iban|account.?number|expiry", re.IGNORECASE)
_DIGIT_RUN = re.compile(r"(?<!\d)(?:\d[ -]?){11,18}\d(?!\d)")
AUTH_CONFIRMED_SETTING = "CONSOLE_AUTH_CONFIRMED"
LOCAL_MODE_SETTING = "CONSOLE_LOCAL_MODE"
PUBLIC_URL_SETTING = "CONSOLE_PUBLIC_URL"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
DISABLED_MESSAGE = (
    "The operator console is disabled in this deployment: it answers only behind an "
    f"authentication that was confirmed to protect it ({AUTH_CONFIRMED_SETTING}=true, "
    'see infra/README.md, "The console in Azure"), or in local mode on a loopback address '
    f"({LOCAL_MODE_SETTING}=true, set by the local stack).\n"
)


class Forbidden(Exception):
    """The request may not do what it asks; the message is shown to the operator."""


class Unauthenticated(Forbidden):
    """No authenticated principal where one is required (answered with 401)."""


class Unmasked(str):
    """Text the console built itself (a URL part, a form token): rendered as
    is, never taken for a card number. A str subclass, so it is still escaped."""


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return env if env is not None else os.environ


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def local_mode(env: Mapping[str, str] | None = None) -> bool:
    """Local mode: CONSOLE_LOCAL_MODE is a clear `true` and no Azure hint is
    set (in Azure the setting is ignored: local mode never reaches a cloud)."""
    env = _env(env)
    return _true(env.get(LOCAL_MODE_SETTING)) and not in_azure(env)


def console_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the console may answer at all: in local mode, or once the
    deployer confirmed that an authentication in front of it sets the
    principal header (and removes a client-sent one). Anything else, in
    Azure or not (a container, Kubernetes), keeps it off: it fails closed."""
    env = _env(env)
    return local_mode(env) or _true(env.get(AUTH_CONFIRMED_SETTING))


def operator(
    headers: Mapping[str, str], request_url: str = "", env: Mapping[str, str] | None = None
) -> str:
    """The signed-in operator's name: in local mode `local`, for a request
    addressed to a loopback host only (DNS rebinding gets nothing); otherwise
    the principal authentication set (Unauthenticated without one), and only
    when `may_operate` admits it: the app does not rest on the proxy alone."""
    env = _env(env)
    if local_mode(env):
        host = (urlsplit(request_url).hostname or "") if request_url else ""
        if host.strip("[]") not in LOOPBACK_HOSTS:
            raise Forbidden("local mode answers requests to a loopback address only")
        return LOCAL_OPERATOR
    name = (_header(headers, PRINCIPAL_HEADER) or "").strip()
    principal_id = (_header(headers, PRINCIPAL_ID_HEADER) or "").strip()
    if not name and not principal_id:
        raise Unauthenticated("no authenticated principal: sign in (App Service authentication)")
    roles, groups = _claims(headers)
    may_operate(principal_id, roles, env, groups)
    return (name or principal_id)[:80]


def operator_ids(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """CONSOLE_OPERATORS: the principal (object) ids that may operate,
    separated by commas or spaces, compared without case."""
    raw = _env(env).get(OPERATORS_SETTING) or ""
    return frozenset(p.strip().lower() for p in re.split(r"[,\s]+", raw) if p.strip())


def may_operate(
    principal_id: str,
    roles: frozenset[str],
    env: Mapping[str, str],
    groups: frozenset[str] = frozenset(),
) -> None:
    """Raise Forbidden unless the principal, or a group its token names (the
    `groups` claim, when the app registration emits it), is on
    CONSOLE_OPERATORS, or it holds the app role CONSOLE_OPERATOR_ROLE. With
    neither set nobody may: the console fails closed, as it does without
    confirmed authentication."""
    ids = operator_ids(env)
    role = (env.get(OPERATOR_ROLE_SETTING) or "").strip()
    if not ids and not role:
        raise Forbidden(
            f"no operator is configured: set {OPERATORS_SETTING} (principal ids) or "
            f"{OPERATOR_ROLE_SETTING} (an app role) in the app's settings"
        )
    if principal_id and principal_id.lower() in ids:
        return
    if any(g.lower() in ids for g in groups):
        return
    if role and role in roles:
        return
    raise Forbidden(
        "you are signed in but not an operator of this console "
        f"(principal id {principal_id[:64] or 'not sent'}); ask for your id to be added to "
        f"{OPERATORS_SETTING}" + (f" or for the app role {role!r}" if role else "")
    )


def _claims(headers: Mapping[str, str]) -> tuple[frozenset[str], frozenset[str]]:
    """(app roles, group ids) in App Service authentication's claims header
    (`x-ms-client-principal`: base64 JSON, `claims` of `typ`/`val`, the role
    claim's type named by `role_typ`). Nothing when absent or unreadable."""
    raw = _header(headers, CLAIMS_HEADER)
    if not raw or len(raw) > 64_000:
        return frozenset(), frozenset()
    try:
        principal = json.loads(base64.b64decode(raw + "=" * (-len(raw) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        return frozenset(), frozenset()
    if not isinstance(principal, dict) or not isinstance(principal.get("claims"), list):
        return frozenset(), frozenset()
    role_kinds = {*_ROLE_CLAIMS, str(principal.get("role_typ") or "roles")}
    claims = [
        (c.get("typ"), str(c.get("val")))
        for c in principal["claims"]
        if isinstance(c, dict) and c.get("val")
    ]
    roles = frozenset(v for t, v in claims if t in role_kinds)
    groups = frozenset(v for t, v in claims if t == "groups")
    return roles, groups


def public_base(env: Mapping[str, str] | None = None) -> str | None:
    """CONSOLE_PUBLIC_URL without a trailing slash (`https://ops.example.net/api/console`),
    or None: then every link is a path, never a URL built from the request's Host."""
    raw = (_env(env).get(PUBLIC_URL_SETTING) or "").strip().rstrip("/")
    if not raw:
        return None
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return raw


def base_path(request_url: str, env: Mapping[str, str] | None = None) -> str:
    """Where the console's links start: the configured public URL, else the
    console's own path prefix from the request's path (host routePrefix
    included), never its host."""
    configured = public_base(env)
    if configured is not None:
        return configured
    path = urlsplit(request_url).path or ""
    marker = "/console"
    i = path.find(marker)
    return path[: i + len(marker)] if i >= 0 else "/api/console"


def allowed_origin(
    origin: str, env: Mapping[str, str] | None = None, request_url: str = ""
) -> bool:
    """Whether a POST's Origin is the console's own: the configured public
    URL's origin; in Azure the app's own default host (WEBSITE_HOSTNAME, set
    by the platform, not by the request); in local mode a loopback origin
    over http (the local host serves no https) on the port the request came
    to, when it is known (another local server is another origin). Never
    compared with the request's Host name."""
    env = _env(env)
    theirs = urlsplit(origin)
    if theirs.scheme not in ("http", "https") or not theirs.hostname:
        return False
    ours = []
    configured = public_base(env)
    if configured is not None:
        parts = urlsplit(configured)
        ours.append((parts.scheme, parts.netloc.lower()))
    site = (env.get("WEBSITE_HOSTNAME") or "").strip().lower()
    if site and in_azure(env):
        ours.append(("https", site))
    if (theirs.scheme, theirs.netloc.lower()) in ours:
        return True
    if not local_mode(env) or theirs.scheme != "http":
        return False
    if theirs.hostname.strip("[]") not in LOOPBACK_HOSTS:
        return False
    return not request_url or _port(theirs) == _port(urlsplit(request_url))


def _port(parts: Any) -> int | None:
    try:
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a port out of range
        return None


def _secret(env: Mapping[str, str] | None = None) -> bytes:
    configured = _env(env).get("CONSOLE_CSRF_SECRET")
    return configured.encode() if configured else _PROCESS_SECRET


def form_token(*bound: str, now: float | None = None, env: Mapping[str, str] | None = None) -> str:
    """The confirmation form's token, bound to the operator, the target, the
    action and the target's version (`record_version`): once the action is
    done the version changed, so the token is refused (single use, with no
    session store)."""
    expiry = int((now if now is not None else time.time()) + TOKEN_LIFETIME)
    return f"{expiry}.{_sign(bound, expiry, env)}"


def record_version(record: Any) -> str:
    """What an action changes on the record (its last update, state, attempt
    and compensation flag), as a digest a form may carry: hex, no control
    characters."""
    state = getattr(record.ProcessState, "value", record.ProcessState)
    fields = (record.UpdatedAt.isoformat(), state, record.Attempt, record.CompensationRequested)
    version = "\x1e".join(str(f) for f in fields)
    return hashlib.sha256(version.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _sign(bound: tuple[str, ...], expiry: int, env: Mapping[str, str] | None) -> str:
    message = "\x1f".join((*bound, str(expiry))).encode()
    return hmac.new(_secret(env), message, hashlib.sha256).hexdigest()


def check_csrf(
    headers: Mapping[str, str],
    form: Mapping[str, str],
    *bound: str,
    now: float | None = None,
    env: Mapping[str, str] | None = None,
    request_url: str = "",
) -> None:
    """Raise Forbidden unless the POST came from our own, fresh confirmation
    form bound to `bound` (form_token's: operator, target, action, version;
    `request_url`: where the POST was sent, for a local origin's port)."""
    site = (_header(headers, "sec-fetch-site") or "").lower()
    if site and site not in ("same-origin", "none"):
        raise Forbidden("cross-site request refused")
    origin = _header(headers, "origin")
    if origin is not None and not allowed_origin(origin, env, request_url):
        raise Forbidden(
            "request from another origin refused"
            + ("" if public_base(env) else f" (set {PUBLIC_URL_SETTING} to the console's URL)")
        )
    expiry_raw, _, signature = (form.get(CSRF_FIELD) or "").partition(".")
    if not (expiry_raw.isascii() and expiry_raw.isdigit()) or len(expiry_raw) > 12 or not signature:
        raise Forbidden("missing form token; open the confirmation page again")
    expiry = int(expiry_raw)
    expected = _sign(bound, expiry, env)
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
        raise Forbidden(
            "this confirmation was already used, the order changed since it was opened, "
            "or the token is wrong; open the confirmation page again"
        )
    if expiry < (now if now is not None else time.time()):
        raise Forbidden("the confirmation expired; open it again")


def redact(value: Any) -> Any:
    """A copy of `value` without payment-named keys, card numbers masked."""
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items() if not _PAYMENT_KEY.search(str(k))}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return mask_card_numbers(value)
    return value


# A lone surrogate cannot be encoded as UTF-8, control characters do not belong
# in HTML text: both are shown as escapes, so the operator sees what was stored.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape_unprintable(m: re.Match[str]) -> str:
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with lone surrogates and control characters (but tab, CR, LF)
    replaced by their backslash escapes: always encodable as UTF-8."""
    return _UNPRINTABLE.sub(_escape_unprintable, text)


def mask_for_display(value: Any) -> Any:
    """The templates' finalize: every rendered string with card numbers masked
    and unprintable characters escaped (`printable`). Markup is a macro's
    output, each value in it finalized where it was interpolated: passed as
    is, so a form token in it (1 in about 100 holds a Luhn-valid digit run)
    reaches the form whole."""
    if not isinstance(value, str) or isinstance(value, Markup):
        return value
    if isinstance(value, Unmasked):
        cleaned = printable(value)
        return value if cleaned == value else Unmasked(cleaned)
    masked = printable(mask_card_numbers(value))
    if masked == value:
        return value
    return masked if type(value) is str else type(value)(masked)


def mask_card_numbers(text: str) -> str:
    def mask(m: re.Match[str]) -> str:
        digits = re.sub(r"\D", "", m.group(0))
        return "[redacted]" if passes_luhn(digits) else m.group(0)

    return _DIGIT_RUN.sub(mask, text)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for k, v in headers.items():
            if k.lower() == name:
                return v
    return value
