"""Entity definitions for the emulator, read from a file shaped like the
official Service Bus emulator's Config.json.

One file serves both emulators: `UserConfig.Namespaces[].Queues[]` and
`Topics[]` (with `Subscriptions[]` and their `Rules[]`), each with `Name` and
`Properties`, in the official emulator's schema (its installer's
`Config-schema.json`). Properties the official emulator knows are honoured;
two extensions exist only here, because the official emulator has no size
limit worth testing against:

- `MaxSizeInMegabytes` (Azure's own queue property): total encoded size of all
  messages held by the queue, its scheduled and deferred messages and its
  dead-letter queue. A send that would pass it fails with a quota error.
- `MaxMessageCount` (emulator-only): the same limit counted in messages; handy
  for tests because it does not need megabytes of payload.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .filters import (
    CorrelationFilter,
    FilterSyntaxError,
    Rule,
    SqlAction,
    SqlFilter,
    TrueFilter,
)

DEFAULT_LOCK_DURATION_S = 60.0
DEFAULT_MAX_DELIVERY_COUNT = 10
DEFAULT_TTL_S = 14 * 24 * 3600.0  # the official emulator's ceiling for a message's TTL
DEFAULT_DUPLICATE_WINDOW_S = 600.0
# Azure's range for DuplicateDetectionHistoryTimeWindow: "Max value is 7 days and minimum is
# 20 seconds" (QueueProperties.DuplicateDetectionHistoryTimeWindow, Azure.Messaging.ServiceBus
# .Administration). Azure refuses an entity outside it; so does this emulator.
MIN_DUPLICATE_WINDOW_S = 20.0
MAX_DUPLICATE_WINDOW_S = 7 * 86400.0
DEFAULT_MAX_SIZE_MB = 1024

_DURATION = re.compile(
    r"^P(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)


class ConfigError(ValueError):
    """The config file is missing, malformed or names a queue twice."""


def parse_duration(text: str) -> float:
    """Seconds in an ISO 8601 duration such as `PT1M`, `P1D` or `PT0.5S`.

    Args:
        text: The duration as written in Config.json.

    Returns:
        The duration in seconds.
    """
    match = _DURATION.match(text.strip())
    if not match or text.strip() in ("P", "PT"):
        raise ConfigError(f"not an ISO 8601 duration: {text!r}")
    parts = {k: float(v) for k, v in match.groupdict().items() if v}
    return (
        parts.get("days", 0.0) * 86400
        + parts.get("hours", 0.0) * 3600
        + parts.get("minutes", 0.0) * 60
        + parts.get("seconds", 0.0)
    )


@dataclass(frozen=True)
class QueueSettings:
    """The behaviour of one queue, in seconds and counts.

    Attributes:
        name: The queue's name as configured (matching is case-insensitive).
        lock_duration: How long a peek-lock holds a message.
        max_delivery_count: Deliveries after which a message is dead-lettered.
        default_ttl: Time to live of a message that does not set a shorter one.
        dead_letter_on_expiration: Expired messages go to the dead-letter queue.
        requires_duplicate_detection: Drop a send whose MessageId was seen within the window.
        duplicate_window: The duplicate-detection history window.
        max_size_bytes: Limit on the total size of held messages.
        max_message_count: Limit on the number of held messages, or None.
        requires_session: Messages need a SessionId and are received through session receivers.
        forward_to: Entity that every accepted message is forwarded to, or None.
        forward_dead_lettered_to: Entity that dead-lettered messages go to instead of the DLQ.
        dead_letter_on_filter_exceptions: A subscription dead-letters a message whose rule
            evaluation fails (else the failing rule does not match).
        rules: A subscription's rules (empty for a queue).
    """

    name: str
    lock_duration: float = DEFAULT_LOCK_DURATION_S
    max_delivery_count: int = DEFAULT_MAX_DELIVERY_COUNT
    default_ttl: float = DEFAULT_TTL_S
    dead_letter_on_expiration: bool = False
    requires_duplicate_detection: bool = False
    duplicate_window: float = DEFAULT_DUPLICATE_WINDOW_S
    max_size_bytes: int = DEFAULT_MAX_SIZE_MB * 1024 * 1024
    max_message_count: int | None = None
    requires_session: bool = False
    forward_to: str | None = None
    forward_dead_lettered_to: str | None = None
    dead_letter_on_filter_exceptions: bool = True
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class TopicSettings:
    """A topic and its subscriptions.

    Attributes:
        name: The topic's name.
        default_ttl: Time to live of a message that does not set a shorter one.
        requires_duplicate_detection: Drop a send whose MessageId was seen within the window.
        duplicate_window: The duplicate-detection history window.
        subscriptions: Each subscription as queue settings named `topic/Subscriptions/name`.
    """

    name: str
    default_ttl: float = DEFAULT_TTL_S
    requires_duplicate_detection: bool = False
    duplicate_window: float = DEFAULT_DUPLICATE_WINDOW_S
    subscriptions: tuple[QueueSettings, ...] = ()


#: CorrelationFilter keys of Config.json -> SQL system property names (lower case).
_CORRELATION_KEYS = {
    "ContentType": "contenttype",
    "CorrelationId": "correlationid",
    "Label": "label",
    "Subject": "label",
    "MessageId": "messageid",
    "ReplyTo": "replyto",
    "ReplyToSessionId": "replytosessionid",
    "SessionId": "sessionid",
    "To": "to",
}


def _rule(owner: str, entry: dict[str, Any]) -> Rule:
    name = entry.get("Name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{owner}: rule without a Name: {entry!r}")
    props = entry.get("Properties") or {}
    kind = props.get("FilterType")
    where = f"{owner} rule {name!r}"
    try:
        if kind == "Sql":
            expression = (props.get("SqlFilter") or {}).get("SqlExpression")
            if not isinstance(expression, str):
                raise ConfigError(f"{where}: FilterType Sql needs SqlFilter.SqlExpression")
            rule_filter: Any = SqlFilter.parse(expression)
        elif kind == "Correlation":
            spec = props.get("CorrelationFilter") or {}
            unknown = set(spec) - set(_CORRELATION_KEYS) - {"Properties"}
            if unknown or not spec:
                raise ConfigError(
                    f"{where}: CorrelationFilter needs one of {sorted(_CORRELATION_KEYS)} "
                    f"or Properties (unknown: {sorted(unknown)})"
                )
            system = {_CORRELATION_KEYS[k]: v for k, v in spec.items() if k in _CORRELATION_KEYS}
            if "label" in system:
                system["subject"] = system["label"]
            rule_filter = CorrelationFilter(system, dict(spec.get("Properties") or {}))
        else:
            raise ConfigError(f"{where}: FilterType must be Sql or Correlation, not {kind!r}")
        action_text = (props.get("Action") or {}).get("SqlExpression")
        action = SqlAction.parse(action_text) if action_text else None
    except FilterSyntaxError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return Rule(name, rule_filter, action)


def _topic_settings(entry: dict[str, Any]) -> TopicSettings:
    name = entry.get("Name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"topic without a Name: {entry!r}")
    props = entry.get("Properties") or {}
    ttl = (
        parse_duration(props["DefaultMessageTimeToLive"])
        if props.get("DefaultMessageTimeToLive")
        else DEFAULT_TTL_S
    )
    subscriptions = []
    seen: set[str] = set()
    for sub in entry.get("Subscriptions") or []:
        base = _queue_settings(sub)
        if base.name.lower() in seen:
            raise ConfigError(f"topic {name!r}: subscription {base.name!r} is declared twice")
        seen.add(base.name.lower())
        owner = f"subscription {name}/{base.name}"
        rules = tuple(_rule(owner, r) for r in sub.get("Rules") or [])
        subscriptions.append(
            replace(
                base,
                name=f"{name}/Subscriptions/{base.name}",
                # A message lives no longer than the topic's default allows either.
                default_ttl=min(base.default_ttl, ttl),
                rules=rules or (Rule("$Default", TrueFilter()),),
            )
        )
    return TopicSettings(
        name=name,
        default_ttl=ttl,
        requires_duplicate_detection=bool(props.get("RequiresDuplicateDetection", False)),
        duplicate_window=_duplicate_window(f"topic {name!r}", props),
        subscriptions=tuple(subscriptions),
    )


def _duplicate_window(owner: str, props: dict[str, Any]) -> float:
    """The entity's DuplicateDetectionHistoryTimeWindow in seconds, within Azure's range."""
    text = props.get("DuplicateDetectionHistoryTimeWindow")
    if not text:
        return DEFAULT_DUPLICATE_WINDOW_S
    seconds = parse_duration(text)
    if not MIN_DUPLICATE_WINDOW_S <= seconds <= MAX_DUPLICATE_WINDOW_S:
        raise ConfigError(
            f"{owner}: DuplicateDetectionHistoryTimeWindow {text} is outside Azure's range, "
            "20 seconds (PT20S) to 7 days (P7D)"
        )
    return seconds


def _queue_settings(entry: dict[str, Any]) -> QueueSettings:
    name = entry.get("Name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"queue without a Name: {entry!r}")
    props = entry.get("Properties") or {}

    def duration(key: str, default: float) -> float:
        value = props.get(key)
        return parse_duration(value) if value else default

    max_count = props.get("MaxMessageCount")
    return QueueSettings(
        name=name,
        lock_duration=duration("LockDuration", DEFAULT_LOCK_DURATION_S),
        max_delivery_count=int(props.get("MaxDeliveryCount", DEFAULT_MAX_DELIVERY_COUNT)),
        default_ttl=duration("DefaultMessageTimeToLive", DEFAULT_TTL_S),
        dead_letter_on_expiration=bool(props.get("DeadLetteringOnMessageExpiration", False)),
        requires_duplicate_detection=bool(props.get("RequiresDuplicateDetection", False)),
        duplicate_window=_duplicate_window(f"queue {name!r}", props),
        max_size_bytes=int(props.get("MaxSizeInMegabytes", DEFAULT_MAX_SIZE_MB)) * 1024 * 1024,
        max_message_count=int(max_count) if max_count is not None else None,
        requires_session=bool(props.get("RequiresSession", False)),
        # The official emulator writes "" for "no forwarding".
        forward_to=props.get("ForwardTo") or None,
        forward_dead_lettered_to=props.get("ForwardDeadLetteredMessagesTo") or None,
        dead_letter_on_filter_exceptions=bool(
            props.get("DeadLetteringOnFilterEvaluationExceptions", True)
        ),
    )


def parse_config(document: dict[str, Any]) -> list[QueueSettings | TopicSettings]:
    """The queues and topics of every namespace in a Config.json document."""
    try:
        namespaces = document["UserConfig"]["Namespaces"]
    except (KeyError, TypeError) as exc:
        raise ConfigError("expected UserConfig.Namespaces[]") from exc
    entities: list[QueueSettings | TopicSettings] = []
    seen: set[str] = set()
    for namespace in namespaces:
        declared: list[QueueSettings | TopicSettings] = [
            _queue_settings(entry) for entry in namespace.get("Queues") or []
        ]
        declared += [_topic_settings(entry) for entry in namespace.get("Topics") or []]
        for settings in declared:
            key = settings.name.lower()
            if key in seen:
                raise ConfigError(f"entity {settings.name!r} is declared twice")
            seen.add(key)
            entities.append(settings)
    _check_forwarding(entities, seen)
    return entities


def _check_forwarding(entities: list[QueueSettings | TopicSettings], names: set[str]) -> None:
    """Forwarding targets must be queues or topics of the file, never the entity itself."""
    queues: list[QueueSettings] = []
    for settings in entities:
        if isinstance(settings, TopicSettings):
            queues.extend(settings.subscriptions)
        else:
            queues.append(settings)
    for queue in queues:
        for key, target in (
            ("ForwardTo", queue.forward_to),
            ("ForwardDeadLetteredMessagesTo", queue.forward_dead_lettered_to),
        ):
            if target is None:
                continue
            if target.lower() not in names:
                raise ConfigError(f"{queue.name!r}: {key} names no queue or topic: {target!r}")
            if target.lower() == queue.name.lower():
                raise ConfigError(f"{queue.name!r}: {key} cannot name the entity itself")


def load_config(path: str | Path) -> list[QueueSettings | TopicSettings]:
    """Read and parse a Config.json file."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    return parse_config(document)
