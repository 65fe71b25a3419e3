"""What Submit reads of the app's settings, and nothing else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from adapters.settings import Settings, policy_from


@dataclass(frozen=True)
class SubmitPolicy:
    """Each field is the setting of the same name (its default is Settings')."""

    reply_queues: Mapping[str, str]
    pending_backlog_limit: int
    backlog_gauge_max_age: timedelta
    max_order_bytes: int
    max_processing: int
    shard_count: int
    shard_index: int

    @classmethod
    def from_settings(cls, settings: Settings) -> SubmitPolicy:
        return policy_from(cls, settings)
