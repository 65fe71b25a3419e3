"""The recovery index: where the Supervisor finds expired attempts without a
cross-partition scan of the state container.

Why: the state container is partitioned by OrderID, so "Processing and
CompleteBy < now" fans out to every physical partition and its cost grows with
the number of records, however small the page. The index is a second container
(`recoveryIndex`) partitioned by deadline bucket (`/bucket`, CompleteBy floored
to BUCKET_SECONDS): the Supervisor reads the buckets that have passed, one
single-partition query each, so a run reads about as many documents as there
are deadlines that passed in its window — flat as the number of records grows.

Kept in step by the writers, not the change feed: an entry is added *before*
the record gets a deadline no earlier than the entry's, so a crash between the
two leaves an extra entry (discarded when visited), never a deadline with no
entry. Workflow 2.0 adds one entry per attempt, at its claim, at the earliest
deadline the attempt can have (claim time + the smaller of claim and step
timeout), and retires it itself when it finishes (`discard`). The Supervisor
recovers an attempt whose record's CompleteBy has passed, discards entries of
attempts that ended or were replaced, and moves the entry of a live attempt
whose deadline moved on to that deadline: only slow attempts pay for a move
(docs/adr/004-lean-workflow.md). Workflow 1.x adds an entry for every deadline
it sets, which the same rules handle.

Entry: {"id": "<OrderID>|<CompleteBy>", "bucket": "<yyyy-mm-ddThh:mm>",
"OrderID", "CompleteBy", "Attempt"}. The cursor the Supervisor saves is the
(bucket, last id) it reached: opaque, and valid in any process."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.cosmos import PartitionKey
from azure.cosmos.aio import ContainerProxy, CosmosClient

from adapters.cosmos_client import SDK_ERRORS, RequestCharges, translate_error
from domain.errors import NotFoundError

BUCKET_SECONDS = 60
MAX_BUCKETS_PER_PAGE = 120
PARTITION_KEY_PATH = "/bucket"


def bucket_of(moment: datetime) -> str:
    moment = moment.astimezone(UTC)
    floored = moment - timedelta(
        seconds=moment.second % BUCKET_SECONDS, microseconds=moment.microsecond
    )
    return floored.strftime("%Y-%m-%dT%H:%M:%S")


def _next_bucket(bucket: str) -> str:
    start = datetime.strptime(bucket, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return bucket_of(start + timedelta(seconds=BUCKET_SECONDS))


def entry_id(order_id: str, complete_by: datetime) -> str:
    return f"{order_id}|{complete_by.astimezone(UTC).isoformat()}"


@dataclass(frozen=True)
class IndexEntry:
    id: str
    bucket: str
    order_id: str
    complete_by: datetime
    attempt: int


async def ensure_index_container(
    client: CosmosClient, database: str, container: str
) -> ContainerProxy:
    """Local/dev only; in Azure the Bicep templates create it."""
    db = await client.create_database_if_not_exists(database)
    return await db.create_container_if_not_exists(
        id=container, partition_key=PartitionKey(path=PARTITION_KEY_PATH)
    )


class CosmosRecoveryIndex:
    def __init__(self, container: ContainerProxy, charges: RequestCharges | None = None) -> None:
        self._container = container
        self.charges = charges if charges is not None else RequestCharges()

    async def add(self, order_id: str, complete_by: datetime, attempt: int) -> None:
        at = complete_by.astimezone(UTC).isoformat()
        body = {
            "id": entry_id(order_id, complete_by),
            "bucket": bucket_of(complete_by),
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
        """Remove the entry `add(order_id, complete_by, ...)` made; gone
        already (moved or visited by the Supervisor) is fine."""
        at = complete_by.astimezone(UTC).isoformat()
        await self.remove(
            IndexEntry(
                entry_id(order_id, complete_by),
                bucket_of(complete_by),
                order_id,
                datetime.fromisoformat(at),
                0,
            )
        )

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

    async def earliest_bucket(self) -> str | None:
        """Where a first scan starts. Cross-partition, but over live deadlines
        only (entries are removed as they are visited), and once per
        supervisor lifetime, when it has no checkpoint yet."""
        try:
            values: list[Any] = [
                v
                async for v in self._container.query_items(
                    "SELECT VALUE MIN(c.bucket) FROM c",
                    response_hook=self.charges.hook("index_query"),
                )
            ]
        except SDK_ERRORS as exc:
            raise translate_error(
                exc, "find the earliest index bucket", self.charges, "index_query"
            ) from exc
        buckets = [v for v in values if v]
        return min(buckets) if buckets else None

    async def page(
        self, upper: datetime, bucket: str, after: str, max_items: int
    ) -> tuple[list[IndexEntry], str, str, bool]:
        """Entries from (bucket, after) on, in bucket then id order, up to the
        bucket of `upper`; at most `max_items` entries and MAX_BUCKETS_PER_PAGE
        buckets. Returns (entries, bucket, after) to resume from, and whether
        the bucket of `upper` was read to its end."""
        last = bucket_of(upper)
        out: list[IndexEntry] = []
        visited = 0
        while len(out) < max_items and visited < MAX_BUCKETS_PER_PAGE:
            visited += 1
            want = max_items - len(out)
            try:
                docs = [
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
                    exc, f"read index bucket {bucket}", self.charges, "index_query"
                ) from exc
            out.extend(
                IndexEntry(
                    d["id"],
                    d["bucket"],
                    d["OrderID"],
                    datetime.fromisoformat(d["CompleteBy"]),
                    d["Attempt"],
                )
                for d in docs
            )
            if len(docs) == want:
                return out, bucket, docs[-1]["id"], False
            if bucket >= last:
                return out, bucket, "", True
            bucket, after = _next_bucket(bucket), ""
        return out, bucket, after, False
