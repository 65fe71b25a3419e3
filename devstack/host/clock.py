"""Time for timers and schedules: the wall clock, or a clock tests move by hand.

Durable timers and timer-trigger schedules read `Clock.now()`; waiting is done with
`Clock.wait(deadline)`, which a controllable clock ends as soon as it is advanced past
the deadline. Leases and locks use real time on purpose: they protect against dead
processes, which a test clock must not fake.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

# What a dispatch loop waits for (`Clock.wait(topic=...)`, `Clock.poke(...)`).
ORCHESTRATIONS = "orchestrations"  # inbox messages: starts, events, results, timers
ACTIVITIES = "activities"  # activity work items
ENTITIES = "entities"  # entity operations


class Clock:
    """Real UTC time."""

    controllable = False

    # `datetime.now(UTC)` itself rather than a method around it (a partial does not bind
    # `self`): the host reads the clock some thirty times an order.
    now: Callable[[], datetime] = functools.partial(datetime.now, UTC)

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    async def wait(self, deadline: datetime | None, *, max_wait: float, topic: str = "") -> None:
        """Sleep until `deadline`, at most `max_wait` seconds, or until the clock moves or
        work of `topic` arrives (`poke`)."""
        timeout = max_wait
        if deadline is not None:
            timeout = max(0.0, min(max_wait, (deadline - self.now()).total_seconds()))
        await self._sleep(timeout, topic)

    async def _sleep(self, timeout: float, topic: str) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(topic, set())
        waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            waiters.discard(fut)

    def poke(self, *topics: str) -> None:
        """Wake the waiters of `topics` (new work of that kind arrived), or every waiter
        when none is named (time moved, the host stops). Call from the host's loop.

        Named wake-ups keep a dispatch loop from re-reading the hub for work of another kind
        each time some arrives (the activity loop looked for activities after each episode,
        activity result and event: several idle queries per order)."""
        for topic, waiters in self._waiters.items():
            if topics and topic not in topics:
                continue
            for fut in list(waiters):
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

    async def wait(self, deadline: datetime | None, *, max_wait: float, topic: str = "") -> None:
        # Never sleep toward a deadline in real time: only an advance (or new work) ends the wait.
        if deadline is not None and deadline <= self._now:
            await asyncio.sleep(0)
            return
        await self._sleep(max_wait, topic)

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
