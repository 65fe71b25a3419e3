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
from domain import state_machine as sm
from domain.errors import NotFoundError, PermanentError, StaleError
from domain.ids import attempt_instance_id
from domain.models import OrderState, ProcessState


async def _nothing() -> None:
    return None


_NOT_DUE = object()  # IndexSource._check: the entry stays (cursor rule 1)

# An entry whose record still shows an older attempt this long after the
# entry's deadline stops holding the cursor: the claim that added it did not
# land (a fast path's claim whose message lock was lost), or every read that
# long was of a lagging replica. Held for good, it kept the entries after it
# from recovery, and with the admission cap full of their attempts the
# Pending record it names could never be claimed (sim seed 34001820).
LOST_CLAIM_AFTER = timedelta(minutes=2)

# States a record never leaves: no later attempt can be claimed from them.
_FINAL = frozenset({ProcessState.PROCESSED, ProcessState.COMPENSATED, ProcessState.REJECTED})


@dataclass
class Candidate:
    """`done`: call once the candidate was handled. `position`: a cursor at
    this candidate, to resume at when it was not (ADR 007 cursor rule 3)."""

    record: OrderState
    etag: str
    done: Callable[[], Awaitable[None]] = _nothing
    position: str | None = None


# No lower bound: a deadline passed long ago is still the Supervisor's to
# recover; the page stays bounded by `max_items`.
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
    """The checkpoint document of a Supervisor (the index's cursor names sharded partitions)."""
    return "supervisor-index-sharded" if scan == "index" else f"supervisor-{scan}"


class IndexSource:
    """Reads the recovery index up to `upper` and checks each due entry
    against its record (docs/adr/007-recovery-index.md, "What the Supervisor
    does with a due entry"), keeping the cursor rules of ADR 007 and 019b."""

    def __init__(
        self, index: CosmosRecoveryIndex, store: StateStore, settle: timedelta = SETTLE
    ) -> None:
        """`settle`: how far before `upper` a bucket may still get entries:
        at least twice the clock skew the Supervisor's slack allows for."""
        self._index = index
        self._store = store
        self._settle = settle

    async def page(self, upper: datetime, max_items: int, cursor: str | None):
        # The cursor: [partition, id], partitions in walk order (ADR 019b).
        bucket, after = json.loads(cursor) if cursor else (None, "")
        if bucket is None or minute_of(bucket) > bucket_of(upper + self._settle):
            bucket, after = await self._start(upper), ""
        try:
            entries, bucket, after, reached_end = await self._index.page(
                upper, bucket, after, max_items, bucket_of(upper - self._settle)
            )
        finally:
            # The run alerts unreadable entries, as records, even if the page failed.
            self._store.unreadable.extend(self._index.unreadable)
            del self._index.unreadable[:]
        candidates: list[Candidate] = []
        resume: tuple[str, str] | None = None
        positions: list[tuple[Candidate, tuple[str, str]]] = []
        removals: list[IndexEntry] = []  # removed together at the end (a batch per bucket)
        previous: IndexEntry | None = None
        for entry in entries:
            same = previous is not None and previous.bucket == entry.bucket
            position = (entry.bucket, previous.id if previous is not None and same else "")
            candidate = await self._check(entry, upper, removals)
            if isinstance(candidate, Candidate):
                positions.append((candidate, position))
            if candidate is _NOT_DUE:
                # Rule 1: resume just before the first entry that stays.
                if resume is None:
                    resume = position
            elif candidate is not None:
                candidates.append(candidate)
            previous = entry
        at = resume if resume is not None else (bucket, "" if reached_end else after)
        if minute_of(at[0]) >= bucket_of(upper - self._settle):
            # Rule 2: a minute this late may still get entries, before the
            # cursor's id or in a shard it passed: keep to the minute's start.
            at = (minute_of(at[0]), "")
        # After every check: a crash before this line leaves entries to a later run.
        await self._index.remove_many(removals)
        for candidate, own in positions:
            # Rule 3, never past what `at` keeps: the earlier of the two.
            candidate.position = json.dumps(list(min(own, at)))
        return candidates, json.dumps(list(at)), len(entries)

    async def _start(self, upper: datetime) -> str:
        """Where a scan starts without a usable checkpoint: the earliest bucket
        holding a document, or bucket_of(upper - SETTLE) if that lies past
        bucket_of(upper + SETTLE) (ADR 007 cursor rule 4)."""
        earliest = await self._index.earliest_bucket()
        if earliest is None:
            return bucket_of(upper)
        # The start of that minute, so every shard of it is read.
        earliest = minute_of(earliest)
        if earliest > bucket_of(upper + self._settle):
            return bucket_of(upper - self._settle)
        return earliest

    async def _check(self, entry: IndexEntry, upper: datetime, removals: list[IndexEntry]):
        if entry.complete_by >= upper:
            # Not due: not read against its record (an expired record has a due entry).
            return _NOT_DUE
        try:
            record, etag = await self._store.read(entry.order_id)
        except NotFoundError:
            removals.append(entry)
            return None
        except PermanentError:
            # Unreadable (the run alerts): the entry moves UNREADABLE_RETRY
            # ahead, added before removed, so one bad record holds no other.
            await self._index.add(entry.order_id, upper + UNREADABLE_RETRY, entry.attempt)
            removals.append(entry)
            return None
        if record.Attempt < entry.attempt:
            # The read may lag the claim: keep the entry and hold the cursor,
            # unless the record is final (a lost claim's extra entry).
            if record.ProcessState in _FINAL:
                removals.append(entry)
                return None
            if entry.complete_by < upper - LOST_CLAIM_AFTER:
                # Long past: the claim did not land, or no read in that long
                # saw it. Held, the cursor would keep every later entry from
                # recovery; the entry moves ahead instead (added before removed).
                await self._index.add(entry.order_id, upper + UNREADABLE_RETRY, entry.attempt)
                removals.append(entry)
                return None
            return _NOT_DUE
        live = (
            record.ProcessState is ProcessState.PROCESSING
            and record.CompleteBy is not None
            and record.Attempt == entry.attempt
        )
        if not live or record.CompleteBy is None:  # (live implies a deadline)
            # Ended or replaced: certain, since a lagging read only shows older versions.
            parked = sm.park_processed(record, attempt_instance_id(record.id, entry.attempt))
            if parked is not record:  # a Processed maybe unsent (ADR 021k)
                try:  # on the version read: a later one is read again
                    await self._store.replace(parked, etag)
                except StaleError:
                    return _NOT_DUE
            removals.append(entry)
            return None
        if record.CompleteBy < upper:
            return Candidate(record, etag, lambda: self._index.remove(entry))
        # A later deadline: the entry moves there, added before removed.
        await self._index.add(record.id, record.CompleteBy, record.Attempt)
        removals.append(entry)
        return None
