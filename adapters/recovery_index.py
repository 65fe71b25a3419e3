"""The recovery index: the container `recoveryIndex` (partition key /bucket,
`<minute>|<shard>`) where the Supervisor finds expired attempts with
single-partition queries. Protocol and cursor rules:
docs/adr/007-recovery-index.md; the shards: docs/adr/019b-sharded-recovery-index.md."""

from __future__ import annotations

import asyncio
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

from adapters.clock import SYSTEM_CLOCK, Wake, task_wake
from adapters.cosmos_client import SDK_ERRORS, RequestCharges, translate_error
from adapters.ports import BUCKET_SECONDS, UNREADABLE_RETRY, IndexEntry, bucket_of, minute_of
from adapters.settings import SettingsError
from domain.errors import NotFoundError, TransientError

log = logging.getLogger(__name__)

MAX_BUCKETS_PER_PAGE = 120
DISCARD_BATCH = 25
DISCARD_SPREAD = timedelta(seconds=15)
MAX_BATCH_OPERATIONS = 100  # Cosmos' limit for one transactional batch
PARTITION_KEY_PATH = "/bucket"
DEFAULT_SHARDS = 16  # RECOVERY_INDEX_SHARDS
MAX_SHARDS = 999  # three digits: shards sort as numbers
# The shard count the container was set up with; "~" sorts after every minute.
SHARDS_DOCUMENT = {"id": "shard-count", "bucket": "~config"}
_ABSENT = object()


def _next_bucket(bucket: str) -> str:
    start = datetime.strptime(bucket, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return bucket_of(start + timedelta(seconds=BUCKET_SECONDS))


def shard_of(order_id: str, shards: int) -> int:
    """A hash of the OrderID onto 0..shards-1, the same in every process."""
    return zlib.crc32(order_id.encode("utf-8")) % shards


def partition_of(complete_by: datetime, order_id: str, shards: int) -> str:
    """An entry's partition key, `<minute>|<shard>`, the shard in three digits."""
    return f"{bucket_of(complete_by)}|{shard_of(order_id, shards):03d}"


def next_partition(partition: str, shards: int) -> str:
    """The partition after `partition` in the Supervisor's walk: a minute's
    bare partition, its shards 0..shards-1, then the next minute's (ADR 019b)."""
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
    records its RECOVERY_INDEX_SHARDS; one whose setting differs gets a
    SettingsError before it writes or reads an entry. One point read per process."""
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
        # The create conflicted, the read after it found nothing: a lagging replica.
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


# The scan reads MIN(bucket) and a bucket's entries by id: only `bucket` is indexed.
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
    a deadline no earlier than the entry's (ADR 007)."""

    def __init__(
        self,
        container: ContainerProxy,
        charges: RequestCharges | None = None,
        discard_batch: int = DISCARD_BATCH,
        shards: int = DEFAULT_SHARDS,
        wake: Wake | None = None,
    ) -> None:
        self._container = container
        self.shards = check_shards(shards)
        self.charges = charges if charges is not None else RequestCharges()
        self._discard_batch = discard_batch
        self._discards: list[IndexEntry] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = wake or task_wake(SYSTEM_CLOCK, self._tasks, "index discards' flush")
        self.unreadable: list[tuple[str, str]] = []  # as StateStore.unreadable

    def _entry(self, doc: dict[str, Any]) -> IndexEntry | None:
        """The entry a document holds; None (logged, named in `unreadable`) for
        a document that is not one, so garbage cannot stop every run."""
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
        """Move a document that is not an entry UNREADABLE_RETRY past `upper`
        (a later page alerts it again); a copy not written for now fails the
        page, one refused for good or a failed delete is logged (ADR 007)."""
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
        """Retire the entry of an attempt that has ended: it waits in this
        process until `discard_batch` of its partition gather, their deadlines
        spread over DISCARD_SPREAD, or DISCARD_SPREAD passed since the first
        waited, then goes in a batch (ADR 007, 019b, 021k)."""
        at = complete_by.astimezone(UTC)
        entry = IndexEntry(
            entry_id(order_id, at), partition_of(at, order_id, self.shards), order_id, at, 0
        )
        if not self._discards:
            self._wake(DISCARD_SPREAD.total_seconds(), self.flush)
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
        """Remove entries with one transactional batch per partition; a batch
        that fails (all or nothing: an entry gone already) goes entry by entry."""
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
        """The first partition key value from `start` on that holds a document:
        where a first scan starts, and where `page` jumps over an empty stretch.
        Cross-partition, over live deadlines only."""
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
        self, upper: datetime, bucket: str, after: str, max_items: int, settled: str | None = None
    ) -> tuple[list[IndexEntry], str, str, bool]:
        """Up to `max_items` entries (MAX_BUCKETS_PER_PAGE queries) from
        (partition `bucket`, id `after`) on, in walk order, to the bucket of
        `upper`; the (partition, id) to resume from, and whether that bucket
        was read to its end. An empty stretch before `settled` (cursor rule 2)
        is jumped over with one `MIN(bucket)` query (ADR 019b)."""
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
