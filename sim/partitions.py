"""Writes per partition key per simulated second, for the recovery index's
hot-partition check (issue 23 item 3, docs/adr/019b-sharded-recovery-index.md).

`PartitionWrites(container)` counts every document a simulation container
writes or deletes (an upsert, a create, a replace, each delete of a batch) by
its partition key value and the simulated second it happened in. A Cosmos
logical partition is served by one physical partition (at most 10,000 RU/s),
so the most writes one key takes in one second is what a hot key would show.

`drive_index(rate, ...)` is the load the simulation's schedules (three
orders) are too small for: orders claimed at `rate` per simulated second
against the real `CosmosRecoveryIndex` on the simulation's Cosmos fake, each
attempt's entry added at its claim and discarded when it ends, as workflow 2.0
does. Used by tests/sim/test_hot_partition.py and bench/index_partitions.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from adapters.recovery_index import CosmosRecoveryIndex

from .cosmos import SimContainer
from .world import FaultConfig, World


class PartitionWrites:
    """Counts writes and deletes of `container` per (partition key, simulated
    second). Chains the container's own hooks (set them before this)."""

    def __init__(self, container: SimContainer, key: str = "bucket") -> None:
        self.counts: Counter[tuple[str, int]] = Counter()
        self._container = container
        self._key = key
        wrote, deleted = container.on_write, container.on_delete

        def on_write(old: dict | None, new: dict) -> None:
            self._count(new)
            if wrote is not None:
                wrote(old, new)

        def on_delete(doc: dict) -> None:
            self._count(doc)
            if deleted is not None:
                deleted(doc)

        container.on_write = on_write
        container.on_delete = on_delete

    def _count(self, doc: dict[str, Any]) -> None:
        second = int(self._container.world.clock.now.timestamp())
        self.counts[(str(doc.get(self._key)), second)] += 1

    def peak(self) -> int:
        """The most writes one partition key took in one simulated second."""
        return max(self.counts.values(), default=0)

    def summary(self) -> dict[str, float]:
        seconds = {s for _, s in self.counts}
        total = sum(self.counts.values())
        return {
            "writes": total,
            "keys": len({k for k, _ in self.counts}),
            "peak_per_key_second": self.peak(),
            # writes per busy key-second, and per second over all keys
            "mean_per_key_second": total / len(self.counts) if self.counts else 0.0,
            "writes_per_second": total / len(seconds) if seconds else 0.0,
        }


START = datetime(2026, 11, 30, 8, 0, 30, tzinfo=UTC)


@dataclass
class Load:
    rate: int
    shards: int
    seconds: int
    summary: dict[str, float]


def drive_index(
    rate: int,
    shards: int,
    seconds: int = 120,
    claim_timeout: timedelta = timedelta(seconds=30),
    run_time: timedelta = timedelta(seconds=5),
    discard_batch: int = 25,
) -> Load:
    """`rate` orders claimed per simulated second for `seconds`: each adds its
    entry at claim time + `claim_timeout` (workflow 2.0's earliest deadline)
    and discards it `run_time` later, through one `CosmosRecoveryIndex` per
    host second (as each activity process keeps its own discard batch). No
    faults: the figure is the load's shape, not the fault handling."""
    world = World(0, FaultConfig(), frozenset())
    world.clock.now = START
    container = SimContainer(world, "index", "/bucket")
    writes = PartitionWrites(container)
    wakes: list[tuple[datetime, Any]] = []  # the index's timed flushes, on the world's clock
    index = CosmosRecoveryIndex(
        container,
        shards=shards,
        discard_batch=discard_batch,
        wake=lambda delay, flush: wakes.append((world.clock.now + timedelta(seconds=delay), flush)),
    )

    async def main() -> None:
        pending: list[tuple[datetime, str, datetime]] = []  # (ends at, order, deadline)
        n = 0
        for second in range(seconds + int(run_time.total_seconds()) + 1):
            now = START + timedelta(seconds=second)
            world.clock.now = now
            if second < seconds:
                for _ in range(rate):
                    oid = f"webshop:ORD-{n}"
                    n += 1
                    deadline = now + claim_timeout
                    await index.add(oid, deadline, 1)
                    pending.append((now + run_time, oid, deadline))
            due = [p for p in pending if p[0] <= now]
            pending = [p for p in pending if p[0] > now]
            for _, oid, deadline in due:
                await index.discard(oid, deadline)
            for wake in [w for w in wakes if w[0] <= now]:
                wakes.remove(wake)
                await wake[1]()
        await index.flush()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return Load(rate, shards, seconds, writes.summary())
