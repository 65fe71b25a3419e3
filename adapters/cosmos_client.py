"""Cosmos DB plumbing shared by the Cosmos adapters: the client, local container
creation, `query_all`, request charges and `translate_error` to the domain's
errors (docs/adr/016-cosmos-client.md)."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from azure.core.exceptions import (
    AzureError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.transport import AioHttpTransport
from azure.cosmos import PartitionKey
from azure.cosmos.aio import ContainerProxy, CosmosClient
from azure.cosmos.documents import ConnectionPolicy, RetryOptions
from azure.cosmos.exceptions import CosmosClientTimeoutError, CosmosHttpResponseError

from adapters.settings import CosmosAccount
from domain import errors

log = logging.getLogger(__name__)

REQUEST_CHARGE = "x-ms-request-charge"
RETRY_AFTER_MS = "x-ms-retry-after-ms"

# The SDK's own 429 retries (default 9, up to 30 s), capped inside our budget (ADR 016).
DEFAULT_THROTTLE_RETRIES = 3
DEFAULT_THROTTLE_MAX_WAIT_SECONDS = 5

# Both containers: every point operation targets one logical partition.
PARTITION_KEY_PATH = "/id"

# The Supervisor's keyset scan: Cosmos needs a composite index matching the
# ORDER BY exactly, the filter's equality property first.
STATE_COMPOSITE_INDEXES: list[list[dict[str, str]]] = [
    [
        {"path": "/ProcessState", "order": "ascending"},
        {"path": "/CompleteBy", "order": "ascending"},
    ],
    [
        {"path": "/ProcessState", "order": "ascending"},
        {"path": "/CompleteBy", "order": "ascending"},
        {"path": "/id", "order": "ascending"},
    ],
]
# Only the paths a query filters or sorts on are indexed (docs/adr/018b):
# every indexed value of a write costs RU. Keep it equal to the fields the
# queries of state_store.py and console_reads.py name (tests/infra/test_cosmos.py).
STATE_QUERIED_PATHS: tuple[str, ...] = (
    "ProcessState",
    "LockedBy",
    "NotBefore",
    "CompleteBy",
    "PendingStatus",
    "ReplyTo",
    "CompensationRequested",
    "AppId",
    "CreatedAt",
    "UpdatedAt",
    "FailureCount",
    "Attempt",
)
STATE_INDEXING_POLICY: dict[str, Any] = {
    "indexingMode": "consistent",
    "automatic": True,
    "includedPaths": [
        # PendingStatus is an object: the outbox filters and sorts on its At.
        {"path": f"/{name}/*" if name == "PendingStatus" else f"/{name}/?"}
        for name in STATE_QUERIED_PATHS
    ],
    "excludedPaths": [{"path": "/*"}],
    "compositeIndexes": STATE_COMPOSITE_INDEXES,
}
# The orders DB is read and written by id only: no index at all.
ORDERS_INDEXING_POLICY: dict[str, Any] = {"indexingMode": "none", "automatic": False}
# TTL on, no default expiry: only records that set `ttl` (terminal ones) expire.
STATE_DEFAULT_TTL = -1


# --- client -------------------------------------------------------------------------


def build_client(
    account: CosmosAccount,
    *,
    credential: Any | None = None,
    throttle_retries: int = DEFAULT_THROTTLE_RETRIES,
    throttle_max_wait_seconds: int = DEFAULT_THROTTLE_MAX_WAIT_SECONDS,
    **client_kwargs: Any,
) -> CosmosClient:
    """A CosmosClient for `account`: one per process, closed at exit. Without
    a key, `credential` authenticates (None: a DefaultAzureCredential the caller
    then owns). `throttle_*`: the SDK's own 429 retries (ADR 016)."""
    if account.key:
        auth: Any = account.key
    elif credential is not None:
        auth = credential
    else:
        from azure.identity.aio import DefaultAzureCredential

        auth = DefaultAzureCredential()
    policy = ConnectionPolicy()
    # Set through the policy: the `retry_throttle_total` keyword treats 0 as unset.
    policy.RetryOptions = RetryOptions(
        max_retry_attempt_count=throttle_retries,
        max_wait_time_in_seconds=throttle_max_wait_seconds,
    )
    kwargs: dict[str, Any] = {"connection_policy": policy, **client_kwargs}
    if "transport" not in kwargs:
        # The default transport reads ~/.netrc and the proxy variables in the thread
        # pool on every request (a seventh of the local host's CPU per order); the
        # proxy is resolved once here, and netrc never applies to Cosmos.
        kwargs["transport"] = AioHttpTransport(use_env_settings=False)
        proxies = _environment_proxies(account.endpoint)
        if proxies and "proxies" not in kwargs:
            kwargs["proxies"] = proxies
    if not account.verify_tls:
        kwargs["connection_verify"] = False
    return CosmosClient(account.endpoint, credential=auth, **kwargs)


def _environment_proxies(endpoint: str) -> dict[str, str]:
    """HTTP(S)_PROXY for `endpoint` as the environment says (NO_PROXY honoured), read once."""
    host = urlsplit(endpoint).hostname or ""
    if not host or urllib.request.proxy_bypass(host):
        return {}
    return {k: v for k, v in urllib.request.getproxies().items() if k in ("http", "https")}


async def ensure_container(
    client: CosmosClient, database: str, container: str, **options: Any
) -> ContainerProxy:
    """Create `database` and its `container` (partition key /id, and `options`
    such as an indexing policy) if absent. Local and dev stacks only."""
    db = await client.create_database_if_not_exists(database)
    return await db.create_container_if_not_exists(
        id=container, partition_key=PartitionKey(path=PARTITION_KEY_PATH), **options
    )


async def ensure_state_container(
    client: CosmosClient, database: str, container: str
) -> ContainerProxy:
    """The state store's container, with its indexes and TTL (local/dev only)."""
    return await ensure_container(
        client,
        database,
        container,
        indexing_policy=STATE_INDEXING_POLICY,
        default_ttl=STATE_DEFAULT_TTL,
    )


async def ensure_orders_container(
    client: CosmosClient, database: str, container: str
) -> ContainerProxy:
    """The orders DB's container, unindexed (local/dev only)."""
    return await ensure_container(
        client, database, container, indexing_policy=ORDERS_INDEXING_POLICY
    )


# --- queries -------------------------------------------------------------------------


async def query_all(
    container: ContainerProxy,
    query: str,
    parameters: Iterable[dict[str, Any]],
    max_items: int | None,
    charges: RequestCharges,
    kind: str,
) -> list[Any]:
    """Every item of one query, read `max_items` a page; each page's charge is
    recorded under `kind`, and an SDK error becomes the domain's (translate_error)."""
    try:
        pages = container.query_items(
            query=query,
            parameters=list(parameters),
            max_item_count=max_items,
            response_hook=charges.hook(kind),
        )
        return [item async for item in pages]
    except SDK_ERRORS as exc:
        raise translate_error(exc, f"{kind} query", charges, kind) from exc


# --- request charges -----------------------------------------------------------------


@dataclass
class KindCharges:
    """What one kind of operation (read, replace, query, ...) has cost so far."""

    calls: int = 0
    request_units: float = 0.0
    failures: int = 0


@dataclass
class RequestCharges:
    """Records the request charge of every call, by operation kind (ADR 016):
    `hook(kind)` is each call's `response_hook`, and `translate_error` records
    failed calls."""

    by_kind: dict[str, KindCharges] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(k.request_units for k in self.by_kind.values())

    @property
    def calls(self) -> int:
        return sum(k.calls for k in self.by_kind.values())

    def record(
        self, kind: str, headers: Mapping[str, Any] | None, status: int | None = None
    ) -> float:
        charge = _charge_from(headers)
        stats = self.by_kind.setdefault(kind, KindCharges())
        stats.calls += 1
        stats.request_units += charge
        if status is not None and status >= 400:
            stats.failures += 1
        return charge

    def hook(self, kind: str) -> Callable[[Mapping[str, Any], Any], None]:
        def _hook(headers: Mapping[str, Any], _result: Any) -> None:
            self.record(kind, headers)

        return _hook


def _charge_from(headers: Mapping[str, Any] | None) -> float:
    if not headers:
        return 0.0
    raw = headers.get(REQUEST_CHARGE)
    if raw is None:  # a plain dict of headers is case-sensitive
        raw = next((v for k, v in headers.items() if k.lower() == REQUEST_CHARGE), None)
    try:
        return float(raw) if raw is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


# --- errors --------------------------------------------------------------------------

TRANSIENT_STATUSES = frozenset({408, 429, 449, 500, 502, 503, 504})


def _retry_after(headers: Mapping[str, Any] | None) -> float | None:
    if not headers:
        return None
    raw = headers.get(RETRY_AFTER_MS)
    try:
        return float(raw) / 1000.0 if raw is not None else None
    except (TypeError, ValueError):
        return None


def translate_error(
    exc: BaseException,
    what: str,
    charges: RequestCharges | None = None,
    kind: str | None = None,
) -> errors.DomainError:
    """The domain error for an SDK exception (caller raises it `from exc`):
    404 NotFound, 409 Conflict, 412 Stale, 408/429/449/5xx and timeouts
    Transient (with the retry-after), any other status Permanent (ADR 016)."""
    if isinstance(exc, CosmosHttpResponseError):
        status = exc.status_code
        if charges is not None and kind is not None:
            charges.record(kind, exc.headers, status)
        if status == 404:
            return errors.NotFoundError(f"{what}: not found")
        if status == 409:
            return errors.ConflictError(f"{what}: already exists")
        if status == 412:
            return errors.StaleError(f"{what}: changed since it was read (etag mismatch)")
        if status in TRANSIENT_STATUSES or not status:  # 0: no HTTP answer at all
            return errors.TransientError(
                f"{what}: Cosmos DB answered {status} ({_reason(exc)})",
                retry_after=_retry_after(exc.headers),
            )
        return errors.PermanentError(f"{what}: Cosmos DB answered {status} ({_reason(exc)})")
    if isinstance(
        exc,
        CosmosClientTimeoutError
        | ServiceRequestTimeoutError
        | ServiceResponseTimeoutError
        | ServiceRequestError
        | ServiceResponseError
        | asyncio.TimeoutError
        | ConnectionError,
    ):
        return errors.TransientError(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, AzureError):
        return errors.PermanentError(f"{what}: {type(exc).__name__}: {exc}")
    raise TypeError(f"not an SDK error: {exc!r}") from exc


def _reason(exc: CosmosHttpResponseError) -> str:
    message = (exc.message or str(exc)).strip().splitlines()
    return message[0][:200] if message else "no message"


SDK_ERRORS: tuple[type[BaseException], ...] = (
    AzureError,
    asyncio.TimeoutError,
    ConnectionError,
)
