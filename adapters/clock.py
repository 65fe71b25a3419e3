"""The one clock of function code (never of orchestrator code, which reads
`context.current_utc_datetime`): aware UTC time and a sleep, behind one
protocol, so tests and the simulation give every component their own time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Aware UTC time, comparable with deadlines and record times."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = SystemClock()
