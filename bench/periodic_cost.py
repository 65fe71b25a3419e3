"""The periodic work priced from the queries it runs: the Starter's tick, the
outbox scan and the Supervisor's tick, per tick and per hour, at a backlog of
N records in one shard's state container.

Each query is charged by the model's published rules (bench/limits.yaml,
cosmos.ru_model): a query costs `query_base_ru` on every physical partition it
fans out to, plus a point read of every document it returns; a COUNT answered
from the index costs `count_ru_per_entry` for every index entry it matches. A
physical partition holds at most 50 GB and 10,000 RU/s, so a container has
max(ceil(max RU/s / 10,000), ceil(GB / 50)) of them.

Which queries a tick runs (orchestrators/starter.py, supervisor/):

- Starter, every tick: the claimable query (TOP batch; one page when nothing
  is Pending). Every `count_interval_s` (the backlog counts' interval; the
  tick itself when it is the Starter's interval): COUNT Pending, COUNT
  Processing, the gauge's upsert, the compensation requests (TOP batch) and
  one page of Compensating records (TOP batch).
- Outbox, every `outbox_interval_s` (a third of the status grace): the unsent
  statuses (TOP batch, ORDER BY the entry's time).
- Supervisor (index scan), every tick: MIN(bucket) of the index container and
  one page of the due bucket; its checkpoint's read and write. The query scan
  instead pages the state container's expired Processing records (TOP page).

What grows with the backlog: only the two COUNTs, by the entries they match
(Pending is bounded by Submit's admission limit, Processing by MAX_PROCESSING,
the container's size only through its physical partitions). Everything else is
TOP n: bounded by n whatever the backlog.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GB = 1e9


@dataclass(frozen=True)
class Backlog:
    """One shard's state container: `records` documents of `doc_bytes`, of
    which `pending` are Pending and `processing` Processing."""

    records: int
    doc_bytes: int
    pending: int
    processing: int

    @classmethod
    def of(cls, records: int, doc_bytes: int, pending_limit: int, max_processing: int) -> Backlog:
        """A backlog as the bench seeds it (a tenth Pending, a hundredth
        Processing), within what admission and MAX_PROCESSING let in."""
        return cls(
            records,
            doc_bytes,
            min(records // 10, pending_limit),
            min(records // 100, max_processing),
        )


@dataclass(frozen=True)
class Query:
    name: str
    every_s: float  # how often it runs
    ru: float  # per run
    grows: bool  # its cost grows with the backlog


@dataclass(frozen=True)
class Rules:
    query_base: float
    read_1kb: float
    write_1kb: float
    count_per_entry: float
    partition_gb: float = 50.0
    partition_ru_s: float = 10_000.0

    @classmethod
    def of(cls, limits: dict[str, Any]) -> Rules:
        ru = limits["cosmos"]["ru_model"]
        return cls(
            query_base=float(ru["query_base_ru"]["value"]),
            read_1kb=float(ru["point_read_ru_by_kb"]["value"][0][1]),
            write_1kb=float(ru["write_ru_by_kb"]["value"][0][1]),
            count_per_entry=float(ru["count_ru_per_index_entry"]["value"]),
        )

    def partitions(self, backlog: Backlog, max_ru_s: float) -> int:
        by_size = math.ceil(backlog.records * backlog.doc_bytes / GB / self.partition_gb)
        return max(1, math.ceil(max_ru_s / self.partition_ru_s), by_size)

    def read(self, doc_bytes: int) -> float:
        return self.read_1kb * max(1.0, doc_bytes / 1024)

    def query(self, partitions: int, returned: int, doc_bytes: int) -> float:
        return partitions * self.query_base + returned * self.read(doc_bytes)

    def count(self, partitions: int, matched: int) -> float:
        return partitions * self.query_base + matched * self.count_per_entry


@dataclass(frozen=True)
class Schedule:
    starter_interval_s: float
    supervisor_interval_s: float
    count_interval_s: float  # the Starter's backlog counts and compensation scans
    outbox_interval_s: float
    batch: int


def starter_queries(rules: Rules, b: Backlog, s: Schedule, parts: int) -> list[Query]:
    """A Starter's queries on an idle tick (nothing claimable returned: the
    claims and the reads of claimed records are the orders' own cost)."""
    every = s.count_interval_s
    return [
        Query(
            "starter claimable (TOP batch)", s.starter_interval_s, rules.query(parts, 0, 0), False
        ),
        Query("starter COUNT Pending", every, rules.count(parts, b.pending), True),
        Query("starter COUNT Processing", every, rules.count(parts, b.processing), True),
        Query("starter gauge upsert", every, rules.write_1kb, False),
        Query("starter compensation requests", every, rules.query(parts, 0, 0), False),
        Query("starter Compensating page", every, rules.query(parts, 0, 0), False),
        Query("outbox unsent statuses", s.outbox_interval_s, rules.query(parts, 0, 0), False),
    ]


def supervisor_queries(
    rules: Rules, s: Schedule, parts: int, scan: str, index_parts: int
) -> list[Query]:
    """A Supervisor's idle tick: nothing due (recoveries are the orders' cost)."""
    every = s.supervisor_interval_s
    checkpoint = [
        Query("supervisor checkpoint read", every, rules.read_1kb, False),
        Query("supervisor checkpoint write", every, rules.write_1kb, False),
    ]
    if scan == "index":
        return [
            Query("supervisor index MIN(bucket)", every, rules.query(index_parts, 0, 0), False),
            Query("supervisor index bucket page", every, rules.query(1, 0, 0), False),
            *checkpoint,
        ]
    return [
        Query("supervisor expired page (TOP page)", every, rules.query(parts, 0, 0), False),
        *checkpoint,
    ]


def per_hour(queries: list[Query]) -> float:
    return sum(q.ru * 3600 / q.every_s for q in queries)
