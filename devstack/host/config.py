"""Settings and host.json, read the way `func start` reads them.

`local.settings.json` ``Values`` become environment variables unless the environment
already has them (as Core Tools does). host.json gives the Service Bus and Durable
settings the host honours.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import HostError

# The app setting that overrides host.json's durableTask defaultVersion on
# Azure Functions (any host.json value can be set as AzureFunctionsJobHost__<path>).
# This host does not read it; it sets it for the app to the version it runs new
# instances on.
DEFAULT_VERSION_SETTING = "AzureFunctionsJobHost__extensions__durableTask__defaultVersion"


def load_local_settings(path: str | None) -> dict[str, str]:
    """Export local.settings.json Values into os.environ (environment wins) and return them."""
    if not path:
        return {}
    p = Path(path)
    if not p.exists():
        raise HostError(f"settings file {path} not found")
    try:
        data = json.loads(p.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise HostError(f"settings file {path} is not valid JSON: {exc}") from None
    values = data.get("Values") or {}
    for key, value in values.items():
        if key not in os.environ and value is not None:
            os.environ[key] = str(value)
    return {k: str(v) for k, v in values.items()}


def setting(name: str, *, purpose: str) -> str:
    """Return an app setting or raise a one-line HostError naming it and why it is needed."""
    value = os.environ.get(name)
    if value is None or value == "":
        raise HostError(
            f"missing app setting {name!r} ({purpose}); set it in local.settings.json or the environment"
        )
    return value


_EXPR = re.compile(r"%([^%]+)%")


def resolve_binding_expression(value: str, *, purpose: str) -> str:
    """Resolve ``%Setting%`` app-setting expressions, as the host does for queue names and schedules."""
    return _EXPR.sub(lambda m: setting(m.group(1), purpose=purpose), value)


def _timespan_seconds(value: Any, default: float) -> float:
    """Parse a .NET TimeSpan string (``[d.]hh:mm:ss[.fff]``) into seconds."""
    if value is None:
        return default
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value)
    days = 0
    if "." in text.split(":")[0]:
        d, text = text.split(".", 1)
        days = int(d)
    parts = text.split(":")
    if len(parts) != 3:
        raise HostError(f"host.json: {value!r} is not a TimeSpan (hh:mm:ss)")
    h, m, s = parts
    return days * 86400 + int(h) * 3600 + int(m) * 60 + float(s)


@dataclass
class ServiceBusOptions:
    max_concurrent_calls: int = 16
    prefetch_count: int = 0
    auto_complete_messages: bool = True
    max_auto_lock_renewal_seconds: float = 300.0
    # Sessions (extension 5.x defaults): sessions held at once; how long a session without a
    # message stays open (the session processor's TryTimeout, 60 s, when not set).
    max_concurrent_sessions: int = 8
    session_idle_timeout_seconds: float = 60.0
    # Batches (cardinality many).
    max_message_batch_size: int = 1000
    min_message_batch_size: int = 1
    max_batch_wait_seconds: float = 30.0


@dataclass
class DurableOptions:
    hub_name: str = "TestHubName"
    default_version: str = ""
    max_concurrent_activities: int = 10
    max_concurrent_orchestrators: int = 10
    # The documented defaults (durable-functions-orchestration-versioning): CurrentOrOlder, Reject.
    version_match: str = "CurrentOrOlder"  # None | Strict | CurrentOrOlder
    version_failure: str = "Reject"  # Reject | Fail


@dataclass
class QueueOptions:
    """host.json `extensions.queues`, with the Storage extension's documented defaults."""

    max_polling_seconds: float = 60.0
    visibility_timeout_seconds: float = 0.0
    batch_size: int = 16
    max_dequeue_count: int = 5
    new_batch_threshold: int | None = None  # default batch_size / 2
    message_encoding: str = "base64"  # base64 | none


@dataclass
class HostConfig:
    service_bus: ServiceBusOptions
    durable: DurableOptions
    raw: dict[str, Any]
    queues: QueueOptions = field(default_factory=QueueOptions)


def load_host_json(path: str | None) -> HostConfig:
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if p.exists():
            try:
                data = json.loads(p.read_text(encoding="utf-8-sig"))
            except json.JSONDecodeError as exc:
                raise HostError(f"host.json {path} is not valid JSON: {exc}") from None
    ext = data.get("extensions") or {}
    sb = ext.get("serviceBus") or {}
    mh = sb.get("messageHandlerOptions") or {}  # v4 extension shape
    sbo = ServiceBusOptions(
        max_concurrent_calls=int(sb.get("maxConcurrentCalls", mh.get("maxConcurrentCalls", 16))),
        prefetch_count=int(sb.get("prefetchCount", 0)),
        auto_complete_messages=bool(sb.get("autoCompleteMessages", mh.get("autoComplete", True))),
        max_auto_lock_renewal_seconds=_timespan_seconds(
            sb.get("maxAutoLockRenewalDuration", mh.get("maxAutoRenewDuration")), 300.0
        ),
        max_concurrent_sessions=int(
            sb.get(
                "maxConcurrentSessions",
                (sb.get("sessionHandlerOptions") or {}).get("maxConcurrentSessions", 8),
            )
        ),
        session_idle_timeout_seconds=_timespan_seconds(sb.get("sessionIdleTimeout"), 60.0),
        max_message_batch_size=int(
            sb.get(
                "maxMessageBatchSize", (sb.get("batchOptions") or {}).get("maxMessageCount", 1000)
            )
        ),
        min_message_batch_size=int(sb.get("minMessageBatchSize", 1)),
        max_batch_wait_seconds=_timespan_seconds(sb.get("maxBatchWaitTime"), 30.0),
    )
    if sbo.max_concurrent_sessions < 1 or sbo.max_message_batch_size < 1:
        raise HostError(
            "host.json: serviceBus.maxConcurrentSessions and maxMessageBatchSize must be at least 1"
        )
    if sbo.min_message_batch_size > sbo.max_message_batch_size:
        raise HostError(
            "host.json: serviceBus.minMessageBatchSize is larger than maxMessageBatchSize"
        )
    dt = ext.get("durableTask") or {}
    dto = DurableOptions(
        hub_name=str(dt.get("hubName") or "TestHubName"),
        default_version=str(dt.get("defaultVersion") or ""),
        max_concurrent_activities=int(dt.get("maxConcurrentActivityFunctions", 10)),
        max_concurrent_orchestrators=int(dt.get("maxConcurrentOrchestratorFunctions", 10)),
        version_match=str(dt.get("versionMatchStrategy") or "CurrentOrOlder"),
        version_failure=str(dt.get("versionFailureStrategy") or "Reject"),
    )
    if dto.version_match not in ("None", "Strict", "CurrentOrOlder"):
        raise HostError(
            f"host.json: durableTask.versionMatchStrategy {dto.version_match!r} is not None, Strict "
            "or CurrentOrOlder"
        )
    if dto.version_failure not in ("Reject", "Fail"):
        raise HostError(
            f"host.json: durableTask.versionFailureStrategy {dto.version_failure!r} is not Reject or Fail"
        )
    if "%" in dto.hub_name:
        dto.hub_name = resolve_binding_expression(
            dto.hub_name, purpose="durableTask.hubName in host.json"
        )
    q = ext.get("queues") or {}
    qo = QueueOptions(
        max_polling_seconds=_timespan_seconds(q.get("maxPollingInterval"), 60.0),
        visibility_timeout_seconds=_timespan_seconds(q.get("visibilityTimeout"), 0.0),
        batch_size=int(q.get("batchSize", 16)),
        max_dequeue_count=int(q.get("maxDequeueCount", 5)),
        new_batch_threshold=int(q["newBatchThreshold"])
        if q.get("newBatchThreshold") is not None
        else None,
        message_encoding=str(q.get("messageEncoding", "base64")).lower(),
    )
    if qo.message_encoding not in ("base64", "none"):
        raise HostError(
            f"host.json: queues.messageEncoding {qo.message_encoding!r} is not base64 or none"
        )
    if not 1 <= qo.batch_size <= 32:
        raise HostError(f"host.json: queues.batchSize {qo.batch_size} is not between 1 and 32")
    return HostConfig(service_bus=sbo, durable=dto, raw=data, queues=qo)
