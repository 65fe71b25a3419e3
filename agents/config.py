"""The Agents' settings, read from the environment with local defaults.

Not adapters.settings.load_settings: the standalone worker runs in its own
trust boundary and must not need the state store's connection, which that
requires. The names are the host's and Bicep's (docs/agents.md)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from adapters.settings import (
    AGENT_SIGNING_KEYS,
    SERVICEBUS_CONNECTION,
    ServiceBusAccess,
    SettingsError,
    float_setting,
    in_azure,
    int_setting,
    key_ring,
    require_keys,
    servicebus_access,
)
from agents.agent import AgentPolicy
from domain.signing import KeyRing
from domain.steps import DEFAULT_CATALOG, CatalogError, StepCatalog, load_catalog

DEFAULT_REMOTE_SERVICE_URL = "http://127.0.0.1:7081"
REMOTE_SERVICE_URL = "REMOTE_SERVICE_URL"
# One service's base URL: REMOTE_SERVICE_URL__PAYMENT (the service upper-cased),
# the "__" of the host's own settings that name a part of one.
SERVICE_URL_PREFIX = f"{REMOTE_SERVICE_URL}__"
STEP_CATALOG_FILE = "STEP_CATALOG_FILE"


@dataclass(frozen=True)
class AgentSettings:
    """The settings of docs/agents.md's table. `keys` are the agent keys,
    never the reply-token keys: those stay in the Functions app (ADR 017e)."""

    remote_service_url: str = DEFAULT_REMOTE_SERVICE_URL
    service_urls: Mapping[str, str] = field(default_factory=dict)
    steps: StepCatalog = DEFAULT_CATALOG
    servicebus: ServiceBusAccess | None = None
    policy: AgentPolicy = field(default_factory=AgentPolicy)
    max_concurrency: int = 8
    lock_renewal_slack: float = 60.0
    shutdown_grace: float = 30.0
    alert_window: float = 60.0
    keys: KeyRing | None = field(default=None, repr=False)


def load_step_catalog(env: Mapping[str, str] | None = None) -> StepCatalog:
    """The catalog this process runs: the file STEP_CATALOG_FILE names, else
    the shipped domain/steps.json. Every process of one deployment (the app,
    the agents, the worker) must read the same one."""
    env = os.environ if env is None else env
    path = env.get(STEP_CATALOG_FILE)
    if not path:
        return DEFAULT_CATALOG
    try:
        return load_catalog(path)
    except CatalogError as exc:
        raise SettingsError(f"setting {STEP_CATALOG_FILE}: {exc}") from None


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
    steps = load_step_catalog(env)
    url = _url(env, REMOTE_SERVICE_URL, env.get(REMOTE_SERVICE_URL) or DEFAULT_REMOTE_SERVICE_URL)
    service_urls = _service_urls(env, steps)
    return AgentSettings(
        remote_service_url=url,
        service_urls=service_urls,
        steps=steps,
        servicebus=servicebus,
        policy=policy,
        max_concurrency=int_setting(env, "AGENT_MAX_CONCURRENCY", 8, 1),
        lock_renewal_slack=float_setting(env, "AGENT_LOCK_RENEWAL_SLACK_SECONDS", 60.0, 1.0),
        shutdown_grace=float_setting(env, "AGENT_SHUTDOWN_GRACE_SECONDS", 30.0),
        alert_window=float_setting(env, "ALERT_WINDOW_SECONDS", 60.0, 1.0),
        keys=key_ring(env, AGENT_SIGNING_KEYS),
    )


def _service_urls(env: Mapping[str, str], steps: StepCatalog) -> dict[str, str]:
    """REMOTE_SERVICE_URL__<SERVICE> for each service the catalog names; one
    that names no service of the catalog is a mistake (a typo would silently
    send that service's calls to the default URL)."""
    known = {service.upper(): service for service in steps.services}
    urls = {}
    for name, value in env.items():
        if not name.startswith(SERVICE_URL_PREFIX) or not value:
            continue
        suffix = name[len(SERVICE_URL_PREFIX) :]
        service = known.get(suffix.upper())
        if service is None:
            raise SettingsError(
                f"setting {name} names no service of the step catalog; "
                f"services: {', '.join(sorted(known.values()))}"
            )
        urls[service] = _url(env, name, value)
    return urls


def _url(env: Mapping[str, str], name: str, url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise SettingsError(f"setting {name} must be an http(s) URL, got {url!r}")
    if in_azure(env) and _is_loopback(url):
        # In Azure the local default would send every step to nobody and fail
        # each order only after the whole retry budget.
        raise SettingsError(
            f"setting {name} is {url!r}, a loopback address, in Azure: "
            f"set it to the remote service's public https URL (azd env set {name} ...)"
        )
    return url


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
