"""What the Scheduler's activities read of the app's settings, and nothing
else, built from Settings by the composition root."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from adapters.settings import Settings, policy_from
from domain.signing import SchedulerKeys
from domain.state_machine import RetryPolicy


def _no_keys() -> SchedulerKeys:
    raise LookupError("no scheduler keys: build the policy from Settings")


@dataclass(frozen=True)
class ActivityPolicy:
    step_timeout: timedelta = timedelta(seconds=60)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    progress_apps: frozenset[str] = frozenset()
    # Read when a request is sealed, so a missing key is a SettingsError
    # naming the setting there, not when the policy is built.
    scheduler_keys: Callable[[], SchedulerKeys] = _no_keys

    @classmethod
    def from_settings(cls, settings: Settings) -> ActivityPolicy:
        return policy_from(cls, settings, progress_apps=frozenset(settings.progress_apps))
