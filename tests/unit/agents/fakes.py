"""Fakes behind the Agent's own ports: a remote service that answers from a
script, and a clock that moves only when someone sleeps on it (or a call
takes time), so deadlines are tested without real waiting."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agents.ports import RemoteCall

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


class FakeClock:
    def __init__(self, now: datetime = T0, overshoot: float = 0.0) -> None:
        self._now = now
        self.sleeps: list[float] = []
        self.overshoot = overshoot  # a loaded machine wakes sleepers late

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds + self.overshoot)


@dataclass
class Made:
    call: RemoteCall
    timeout: float
    at: datetime


@dataclass
class Outcome:
    """One scripted answer: raise `error`, else return `result`; the call
    takes `takes` seconds of fake time either way."""

    result: dict[str, Any] | None = None
    error: Exception | None = None
    takes: float = 0.0


@dataclass
class FakeRemote:
    clock: FakeClock
    script: list[Outcome] = field(default_factory=list)
    default: Outcome = field(default_factory=lambda: Outcome(result={"Reference": "R-1"}))
    calls: list[Made] = field(default_factory=list)

    async def call(self, call: RemoteCall, *, timeout: float) -> dict[str, Any]:
        self.calls.append(Made(call, timeout, self.clock.now()))
        outcome = self.script.pop(0) if self.script else self.default
        self.clock.advance(outcome.takes)
        if outcome.error is not None:
            raise outcome.error
        return dict(outcome.result or {})
