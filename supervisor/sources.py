"""Where a Supervisor run gets its page of expired attempts: `QuerySource`
(the state container's keyset-paged query, docs/adr/006-keyset-paging.md) or
`IndexSource` (the recovery index, docs/adr/007-recovery-index.md), chosen by
SUPERVISOR_SCAN. Both return `Candidate`s: a record as read, with its etag."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from adapters.ports import UNREADABLE_RETRY, IndexEntry, StateStore, bucket_of, minute_of
from adapters.recovery_index import CosmosRecoveryIndex
from domain.errors import NotFoundError, PermanentError
from domain.models import OrderState, ProcessState


async def _nothing() -> None:
    return None


_NOT_DUE = object()  # IndexSource._check: the entry is live but its deadline is ahead

# States a record never leaves: no later attempt can be claimed from them.
_FINAL = frozenset({ProcessState.PROCESSED, ProcessState.COMPENSATED, ProcessState.REJECTED})


@dataclass
class Candidate:
    """`done`: call once the candidate was handled (recovered, or its
    attempt ended). `position`: a cursor at this candidate, for a Supervisor
    that did not handle it (the record read here lagged a live attempt's newer
    deadline) to resume at, so the source reads it again."""

    record: OrderState
    etag: str
    done: Callable[[], Awaitable[None]] = _nothing
    position: str | None = None


# No lower bound: a Processing record whose deadline passed long ago (an
# outage longer than any window) is still the Supervisor's to recover. The
# page stays bounded by `max_items` (TOP n on the composite index), so the
# open window costs nothing per run.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)


class QuerySource:
    """Pages the state container; the cursor is the store's keyset token plus
    the pass's fixed upper bound (a pass keeps it until it ends)."""

    def __init__(self, store: StateStore) -> None:
        self._store = store

    async def page(self, upper: datetime, max_items: int, cursor: str | None):
        state: dict[str, Any] = (
            json.loads(cursor) if cursor else {"upper": upper.isoformat(), "token": None}
        )
        pass_upper = datetime.fromisoformat(state["upper"])
        page, token = await self._store.query_expired(
            pass_upper, EARLIEST, max_items, state["token"]
        )
        candidates = [Candidate(record, etag) for record, etag in page]
        next_cursor = (
            None if token is None else json.dumps({"upper": state["upper"], "token": token})
        )
        return candidates, next_cursor, len(page)


# IndexSource: buckets from bucket_of(upper - SETTLE) on may still get entries.
SETTLE = timedelta(seconds=10)


def checkpoint_name(scan: str) -> str:
    """The checkpoint document of a Supervisor (its cursor names sharded
    partitions, ADR 019b). A first run without a checkpoint starts at the
    earliest partition holding a document (cursor rule 4)."""
    return "supervisor-index-sharded" if scan == "index" else f"supervisor-{scan}"


class IndexSource:
    """Reads the recovery index up to `upper` and checks each entry against
    its record: entries of an attempt that ended (or was replaced by a newer
    one) are discarded; an entry of a live attempt whose deadline moved on is
    moved to that deadline; entries not yet due stay."""

    def __init__(
        self, index: CosmosRecoveryIndex, store: StateStore, settle: timedelta = SETTLE
    ) -> None:
        """`settle`: how far before `upper` a bucket may still get entries
        (moves by a Supervisor whose clock is behind this one's): at least
        twice the clock skew the Supervisor's slack allows for."""
        self._index = index
        self._store = store
        self._settle = settle

    async def page(self, upper: datetime, max_items: int, cursor: str | None):
        # The cursor: [partition, id]; partitions sort as (minute, shard), a
        # minute's bare partition first (adapters.ports.minute_of). The cursor
        # rules of ADR 007 are about minutes (buckets): see ADR 019b.
        bucket, after = json.loads(cursor) if cursor else (None, "")
        if bucket is None or minute_of(bucket) > bucket_of(upper + self._settle):
            bucket, after = await self._start(upper), ""
        try:
            entries, bucket, after, reached_end = await self._index.page(
                upper, bucket, after, max_items, bucket_of(upper - self._settle)
            )
        finally:
            # Entries the index could not read are the run's to alert, as
            # records are, also when the page then failed.
            self._store.unreadable.extend(self._index.unreadable)
            del self._index.unreadable[:]
        candidates: list[Candidate] = []
        resume: tuple[str, str] | None = None
        positions: list[tuple[Candidate, tuple[str, str]]] = []
        removals: list[IndexEntry] = []  # removed together at the end (a batch per bucket)
        previous: IndexEntry | None = None
        for entry in entries:
            same = previous is not None and previous.bucket == entry.bucket
            position = json.dumps(
                [entry.bucket, previous.id if previous is not None and same else ""]
            )
            candidate = await self._check(entry, upper, removals)
            if isinstance(candidate, Candidate):
                positions.append((candidate, tuple(json.loads(position))))
            if candidate is _NOT_DUE:
                # The cursor must not pass an entry that stays: resume just
                # before the first one (ids are read in order, `after` is
                # exclusive). Only the bucket of `upper` can hold such entries,
                # so the next run re-reads at most that one bucket.
                if resume is None:
                    resume = tuple(json.loads(position))
            elif candidate is not None:
                candidates.append(candidate)
            previous = entry
        # A finished pass restarts at the current bucket, which may still fill
        # up and holds entries not yet due.
        at = resume if resume is not None else (bucket, "" if reached_end else after)
        if minute_of(at[0]) >= bucket_of(upper - self._settle):
            # A bucket this late may still get entries: claims index their
            # deadline ahead of now, and a Supervisor (this one or another
            # whose clock is behind) moves entries to deadlines at or after
            # its own upper bound. Such an entry may sort before the cursor's
            # id (ids sort by order id, not deadline), or land in a shard the
            # cursor has passed: keep to the start of the bucket (its bare
            # partition, first of its shards), or the cursor could leave the
            # bucket without reaching it.
            at = (minute_of(at[0]), "")
        # After every check: an entry left behind by a crash before this line
        # is only checked again by a later run.
        await self._index.remove_many(removals)
        for candidate, own in positions:
            # A Supervisor that does not handle a candidate resumes at its
            # position instead of `at`. That must not pass what `at` keeps (an
            # entry not yet due earlier in the page, or a bucket's start):
            # cursors sort as (bucket, id), so the earlier of the two is safe.
            candidate.position = json.dumps(list(min(own, at)))
        return candidates, json.dumps(list(at)), len(entries)

    async def _start(self, upper: datetime) -> str:
        """Where a scan starts without a usable checkpoint: none yet (a first
        deployment, a lost checkpoint, a Supervisor that died before its first
        save), or one further ahead than bucket_of(upper + SETTLE), which no
        run saves under these rules (cursor rule 4, ADR 007).

        The earliest bucket that holds a document, unless that lies further
        ahead than bucket_of(upper + SETTLE): then bucket_of(upper - SETTLE),
        the first bucket that may still get entries. (Up to there no entry can
        appear before it later: a claim indexes at least a claim or step
        timeout ahead of now, and a move takes a counted entry later.) The
        earliest document can be far ahead: a live attempt's entry at a long
        step's deadline, or one set aside for UNREADABLE_RETRY. Starting there
        would put the cursor past every entry added from then on, and a cursor
        never goes back: those attempts would never be recovered. A checkpoint
        saved that way has passed entries that are still due, hence the scan
        from here again."""
        earliest = await self._index.earliest_bucket()
        if earliest is None:
            return bucket_of(upper)
        # A partition's minute; the start of that minute (its bare partition),
        # so every shard of it is read.
        earliest = minute_of(earliest)
        if earliest > bucket_of(upper + self._settle):
            return bucket_of(upper - self._settle)
        return earliest

    async def _check(self, entry: IndexEntry, upper: datetime, removals: list[IndexEntry]):
        if entry.complete_by >= upper:
            # Not due: stays for a later run, without reading its record. Every
            # deadline a record carries has an entry no later than it (added
            # before the record carries it, moved only forward), so a record
            # whose deadline passed is found through that due entry, not this one.
            return _NOT_DUE
        try:
            record, etag = await self._store.read(entry.order_id)
        except NotFoundError:
            removals.append(entry)
            return None
        except PermanentError:
            # A record this version cannot read (a newer version's value, a hand
            # edit): the store names it and the run alerts. The entry moves an
            # UNREADABLE_RETRY ahead (added before removed, as every move), so
            # the cursor goes on — one bad record neither fails every run nor
            # holds every other order's recovery — and the record is looked at
            # again until it is fixed (a repeat alert is dropped by the alerts
            # queue's duplicate detection; a lost one is raised again).
            await self._index.add(entry.order_id, upper + UNREADABLE_RETRY, entry.attempt)
            removals.append(entry)
            return None
        if record.Attempt < entry.attempt:
            # A version from before the entry's attempt was claimed. The
            # read may lag the latest write (Session consistency across
            # clients), so this says nothing about whether that attempt is
            # live now; removing the entry could orphan a live attempt, whose
            # deadline would then never be seen. Keep it, unless the record
            # can never be claimed again (a lost claim's extra entry). A kept
            # entry holds the cursor (as one not yet due does): the next run
            # reads it again, and the record soon shows that attempt (or, after
            # a lost claim, the next claim takes that attempt number).
            if record.ProcessState in _FINAL:
                removals.append(entry)
                return None
            return _NOT_DUE
        live = (
            record.ProcessState is ProcessState.PROCESSING
            and record.CompleteBy is not None
            and record.Attempt == entry.attempt
        )
        if not live or record.CompleteBy is None:  # (live implies a deadline)
            # Met (the attempt ended) or replaced (a newer attempt has its own
            # entry). A lagging read only ever shows an older version, and
            # versions only move forward from the entry's attempt, so this is
            # certain.
            removals.append(entry)
            return None
        if record.CompleteBy < upper:
            return Candidate(record, etag, lambda: self._index.remove(entry))
        # The attempt lives on past this entry (its record's CompleteBy is
        # later). Move the entry there (added before removed, so the attempt
        # is never without one); only slow attempts pay for this.
        await self._index.add(record.id, record.CompleteBy, record.Attempt)
        removals.append(entry)
        # Not before this run's upper bound, so in the cursor's bucket or a
        # later one; page() keeps the cursor at the start of such a bucket.
        return None
