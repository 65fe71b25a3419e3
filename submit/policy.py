"""What Submit reads of the app's settings, and nothing else: its limits and
the registry of client applications. Built from Settings by the composition
root (bootstrap), so Submit depends on these figures, not on every setting."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from adapters.settings import Settings, policy_from


@dataclass(frozen=True)
class SubmitPolicy:
    reply_queues: Mapping[str, str] = field(default_factory=dict)
    pending_backlog_limit: int = 5000
    backlog_gauge_max_age: timedelta = timedelta(seconds=300)
    max_order_bytes: int = 64 * 1024
    max_processing: int = 500
    # Shards as whole deployments (ADR 020e): this deployment's index of SHARD_COUNT.
    shard_count: int = 1
    shard_index: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> SubmitPolicy:
        return policy_from(cls, settings)
