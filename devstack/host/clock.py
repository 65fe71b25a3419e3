"""Time for timers and schedules: the wall clock, or a clock tests move by hand.

Durable timers and timer-trigger schedules read `Clock.now()`; waiting is done with
`Clock.wait(deadline)`, which a controllable clock ends as soon as it is advanced past
the deadline. Leases and locks use real time on purpose: they protect against dead
processes, which a test clock must not fake.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


class Clock:
    """Real UTC time."""

    controllable = False

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def wait(self, deadline: datetime | None, *, max_wait: float) -> None:
        """Sleep until `deadline`, at most `max_wait` seconds, or until the clock moves."""
        timeout = max_wait
        if deadline is not None:
            timeout = max(0.0, min(max_wait, (deadline - self.now()).total_seconds()))
        await self._sleep(timeout)

    async def _sleep(self, timeout: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(fut)

    def poke(self) -> None:
        """Wake every waiter (new work arrived, or time moved). Call from the host's loop."""
        for fut in list(self._waiters):
            if not fut.done():
                fut.set_result(None)


class ControllableClock(Clock):
    """A clock that starts at real time and only moves when told to (``advance``/``set``)."""

    controllable = True

    def __init__(self, start: datetime | None = None) -> None:
        super().__init__()
        self._now = start or datetime.now(UTC)

    def now(self) -> datetime:
        return self._now

    async def wait(self, deadline: datetime | None, *, max_wait: float) -> None:
        # Never sleep toward a deadline in real time: only an advance (or new work) ends the wait.
        if deadline is not None and deadline <= self._now:
            await asyncio.sleep(0)
            return
        await self._sleep(max_wait)

    def advance(self, seconds: float) -> datetime:
        self._now = self._now + timedelta(seconds=seconds)
        self.poke()
        return self._now

    def set(self, when: datetime) -> datetime:
        if when < self._now:
            raise ValueError("the clock cannot go backwards")
        self._now = when
        self.poke()
        return self._now
