"""What the Starter reads of the app's settings, and nothing else, with what
its claim puts in the attempt's plan (ADR 021a). Built by the composition root
from Settings and the step catalog."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from adapters.settings import Settings, policy_from
from domain.state_machine import RetryPolicy


@dataclass(frozen=True)
class StarterPolicy:
    backlog_gauge_max_age: timedelta = timedelta(seconds=300)
    max_processing: int = 500
    step_timeout: timedelta = timedelta(seconds=60)
    starter_batch_size: int = 50
    starter_max_batches: int = 10
    starter_run_budget: timedelta = timedelta(seconds=4)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # What the claim marks and plans (ADR 021a).
    steps: tuple[str, ...] = ()
    step_modes: Mapping[str, str] = field(default_factory=dict)
    progress_apps: frozenset[str] = frozenset()

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        steps: tuple[str, ...] | list[str] = (),
        step_modes: Mapping[str, str] | None = None,
    ) -> StarterPolicy:
        return policy_from(
            cls,
            settings,
            steps=tuple(steps),
            step_modes=dict(step_modes or {}),
            progress_apps=frozenset(settings.progress_apps),
        )
