"""The recovery index: the container `recoveryIndex` (partition key /bucket:
a deadline floored to the minute plus a hash shard of the OrderID,
`<minute>|<shard>`) where the Supervisor finds expired attempts with
single-partition queries instead of a cross-partition scan of the state
container. Protocol and cursor rules: docs/adr/007-recovery-index.md; the
shards: docs/adr/019b-sharded-recovery-index.md."""

from __future__ import annotations

import logging
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.cosmos import PartitionKey
from azure.cosmos.aio import ContainerProxy, CosmosClient
from azure.cosmos.exceptions import (
    CosmosBatchOperationError,
    CosmosResourceExistsError,
    CosmosResourceNotFoundError,
)

from adapters.cosmos_client import SDK_ERRORS, RequestCharges, translate_error
from adapters.ports import BUCKET_SECONDS, UNREADABLE_RETRY, IndexEntry, bucket_of, minute_of
from adapters.settings import SettingsError
from domain.errors import NotFoundError, TransientError

log = logging.getLogger(__name__)

MAX_BUCKETS_PER_PAGE = 120
# Discards of finished attempts wait for this many, then go as one batch per
# bucket (ADR 007); fewer if their deadlines spread wider than DISCARD_SPREAD.
DISCARD_BATCH = 25
DISCARD_SPREAD = timedelta(seconds=15)
MAX_BATCH_OPERATIONS = 100  # Cosmos' limit for one transactional batch
PARTITION_KEY_PATH = "/bucket"
DEFAULT_SHARDS = 16  # RECOVERY_INDEX_SHARDS
MAX_SHARDS = 999  # three digits: shards sort as numbers
# Where the container records the shard count it was set up with (ADR 019b).
# "~" sorts after every minute: MIN(bucket) and the Supervisor's walk never
# land on it before a real entry.
SHARDS_DOCUMENT = {"id": "shard-count", "bucket": "~config"}
_ABSENT = object()


def _next_bucket(bucket: str) -> str:
    start = datetime.strptime(bucket, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return bucket_of(start + timedelta(seconds=BUCKET_SECONDS))


def shard_of(order_id: str, shards: int) -> int:
    """A stable hash of the OrderID (the same in every process; Python's
    `hash` is not) onto 0..shards-1."""
    return zlib.crc32(order_id.encode("utf-8")) % shards


def partition_of(complete_by: datetime, order_id: str, shards: int) -> str:
    """The partition key value of an entry: `<minute>|<shard>`, the shard
    zero-padded to three digits so that a minute's partitions sort by shard."""
    return f"{bucket_of(complete_by)}|{shard_of(order_id, shards):03d}"


def next_partition(partition: str, shards: int) -> str:
    """The partition after `partition` in the Supervisor's walk: a minute's
    bare partition (entries from before the shards, documents set aside),
    then its shards 0..shards-1, then the next minute's bare partition."""
    minute, _, shard = partition.partition("|")
    if not shard:
        return f"{minute}|000"
    try:
        following = int(shard) + 1
    except ValueError:
        following = shards  # not a shard this version writes: on to the next minute
    if following < shards:
        return f"{minute}|{following:03d}"
    return _next_bucket(minute)


def check_shards(shards: int) -> int:
    if not 1 <= shards <= MAX_SHARDS:
        raise SettingsError(f"RECOVERY_INDEX_SHARDS must be 1 to {MAX_SHARDS}, not {shards}")
    return shards


async def ensure_shard_count(container: ContainerProxy, shards: int) -> None:
    """The shard count is fixed per container (ADR 019b): the first process
    records its RECOVERY_INDEX_SHARDS in the container; one whose setting
    differs is refused with a SettingsError before it writes or reads an
    entry, since a Supervisor walking other shards than the writers use would
    not see every entry. One point read per process (a create the first time)."""
    check_shards(shards)
    key = SHARDS_DOCUMENT["bucket"]

    async def recorded() -> Any:
        try:
            doc = await container.read_item(SHARDS_DOCUMENT["id"], partition_key=key)
        except CosmosResourceNotFoundError:
            return _ABSENT
        return doc.get("shards")

    try:
        count = await recorded()
        if count is _ABSENT:
            try:
                await container.create_item({**SHARDS_DOCUMENT, "shards": shards})
                return
            except CosmosResourceExistsError:
                count = await recorded()  # another process recorded it first
    except SDK_ERRORS as exc:
        raise translate_error(exc, "record the recovery index's shard count") from exc
    if count is _ABSENT:
        # The create found the document, the read after it did not: a replica
        # that has not seen another process's create yet. Not a refused
        # setting: the start is retried and reads it then.
        raise TransientError(
            "the recovery index's shard count was just recorded by another process "
            "and is not yet readable here; retry the start"
        )
    if count != shards:
        raise SettingsError(
            f"RECOVERY_INDEX_SHARDS is {shards}, but the recovery index container "
            f"{container.id!r} was set up with {count!r} shards: entries written under "
            f"{count!r} shards would not all be found. Keep {count!r}, or give the new "
            "count a new container (RECOVERY_INDEX_CONTAINER_NAME), as "
            "docs/adr/019b-sharded-recovery-index.md describes."
        )


def entry_id(order_id: str, complete_by: datetime) -> str:
    return f"{order_id}|{complete_by.astimezone(UTC).isoformat()}"


# The Supervisor's scan reads MIN(bucket) and one bucket's entries by id:
# only `bucket` is indexed (`id` always is).
INDEX_INDEXING_POLICY: dict[str, Any] = {
    "indexingMode": "consistent",
    "automatic": True,
    "includedPaths": [{"path": "/bucket/?"}],
    "excludedPaths": [{"path": "/*"}],
}


async def ensure_index_container(
    client: CosmosClient, database: str, container: str
) -> ContainerProxy:
    """Local/dev only; in Azure the Bicep templates create it."""
    db = await client.create_database_if_not_exists(database)
    return await db.create_container_if_not_exists(
        id=container,
        partition_key=PartitionKey(path=PARTITION_KEY_PATH),
        indexing_policy=INDEX_INDEXING_POLICY,
        default_ttl=-1,  # entries expire on their own `ttl`
    )


class CosmosRecoveryIndex:
    """Entry: {"id": "<OrderID>|<CompleteBy>", "bucket", "OrderID",
    "CompleteBy", "Attempt"}; one per attempt, added before the record carries
    a deadline no earlier than the entry's (ADR 007). `bucket`, the partition
    key, is `<minute>|<shard>` with `shards` shards (ADR 019b); the walk also
    reads each minute's bare `<minute>` partition, where entries written
    before the key was sharded and documents set aside live."""

    def __init__(
        self,
        container: ContainerProxy,
        charges: RequestCharges | None = None,
        discard_batch: int = DISCARD_BATCH,
        shards: int = DEFAULT_SHARDS,
    ) -> None:
        self._container = container
        self.shards = check_shards(shards)
        self.charges = charges if charges is not None else RequestCharges()
        self._discard_batch = discard_batch
        self._discards: list[IndexEntry] = []
        self.unreadable: list[tuple[str, str]] = []  # as StateStore.unreadable

    def _entry(self, doc: dict[str, Any]) -> IndexEntry | None:
        """The entry a document holds; None (logged, named in `unreadable`) for a
        document that is not one, so garbage in the container cannot stop every
        Supervisor run. The page's cursor still moves past it."""
        try:
            complete_by = datetime.fromisoformat(doc["CompleteBy"])
            if complete_by.tzinfo is None or not isinstance(doc["Attempt"], int):
                raise ValueError("CompleteBy without a zone or a non-integer Attempt")
            return IndexEntry(
                str(doc["id"]), str(doc["bucket"]), str(doc["OrderID"]), complete_by, doc["Attempt"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            log.error("skipping invalid index document %r: %r", doc.get("id"), exc)
            self.unreadable.append(
                (f"recoveryIndex/{doc.get('id')}", f"not an index entry: {exc!r}")
            )
            return None

    async def _set_aside(self, doc: dict[str, Any], upper: datetime) -> None:
        """Move a document that is not an entry UNREADABLE_RETRY past `upper`,
        as it is, so the cursor goes on and a later page meets it (and alerts)
        again until someone deletes it; its alert's repeats are dropped by the
        alerts queue, a lost one is raised again.

        A copy that could not be written for now (throttled, the account
        unreachable) fails the page with a TransientError: the cursor must not
        pass a document that has no copy ahead of it, or no run would ever
        read it again. A write refused for good, or a
        failed delete (the copy ahead exists), is logged and the page goes on,
        so one bad document never stops every run."""
        body = {k: v for k, v in doc.items() if not k.startswith("_")}
        body["bucket"] = bucket_of(upper + UNREADABLE_RETRY)
        try:
            await self._container.upsert_item(body, response_hook=self.charges.hook("index_add"))
        except SDK_ERRORS as exc:
            error = translate_error(
                exc,
                f"set aside invalid index document {doc.get('id')!r}",
                self.charges,
                "index_add",
            )
            if isinstance(error, TransientError):
                raise error from exc
            log.error("could not set aside invalid index document %r: %s", doc.get("id"), exc)
            return
        try:
            await self._container.delete_item(
                doc["id"],
                partition_key=doc["bucket"],
                response_hook=self.charges.hook("index_remove"),
            )
        except SDK_ERRORS as exc:
            log.error("could not set aside invalid index document %r: %s", doc.get("id"), exc)

    async def add(self, order_id: str, complete_by: datetime, attempt: int) -> None:
        at = complete_by.astimezone(UTC).isoformat()
        body = {
            "id": entry_id(order_id, complete_by),
            "bucket": partition_of(complete_by, order_id, self.shards),
            "OrderID": order_id,
            "CompleteBy": at,
            "Attempt": attempt,
        }
        try:
            await self._container.upsert_item(body, response_hook=self.charges.hook("index_add"))
        except SDK_ERRORS as exc:
            raise translate_error(
                exc, f"index deadline of {order_id}", self.charges, "index_add"
            ) from exc

    async def discard(self, order_id: str, complete_by: datetime) -> None:
        """Retire the entry `add(order_id, complete_by, ...)` made, for an
        attempt that has ended. Batched per partition: the entry waits in this
        process until `discard_batch` discards of its partition have gathered
        (then they go as one transactional delete), or until the discards
        waiting spread over DISCARD_SPREAD in their deadlines (then all go, a
        batch per partition). With the key sharded, a process's discards
        spread over the shards: gathering per partition keeps the batches full
        at the rates where it matters (ADR 019b). A discard that never goes
        (the process ends, the batch fails) only leaves an entry the
        Supervisor removes when it is due, as it does for any attempt that
        ended without discarding. Gone already is fine."""
        at = complete_by.astimezone(UTC)
        entry = IndexEntry(
            entry_id(order_id, at), partition_of(at, order_id, self.shards), order_id, at, 0
        )
        self._discards.append(entry)
        group = [e for e in self._discards if e.bucket == entry.bucket]
        oldest = min(e.complete_by for e in self._discards)
        if at - oldest >= DISCARD_SPREAD:
            await self.flush()
        elif len(group) >= self._discard_batch:
            # Taken before the first await: discards meanwhile wait on.
            self._discards = [e for e in self._discards if e.bucket != entry.bucket]
            await self.remove_many(group)

    async def flush(self) -> None:
        """Send the discards waiting in this process now."""
        # Taken before the first await: discards meanwhile start a new batch.
        entries, self._discards = self._discards, []
        await self.remove_many(entries)

    async def remove_many(self, entries: list[IndexEntry]) -> None:
        """Remove entries with one transactional batch per partition. A batch is all or nothing: if one entry is gone already,
        it is retried entry by entry."""
        by_bucket: dict[str, dict[str, IndexEntry]] = {}
        for entry in entries:
            # Once per id: a retried activity discards its entry twice.
            by_bucket.setdefault(entry.bucket, {})[entry.id] = entry
        for bucket, unique in sorted(by_bucket.items()):
            group = list(unique.values())
            for start in range(0, len(group), MAX_BATCH_OPERATIONS):
                chunk = group[start : start + MAX_BATCH_OPERATIONS]
                if len(chunk) == 1:
                    await self.remove(chunk[0])
                    continue
                try:
                    await self._container.execute_item_batch(
                        [("delete", (e.id,)) for e in chunk],
                        partition_key=bucket,
                        response_hook=self.charges.hook("index_remove_batch"),
                    )
                except CosmosBatchOperationError:
                    for e in chunk:
                        await self.remove(e)
                except SDK_ERRORS as exc:
                    raise translate_error(
                        exc,
                        f"remove {len(chunk)} index entries of bucket {bucket}",
                        self.charges,
                        "index_remove_batch",
                    ) from exc

    async def remove(self, entry: IndexEntry) -> None:
        try:
            await self._container.delete_item(
                entry.id,
                partition_key=entry.bucket,
                response_hook=self.charges.hook("index_remove"),
            )
        except SDK_ERRORS as exc:
            error = translate_error(
                exc, f"remove index entry {entry.id}", self.charges, "index_remove"
            )
            if not isinstance(error, NotFoundError):
                raise error from exc

    async def earliest_bucket(self, start: str = "") -> str | None:
        """The first partition key value from `start` on that holds a document
        (`minute_of` gives its minute): where a first scan starts (once per
        supervisor lifetime, when it has no checkpoint yet), and where `page`
        jumps over an empty stretch. Cross-partition, but over live deadlines
        only (entries are removed as they are visited)."""
        try:
            values: list[Any] = [
                v
                async for v in self._container.query_items(
                    "SELECT VALUE MIN(c.bucket) FROM c WHERE c.bucket >= @from",
                    parameters=[{"name": "@from", "value": start}],
                    response_hook=self.charges.hook("index_query"),
                )
            ]
        except SDK_ERRORS as exc:
            raise translate_error(
                exc, f"find the first index partition from {start!r}", self.charges, "index_query"
            ) from exc
        found = [v for v in values if v]
        return min(found) if found else None

    async def page(
        self,
        upper: datetime,
        bucket: str,
        after: str,
        max_items: int,
        settled: str | None = None,
    ) -> tuple[list[IndexEntry], str, str, bool]:
        """Entries from (partition `bucket`, id `after`) on, partition by
        partition in (minute, shard) order (`next_partition`), up to the last
        partition of the bucket of `upper`; at most `max_items` entries and
        MAX_BUCKETS_PER_PAGE queries. Returns (entries, partition, after) to
        resume from, and whether the bucket of `upper` was read to its end.

        `settled`: a bucket before which no entry can appear any more (the
        caller's cursor rule 2). After a minute's worth of empty partitions
        in a row before it, one `MIN(bucket)` query finds the next partition
        that holds a document and the walk jumps there (never past the start
        of `settled`): with N shards a minute is N + 1 queries, and an empty
        stretch (entries far apart, a backlog after an outage) would
        otherwise cost N + 1 queries a minute."""
        last = bucket_of(upper)
        out: list[IndexEntry] = []
        visited = empty = 0
        while len(out) < max_items and visited < MAX_BUCKETS_PER_PAGE:
            visited += 1
            want = max_items - len(out)
            docs = await self._partition_page(bucket, after, want)
            for doc in docs:
                entry = self._entry(doc)
                if entry is not None:
                    out.append(entry)
                else:
                    await self._set_aside(doc, upper)
            if len(docs) == want:
                return out, bucket, docs[-1]["id"], False
            following = next_partition(bucket, self.shards)
            if minute_of(bucket) >= last and minute_of(following) != minute_of(bucket):
                return out, bucket, "", True
            bucket, after = following, ""
            empty = 0 if docs else empty + 1
            if (
                settled is not None
                and empty > self.shards
                and minute_of(bucket) < settled
                and visited < MAX_BUCKETS_PER_PAGE
            ):
                visited += 1
                empty = 0
                ahead = await self.earliest_bucket(bucket)
                # Everything between is empty now and stays so: no entry can
                # appear before `settled` (ADR 007 cursor rule 2).
                bucket = ahead if ahead is not None and minute_of(ahead) < settled else settled
        return out, bucket, after, False

    async def _partition_page(self, bucket: str, after: str, want: int) -> list[dict]:
        """Up to `want` documents of partition `bucket` after id `after`, in id order."""
        try:
            return [
                doc
                async for doc in self._container.query_items(
                    "SELECT TOP @n * FROM c WHERE c.bucket = @b AND c.id > @after ORDER BY c.id",
                    parameters=[
                        {"name": "@n", "value": want},
                        {"name": "@b", "value": bucket},
                        {"name": "@after", "value": after},
                    ],
                    partition_key=bucket,
                    response_hook=self.charges.hook("index_query"),
                )
            ]
        except SDK_ERRORS as exc:
            raise translate_error(
                exc, f"read index partition {bucket}", self.charges, "index_query"
            ) from exc
