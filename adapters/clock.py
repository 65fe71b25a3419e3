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

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        """Whether `event` is set within `seconds`: a wait for another task of
        this process, which returns as soon as that task sets it."""
        ...


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        return await wait_event(event, seconds)


SYSTEM_CLOCK = SystemClock()
