"""The Agents' settings, read from the environment with local defaults.

Agents read their own few settings rather than adapters.settings.load_settings:
the standalone worker runs in its own trust boundary and has no business
needing (or holding) the state store's connection, which load_settings
requires. The names follow the host's conventions and are the ones in
local.settings.template.json and the Bicep app settings."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from adapters.servicebus import AGENT_REQUESTS_QUEUE, AGENT_RESPONSES_QUEUE
from adapters.settings import (
    AGENT_SIGNING_KEYS,
    MANAGED_IDENTITY_ENDPOINTS,
    SERVICEBUS_CONNECTION,
    ServiceBusAccess,
    SettingsError,
    float_setting,
    int_setting,
    key_ring,
    require_keys,
    servicebus_access,
)
from agents.agent import AgentPolicy
from domain.signing import KeyRing

DEFAULT_REMOTE_SERVICE_URL = "http://127.0.0.1:7081"
# Set by App Service / Functions in Azure, never by the local stack.
_AZURE_HINTS = ("WEBSITE_SITE_NAME", *MANAGED_IDENTITY_ENDPOINTS)


@dataclass(frozen=True)
class AgentSettings:
    """Attributes:
    remote_service_url: base URL of the downstream systems (REMOTE_SERVICE_URL).
    servicebus: where the request/response queues are (ServiceBusConnection,
        or ServiceBusConnection__fullyQualifiedNamespace for identity access).
    policy: the Agent's retry budget and breaker (AGENT_* settings).
    max_concurrency: requests one worker handles at once (AGENT_MAX_CONCURRENCY).
    lock_renewal_slack: seconds of lock renewal past a request's deadline, for
        sending the reply and settling (AGENT_LOCK_RENEWAL_SLACK_SECONDS).
    shutdown_grace: seconds a stopping worker lets in-flight requests finish
        before abandoning them (AGENT_SHUTDOWN_GRACE_SECONDS).
    keys: the agent keys (AGENT_SIGNING_KEYS) that requests must be signed
        with and replies are signed with; the runners refuse to start
        without them (`require_keys`). Never the reply-token keys: those stay
        in the Functions app (ADR 017e).
    """

    remote_service_url: str = DEFAULT_REMOTE_SERVICE_URL
    servicebus: ServiceBusAccess | None = None
    policy: AgentPolicy = field(default_factory=AgentPolicy)
    requests_queue: str = AGENT_REQUESTS_QUEUE
    responses_queue: str = AGENT_RESPONSES_QUEUE
    max_concurrency: int = 8
    lock_renewal_slack: float = 60.0
    shutdown_grace: float = 30.0
    keys: KeyRing | None = field(default=None, repr=False)


def load_agent_settings(env: Mapping[str, str] | None = None) -> AgentSettings:
    env = os.environ if env is None else env
    servicebus = servicebus_access(env)  # only the runners need it; they say so when it is missing
    defaults = AgentPolicy()
    policy = AgentPolicy(
        call_timeout=float_setting(env, "AGENT_CALL_TIMEOUT_SECONDS", defaults.call_timeout, 0.001),
        initial_backoff=float_setting(env, "AGENT_RETRY_INITIAL_SECONDS", defaults.initial_backoff),
        max_backoff=float_setting(env, "AGENT_RETRY_MAX_SECONDS", defaults.max_backoff),
        max_attempts=int_setting(env, "AGENT_RETRY_MAX_ATTEMPTS", defaults.max_attempts, 1),
        reply_margin=float_setting(env, "AGENT_REPLY_MARGIN_SECONDS", defaults.reply_margin),
        breaker_fail_max=int_setting(env, "AGENT_BREAKER_FAIL_MAX", defaults.breaker_fail_max, 1),
        breaker_reset_timeout=float_setting(
            env, "AGENT_BREAKER_RESET_SECONDS", defaults.breaker_reset_timeout
        ),
        min_call_time=float_setting(env, "AGENT_MIN_CALL_SECONDS", defaults.min_call_time),
    )
    url = env.get("REMOTE_SERVICE_URL") or DEFAULT_REMOTE_SERVICE_URL
    if not url.startswith(("http://", "https://")):
        raise SettingsError(f"setting REMOTE_SERVICE_URL must be an http(s) URL, got {url!r}")
    if any(env.get(name) for name in _AZURE_HINTS) and _is_loopback(url):
        # In Azure the local default would send every step to nobody and fail
        # each order only after the whole retry budget (issue 24, risk 4).
        raise SettingsError(
            f"setting REMOTE_SERVICE_URL is {url!r}, a loopback address, in Azure: "
            "set it to the remote service's public https URL (azd env set REMOTE_SERVICE_URL ...)"
        )
    return AgentSettings(
        remote_service_url=url,
        servicebus=servicebus,
        policy=policy,
        max_concurrency=int_setting(env, "AGENT_MAX_CONCURRENCY", 8, 1),
        lock_renewal_slack=float_setting(env, "AGENT_LOCK_RENEWAL_SLACK_SECONDS", 60.0, 1.0),
        shutdown_grace=float_setting(env, "AGENT_SHUTDOWN_GRACE_SECONDS", 30.0),
        keys=key_ring(env, AGENT_SIGNING_KEYS),
    )


def _is_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_agent_keys(settings: AgentSettings) -> KeyRing:
    return require_keys(settings.keys, AGENT_SIGNING_KEYS)


def require_servicebus(settings: AgentSettings) -> ServiceBusAccess:
    if settings.servicebus is None:
        raise SettingsError(
            f"set {SERVICEBUS_CONNECTION} (a connection string) or "
            f"{SERVICEBUS_CONNECTION}__fullyQualifiedNamespace"
        )
    return settings.servicebus
