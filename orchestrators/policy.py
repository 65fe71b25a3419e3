"""What the Starter reads of the app's settings, and nothing else: its batch
and time limits, the attempt's step timeout and the retry policy. Built from
Settings by the composition root (bootstrap)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from adapters.settings import Settings
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

    @classmethod
    def from_settings(cls, settings: Settings) -> StarterPolicy:
        return cls(
            backlog_gauge_max_age=settings.backlog_gauge_max_age,
            max_processing=settings.max_processing,
            step_timeout=settings.step_timeout,
            starter_batch_size=settings.starter_batch_size,
            starter_max_batches=settings.starter_max_batches,
            starter_run_budget=settings.starter_run_budget,
            retry=settings.retry,
        )
