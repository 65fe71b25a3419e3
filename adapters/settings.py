"""One settings object, read from the environment under the names the Functions
host and the Bicep templates use (docs/settings.md). Connections follow the
host's convention: `<Name>` holds a connection string (local), or
`<Name>__accountEndpoint` / `<Name>__fullyQualifiedNamespace` select
identity-based access (Azure), with no key in settings."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache
from typing import Any, TypeVar

from domain.ids import app_tag
from domain.shards import MAX_SHARDS
from domain.signing import BadKey, KeyRing, SchedulerKeys, parse_keys
from domain.state_machine import RetryPolicy

SERVICEBUS_CONNECTION = "ServiceBusConnection"
COSMOS_CONNECTION = "CosmosDbConnection"
ORDERS_DB_CONNECTION = "OrdersDbConnection"


# The internal queues' keys (domain.signing, ADR 017e).
AGENT_SIGNING_KEYS = "AGENT_SIGNING_KEYS"  # the Scheduler and every agent
REPLY_TOKEN_KEYS = "REPLY_TOKEN_KEYS"  # the Functions app only


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names it."""


def key_ring(env: Mapping[str, str], name: str) -> KeyRing | None:
    """The key ring in setting `name`; None when unset. A bad value is refused
    naming the setting, never quoting it."""
    raw = env.get(name, "")
    if not raw.strip():
        return None
    try:
        return parse_keys(raw)
    except BadKey as exc:
        raise SettingsError(f"setting {name}: {exc}") from None


def require_keys(ring: KeyRing | None, name: str) -> KeyRing:
    """`ring`, or the error that says which setting to fill and how."""
    if ring is None:
        raise SettingsError(
            f"set {name}: comma-separated base64 keys of at least 32 random bytes, the "
            "current one first (`python -m devstack key` makes one; docs/adr/017e-internal-queue-keys.md)"
        )
    return ring


@dataclass(frozen=True)
class CosmosAccount:
    """Where a Cosmos DB account is; `key` None means identity-based access."""

    endpoint: str
    key: str | None
    verify_tls: bool = True


@dataclass(frozen=True)
class ServiceBusAccess:
    """A connection string, or a namespace for identity-based access as
    `client_id` (AZURE_CLIENT_ID)."""

    connection_string: str | None = None
    fully_qualified_namespace: str | None = None
    client_id: str | None = None


def servicebus_access(env: Mapping[str, str]) -> ServiceBusAccess | None:
    """The host-style Service Bus connection setting (the triggers' too); None when unset."""
    if env.get(SERVICEBUS_CONNECTION):
        return ServiceBusAccess(connection_string=env[SERVICEBUS_CONNECTION])
    if env.get(f"{SERVICEBUS_CONNECTION}__fullyQualifiedNamespace"):
        return ServiceBusAccess(
            fully_qualified_namespace=env[f"{SERVICEBUS_CONNECTION}__fullyQualifiedNamespace"],
            client_id=env.get("AZURE_CLIENT_ID") or None,
        )
    return None


@dataclass(frozen=True)
class Settings:
    state_account: CosmosAccount
    orders_account: CosmosAccount
    servicebus: ServiceBusAccess
    state_database: str = "orderprocessing"
    state_container: str = "orderState"
    recovery_index_container: str = "recoveryIndex"
    recovery_index_shards: int = 16
    orders_database: str = "orders"
    orders_container: str = "orders"
    reply_queues: Mapping[str, str] = field(default_factory=dict)
    # Applications that opted in to progress statuses (Processing, StepCompleted).
    progress_apps: frozenset[str] = frozenset()
    # appId -> its ingress queue; an order's AppId is its queue's, never the body's.
    ingress_queues: Mapping[str, str] = field(default_factory=dict)
    pending_backlog_limit: int = 5000
    backlog_gauge_max_age: timedelta = timedelta(seconds=300)
    max_order_bytes: int = 64 * 1024
    max_processing: int = 500
    step_timeout: timedelta = timedelta(seconds=60)
    starter_batch_size: int = 50
    starter_max_batches: int = 10
    starter_run_budget: timedelta = timedelta(seconds=4)
    starter_count_interval: timedelta = timedelta(0)
    alert_window: timedelta = timedelta(seconds=60)
    supervisor_page_size: int = 100
    supervisor_max_pages: int = 20
    supervisor_run_budget: timedelta = timedelta(seconds=8)
    supervisor_scan: str = "query"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # The app's user-assigned identity in Azure (AZURE_CLIENT_ID, infra/app/api.bicep).
    managed_identity_client_id: str | None = None
    inline_steps: tuple[str, ...] = ()
    # The local stack only; in Azure the Bicep templates create the containers.
    create_containers: bool = False
    # None when unset: what signs or verifies refuses to run without them.
    agent_keys: KeyRing | None = field(default=None, repr=False)
    reply_token_keys: KeyRing | None = field(default=None, repr=False)

    def scheduler_keys(self) -> SchedulerKeys:
        """The keys the Scheduler signs requests and checks replies with;
        SettingsError naming the missing setting."""
        return SchedulerKeys(
            tokens=require_keys(self.reply_token_keys, REPLY_TOKEN_KEYS),
            agents=require_keys(self.agent_keys, AGENT_SIGNING_KEYS),
        )

    # This deployment's shard of SHARD_COUNT (docs/adr/020e-task-hub-shards.md).
    shard_count: int = 1
    shard_index: int = 0


def _shard(env: Mapping[str, str]) -> tuple[int, int]:
    count = int_setting(env, "SHARD_COUNT", 1, 1, MAX_SHARDS)
    index = int_setting(env, "SHARD_INDEX", 0, 0)
    if index >= count:
        raise SettingsError(
            f"SHARD_INDEX must be below SHARD_COUNT ({count}): shards are numbered 0 to "
            f"{count - 1}, not {index}"
        )
    return count, index


def int_setting(
    env: Mapping[str, str], name: str, default: int, minimum: int = 0, maximum: int | None = None
) -> int:
    """A whole-number setting, `default` when unset or empty; anything else
    out of range is refused naming the setting."""
    value = _number(env, name, default, minimum, int, "a whole number")
    if maximum is not None and value > maximum:
        raise SettingsError(f"setting {name} must be {minimum} to {maximum}, got {value}")
    return value


def float_setting(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    """A number setting (seconds, mostly), read like `int_setting`."""
    return _number(env, name, default, minimum, float, "a number")


_N = TypeVar("_N", int, float)


def _number(
    env: Mapping[str, str],
    name: str,
    default: _N,
    minimum: _N,
    parse: Callable[[str], _N],
    what: str,
) -> _N:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = parse(raw)
    except ValueError:
        raise SettingsError(f"setting {name} must be {what}, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"setting {name} must be at least {minimum:g}, got {raw}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise SettingsError(f"setting {name} must be true or false, got {raw!r}")


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = env.get(name) or default
    if value not in allowed:
        raise SettingsError(f"setting {name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def parse_connection_string(value: str) -> dict[str, str]:
    parts = {}
    for item in value.split(";"):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        if not sep:
            raise SettingsError(f"connection string part {item!r} is not Key=Value")
        parts[key.strip()] = val.strip()
    return parts


def _cosmos_account(env: Mapping[str, str], name: str, verify_tls: bool) -> CosmosAccount | None:
    if env.get(name):
        parts = parse_connection_string(env[name])
        endpoint = parts.get("AccountEndpoint")
        if not endpoint:
            raise SettingsError(f"setting {name} has no AccountEndpoint")
        return CosmosAccount(endpoint, parts.get("AccountKey"), verify_tls)
    endpoint = env.get(f"{name}__accountEndpoint")
    if endpoint:
        return CosmosAccount(endpoint, None, verify_tls)
    return None


def _registry(env: Mapping[str, str]) -> dict[str, tuple[str, bool]]:
    """REPLY_QUEUE_REGISTRY: each application's reply queue, and whether it
    opted in to progress statuses."""
    raw = env.get("REPLY_QUEUE_REGISTRY", "")
    if not raw:
        return {}
    try:
        registry = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"setting REPLY_QUEUE_REGISTRY is not JSON: {exc}") from None
    shape = (
        'setting REPLY_QUEUE_REGISTRY must map app ids to queue names: {"app": "queue"}, '
        'or to {"queue": "queue", "progress": true} to opt in to progress statuses'
    )
    if not isinstance(registry, dict):
        raise SettingsError(shape)
    apps: dict[str, tuple[str, bool]] = {}
    for app, entry in registry.items():
        if isinstance(entry, str):
            apps[app] = (entry, False)
        elif (
            not isinstance(entry, dict)
            or not isinstance(entry.get("queue"), str)
            or not isinstance(entry.get("progress", False), bool)
            or set(entry) - {"queue", "progress"}
        ):
            raise SettingsError(f"{shape} (entry {app!r})")
        else:
            apps[app] = (entry["queue"], entry.get("progress", False))
    _check_apps_apart(apps)
    return apps


def _check_apps_apart(registry: Mapping[str, tuple[str, bool]]) -> None:
    """Applications may use the same OrderIDs (docs/adr/017f-order-keys.md):
    each needs its own order-key tag and its own reply queue."""
    tags: dict[str, str] = {}
    queues: dict[str, str] = {}
    for app, (queue, _) in registry.items():
        try:
            tag = app_tag(app)
        except ValueError as exc:
            raise SettingsError(f"setting REPLY_QUEUE_REGISTRY: {exc}") from None
        if tag in tags:
            raise SettingsError(
                f"setting REPLY_QUEUE_REGISTRY: applications {tags[tag]!r} and {app!r} "
                f"share the order-key tag {tag!r}; rename one"
            )
        tags[tag] = app
        if queue in queues:
            raise SettingsError(
                f"setting REPLY_QUEUE_REGISTRY: applications {queues[queue]!r} and {app!r} "
                f"share the reply queue {queue!r}; each application needs its own"
            )
        queues[queue] = app


def ingress_queues(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """ORDER_INGRESS_QUEUES (`{"appId": "queue"}`), else `orders-<appId>` for
    every application in REPLY_QUEUE_REGISTRY (the Bicep templates' names).
    Public: function_app.py registers a Submit function per entry at load."""
    env = os.environ if env is None else env
    raw = env.get("ORDER_INGRESS_QUEUES", "")
    if not raw:
        return {app: f"orders-{app}" for app in _registry(env)}
    try:
        queues = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"setting ORDER_INGRESS_QUEUES is not JSON: {exc}") from None
    if not isinstance(queues, dict) or not all(
        isinstance(app, str) and app and isinstance(queue, str) and queue
        for app, queue in queues.items()
    ):
        raise SettingsError(
            'setting ORDER_INGRESS_QUEUES must map app ids to queue names: {"app": "queue"}'
        )
    if len(set(queues.values())) != len(queues):
        raise SettingsError("setting ORDER_INGRESS_QUEUES gives two applications the same queue")
    return queues


def _connections(env: Mapping[str, str]) -> tuple[CosmosAccount, CosmosAccount, ServiceBusAccess]:
    """The state account, the orders account (the state's unless set) and
    Service Bus; SettingsError when one that is required is not set."""
    verify_tls = _bool(env, "COSMOS_VERIFY_TLS", True)
    state = _cosmos_account(env, COSMOS_CONNECTION, verify_tls)
    if state is None:
        raise SettingsError(
            f"set {COSMOS_CONNECTION} (a connection string) or {COSMOS_CONNECTION}__accountEndpoint"
        )
    orders = _cosmos_account(env, ORDERS_DB_CONNECTION, verify_tls) or state
    servicebus = servicebus_access(env)
    if servicebus is None:
        raise SettingsError(
            f"set {SERVICEBUS_CONNECTION} (a connection string) or "
            f"{SERVICEBUS_CONNECTION}__fullyQualifiedNamespace"
        )
    return state, orders, servicebus


def _retry_policy(env: Mapping[str, str]) -> RetryPolicy:
    return RetryPolicy(
        threshold=int_setting(env, "FAILURE_THRESHOLD", 10, 1),
        long_retries=int_setting(env, "LONG_RETRIES", 1, 0),
        long_delay=timedelta(seconds=int_setting(env, "LONG_RETRY_DELAY_SECONDS", 3600, 0)),
        claim_timeout=timedelta(seconds=int_setting(env, "CLAIM_TIMEOUT_SECONDS", 60, 1)),
    )


P = TypeVar("P")


def policy_from(cls: type[P], settings: Settings, **given: Any) -> P:
    """The policy dataclass `cls`, each field from the setting of the same name unless `given`."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    taken = {name: getattr(settings, name) for name in names if hasattr(settings, name)}
    return cls(**{**taken, **given})


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read every setting; raise SettingsError naming the first bad one."""
    env = os.environ if env is None else env
    state, orders, servicebus = _connections(env)
    shard_count, shard_index = _shard(env)
    registry = _registry(env)
    return Settings(
        state_account=state,
        orders_account=orders,
        servicebus=servicebus,
        state_database=env.get("STATE_DATABASE_NAME") or "orderprocessing",
        state_container=env.get("STATE_CONTAINER_NAME") or "orderState",
        recovery_index_container=env.get("RECOVERY_INDEX_CONTAINER_NAME") or "recoveryIndex",
        recovery_index_shards=int_setting(env, "RECOVERY_INDEX_SHARDS", 16, 1, 999),
        orders_database=env.get("ORDERS_DATABASE_NAME") or "orders",
        orders_container=env.get("ORDERS_CONTAINER_NAME") or "orders",
        reply_queues={app: queue for app, (queue, _) in registry.items()},
        progress_apps=frozenset(app for app, (_, progress) in registry.items() if progress),
        ingress_queues=ingress_queues(env),
        pending_backlog_limit=int_setting(env, "PENDING_BACKLOG_LIMIT", 5000, 0),
        backlog_gauge_max_age=timedelta(
            seconds=int_setting(env, "BACKLOG_GAUGE_MAX_AGE_SECONDS", 300, 0)
        ),
        max_order_bytes=int_setting(env, "MAX_ORDER_BYTES", 64 * 1024, 1024),
        max_processing=int_setting(env, "MAX_PROCESSING", 500, 1),
        step_timeout=timedelta(seconds=int_setting(env, "STEP_TIMEOUT_SECONDS", 60, 1)),
        starter_batch_size=int_setting(env, "STARTER_BATCH_SIZE", 50, 1),
        starter_max_batches=int_setting(env, "STARTER_MAX_BATCHES", 10, 1),
        starter_run_budget=timedelta(seconds=int_setting(env, "STARTER_RUN_BUDGET_SECONDS", 4, 1)),
        starter_count_interval=timedelta(
            seconds=int_setting(env, "STARTER_COUNT_INTERVAL_SECONDS", 0, 0)
        ),
        alert_window=timedelta(seconds=int_setting(env, "ALERT_WINDOW_SECONDS", 60, 1)),
        supervisor_page_size=int_setting(env, "SUPERVISOR_PAGE_SIZE", 100, 1),
        supervisor_max_pages=int_setting(env, "SUPERVISOR_MAX_PAGES", 20, 1),
        supervisor_run_budget=timedelta(
            seconds=int_setting(env, "SUPERVISOR_RUN_BUDGET_SECONDS", 8, 1)
        ),
        supervisor_scan=_choice(env, "SUPERVISOR_SCAN", ("query", "index"), "query"),
        retry=_retry_policy(env),
        managed_identity_client_id=env.get("AZURE_CLIENT_ID") or None,
        inline_steps=tuple(n.strip() for n in env.get("INLINE_STEPS", "").split(",") if n.strip()),
        create_containers=_bool(env, "COSMOS_CREATE_CONTAINERS", False),
        agent_keys=key_ring(env, AGENT_SIGNING_KEYS),
        reply_token_keys=key_ring(env, REPLY_TOKEN_KEYS),
        shard_count=shard_count,
        shard_index=shard_index,
    )


# Set by App Service and Functions wherever a managed identity can be used.
MANAGED_IDENTITY_ENDPOINTS = ("IDENTITY_ENDPOINT", "MSI_ENDPOINT")
# Set by App Service / Functions in Azure, never by the local stack.
AZURE_HINTS = ("WEBSITE_SITE_NAME", *MANAGED_IDENTITY_ENDPOINTS)


def in_azure(env: Mapping[str, str] | None = None) -> bool:
    return any((os.environ if env is None else env).get(name) for name in AZURE_HINTS)


def azure_credential(client_id: str | None, env: Mapping[str, str] | None = None) -> Any:
    """The async token credential for identity-based connections, which the
    caller closes. In Azure, with the app's identity named: a
    ManagedIdentityCredential for exactly it (no chain is probed, so a wrong
    setting fails with that identity's error); elsewhere DefaultAzureCredential."""
    env = os.environ if env is None else env
    if client_id and any(env.get(name) for name in MANAGED_IDENTITY_ENDPOINTS):
        from azure.identity.aio import ManagedIdentityCredential

        return ManagedIdentityCredential(client_id=client_id)
    from azure.identity.aio import DefaultAzureCredential

    return DefaultAzureCredential()


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process's settings, read once."""
    return load_settings()
