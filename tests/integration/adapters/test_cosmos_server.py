"""The local Cosmos DB server behaves as the service does where we rely on it
(docs/cosmos-server.md): each test here fails on the unpatched package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from azure.cosmos import PartitionKey
from azure.cosmos.aio import ContainerProxy, CosmosClient
from azure.cosmos.exceptions import (
    CosmosBatchOperationError,
    CosmosHttpResponseError,
    CosmosResourceNotFoundError,
)

from adapters.cosmos_client import build_client
from adapters.settings import CosmosAccount
from devstack.cosmos import (
    CosmosServer,
    FaultRule,
    clear_faults,
    get_faults,
    set_faults,
    start_server,
)


async def test_reading_a_missing_item_is_404_not_500(state_container: ContainerProxy) -> None:
    # Bug 1: the package answers 500 (TypeError in its read handler).
    await state_container.create_item({"id": "present"})
    with pytest.raises(CosmosResourceNotFoundError) as caught:
        await state_container.read_item("absent", partition_key="absent")
    assert caught.value.status_code == 404


async def test_patch_filter_predicate_keeps_its_case(state_container: ContainerProxy) -> None:
    # Bug 3: the package lowercases the predicate, so capitals never match.
    await state_container.create_item({"id": "p1", "ProcessState": "Pending", "N": 0})
    patched = await state_container.patch_item(
        "p1",
        partition_key="p1",
        patch_operations=[{"op": "set", "path": "/N", "value": 1}],
        filter_predicate="FROM c WHERE c.ProcessState = 'Pending'",
    )
    assert patched["N"] == 1
    with pytest.raises(CosmosHttpResponseError) as caught:
        await state_container.patch_item(
            "p1",
            partition_key="p1",
            patch_operations=[{"op": "set", "path": "/N", "value": 2}],
            filter_predicate="FROM c WHERE c.ProcessState = 'Processing'",
        )
    assert caught.value.status_code == 412
    assert (await state_container.read_item("p1", partition_key="p1"))["N"] == 1


async def test_patch_filter_predicate_is_evaluated_on_the_patched_item_only(
    cosmos_client: CosmosClient, cosmos_database: str
) -> None:
    # The launcher's own first fix assumed the alias `c` and evaluated the predicate
    # over the container by id: an item with the same id in another partition that
    # satisfied it let the patch through.
    db = await cosmos_client.create_database_if_not_exists(cosmos_database)
    box = await db.create_container("box", PartitionKey(path="/pk"))
    await box.create_item({"id": "1", "pk": "A", "State": "Done"})
    await box.create_item({"id": "1", "pk": "B", "State": "Pending"})
    ops = [{"op": "set", "path": "/touched", "value": True}]
    with pytest.raises(CosmosHttpResponseError) as caught:
        await box.patch_item(
            "1",
            partition_key="A",
            patch_operations=ops,
            filter_predicate="from c where c.State = 'Pending'",
        )
    assert caught.value.status_code == 412
    assert "touched" not in await box.read_item("1", partition_key="A")
    patched = await box.patch_item(
        "1",
        partition_key="A",
        patch_operations=ops,
        filter_predicate="FROM root WHERE root.State = 'Done'",
    )
    assert patched["touched"] is True
    assert "touched" not in await box.read_item("1", partition_key="B")


async def test_a_query_with_a_partition_key_runs_within_that_partition(
    state_container: ContainerProxy,
) -> None:
    # Bug 5: the package answered 400 "missing partition keys" unless the query text
    # named the partition-key path, and otherwise ignored the partition key header.
    for name in ("a", "b"):
        await state_container.create_item({"id": name})

    async def results(query: str, **scope: object) -> list[object]:
        return [item async for item in state_container.query_items(query, **scope)]

    assert await results("SELECT VALUE c.id FROM c", partition_key="a") == ["a"]
    assert await results(
        "SELECT VALUE c.id FROM c WHERE c.id IN ('a', 'b')", partition_key="b"
    ) == ["b"]
    assert await results("SELECT VALUE COUNT(1) FROM c", partition_key="a") == [1]
    # A feed range: here the one partition key range, so the whole container.
    (feed_range,) = [r async for r in state_container.read_feed_ranges()]
    assert sorted(await results("SELECT VALUE c.id FROM c", feed_range=feed_range)) == ["a", "b"]


async def test_item_links_hold_no_slash_so_the_sdk_can_use_them(
    state_container: ContainerProxy,
) -> None:
    # The package wrote plain base64 rids: from about the 63rd item a '/' in `_rid` and
    # `_self`, and the SDK's calls that take an item dict (they use `_self`) failed.
    items = [await state_container.create_item({"id": f"i{n}"}) for n in range(70)]
    assert not [item["_rid"] for item in items if "/" in item["_rid"]]
    later = items[62:]
    assert any("-" in item["_rid"] for item in later)  # Cosmos writes '-' for '/'
    for item in later[:4]:
        await state_container.delete_item(item, partition_key=item["id"])
    kept = later[4]
    replaced = await state_container.replace_item(kept, {"id": kept["id"], "n": 1})
    assert (replaced["n"], replaced["_rid"]) == (1, kept["_rid"])
    assert (await state_container.read_item(kept["id"], partition_key=kept["id"]))["n"] == 1
    remaining = [r async for r in state_container.query_items("SELECT VALUE COUNT(1) FROM c")]
    assert remaining == [66]


async def test_a_data_file_with_slashed_rids_still_loads(tmp_path: Path) -> None:
    # A snapshot written before the fix holds rids with '/': they load, renamed.
    data = tmp_path / "cosmos.json"
    with start_server(data_file=data) as server:
        async with _client(server) as client:
            db = await client.create_database_if_not_exists("keep")
            box = await db.create_container_if_not_exists("box", PartitionKey(path="/id"))
            items = [await box.create_item({"id": f"i{n}"}) for n in range(64)]
    slashed = [item for item in items if "-" in item["_rid"]]
    assert slashed
    snapshot = json.loads(data.read_text())
    for doc in snapshot["databases"][0]["collections"][0]["documents"]:
        doc["_rid"] = doc["_rid"].replace("-", "/")
        doc["_self"] = doc["_self"].replace("-", "/")
    data.write_text(json.dumps(snapshot))

    with start_server(data_file=data) as server:
        async with _client(server) as client:
            box = client.get_database_client("keep").get_container_client("box")
            item = await box.read_item(slashed[0]["id"], partition_key=slashed[0]["id"])
            assert (item["_rid"], item["_self"], item["_etag"]) == (
                slashed[0]["_rid"],
                slashed[0]["_self"],
                slashed[0]["_etag"],
            )
            await box.delete_item(item, partition_key=item["id"])
            new = await box.create_item({"id": "new"})
            assert new["_rid"] not in {i["_rid"] for i in items}


def _client(server: CosmosServer) -> CosmosClient:
    return CosmosClient(server.endpoint, server.key, connection_verify=False)


async def test_a_container_reads_back_the_default_indexing_policy(
    cosmos_client: CosmosClient, cosmos_database: str
) -> None:
    # The package answered {"indexingMode": "consistent"} only.
    db = await cosmos_client.create_database_if_not_exists(cosmos_database)
    plain = await db.create_container("plain", PartitionKey(path="/id"))
    assert (await plain.read())["indexingPolicy"] == {
        "indexingMode": "consistent",
        "automatic": True,
        "includedPaths": [{"path": "/*"}],
        "excludedPaths": [{"path": '/"_etag"/?'}],
    }
    given = {"indexingMode": "consistent", "excludedPaths": [{"path": "/big/*"}]}
    own = await db.create_container("own", PartitionKey(path="/id"), indexing_policy=given)
    policy = (await own.read())["indexingPolicy"]
    assert (policy["automatic"], policy["includedPaths"], policy["excludedPaths"]) == (
        True,
        [{"path": "/*"}],
        [{"path": "/big/*"}],
    )


async def test_a_composite_index_serves_its_exact_reverse_order(
    cosmos_client: CosmosClient, cosmos_database: str
) -> None:
    # The package required each direction to match: (a DESC, b DESC) got 400.
    db = await cosmos_client.create_database_if_not_exists(cosmos_database)
    index = [{"path": "/a", "order": "ascending"}, {"path": "/b", "order": "ascending"}]
    box = await db.create_container(
        "box", PartitionKey(path="/id"), indexing_policy={"compositeIndexes": [index]}
    )
    for n, (a, b) in enumerate([(1, 1), (1, 2), (2, 1)]):
        await box.create_item({"id": str(n), "a": a, "b": b})

    async def ids(order: str) -> list[str]:
        query = f"SELECT VALUE c.id FROM c ORDER BY {order}"
        return [i async for i in box.query_items(query)]

    assert await ids("c.a ASC, c.b ASC") == ["0", "1", "2"]
    assert await ids("c.a DESC, c.b DESC") == ["2", "1", "0"]
    # A mixed order is another index, in Cosmos too: still refused.
    with pytest.raises(CosmosHttpResponseError) as caught:
        await ids("c.a DESC, c.b ASC")
    assert caught.value.status_code == 400


async def test_a_transactional_batch_is_all_or_nothing(state_container: ContainerProxy) -> None:
    # Bug 2: the package kept the operations before a failed one (and answered 201).
    await state_container.create_item({"id": "x", "n": 0})
    with pytest.raises(CosmosBatchOperationError) as caught:
        await state_container.execute_item_batch(
            [
                ("replace", ("x", {"id": "x", "n": 1})),
                ("upsert", ({"id": "x", "n": 2},)),
                ("create", ({"id": "x"},)),  # 409: the item exists
                ("delete", ("x",)),
            ],
            partition_key="x",
        )
    statuses = [r["statusCode"] for r in caught.value.operation_responses]
    assert statuses == [424, 424, 409, 424]
    assert caught.value.error_index == 2
    item = await state_container.read_item("x", partition_key="x")
    assert item["n"] == 0
    # An item the batch created is gone again.
    with pytest.raises(CosmosBatchOperationError):
        await state_container.execute_item_batch(
            [("create", ({"id": "y"},)), ("read", ("absent",))], partition_key="y"
        )
    with pytest.raises(CosmosResourceNotFoundError):
        await state_container.read_item("y", partition_key="y")
    # A batch that succeeds applies every operation, Patch included.
    done = await state_container.execute_item_batch(
        [
            ("patch", ("x", [{"op": "set", "path": "/n", "value": 5}])),
            ("read", ("x",)),
        ],
        partition_key="x",
    )
    assert [r["statusCode"] for r in done] == [200, 200]
    assert done[1]["resourceBody"]["n"] == 5


async def test_fault_rules_throttle_only_their_database(
    cosmos_server: CosmosServer,
    cosmos_account: CosmosAccount,
    cosmos_database: str,
    state_container: ContainerProxy,
) -> None:
    await state_container.create_item({"id": "x"})
    set_faults(
        cosmos_server.endpoint,
        FaultRule(status=429, db=cosmos_database, retry_after_ms=40, count=3),
    )
    client = build_client(cosmos_account, throttle_retries=0)
    try:
        container = client.get_database_client(cosmos_database).get_container_client(
            state_container.id
        )
        with pytest.raises(CosmosHttpResponseError) as caught:
            await container.read_item("x", partition_key="x")
        assert caught.value.status_code == 429
        assert caught.value.headers["x-ms-retry-after-ms"] == "40"
        # Another database is not affected by the rule.
        other = await client.create_database_if_not_exists(f"{cosmos_database}-other")
        try:
            await other.create_container_if_not_exists("c", partition_key=PartitionKey(path="/id"))
            await other.get_container_client("c").create_item({"id": "y"})
        finally:
            await client.delete_database(f"{cosmos_database}-other")
    finally:
        await client.close()
    (rule,) = get_faults(cosmos_server.endpoint)
    assert rule["fired"] == 1


def test_faults_can_be_set_at_start_and_bad_rules_are_refused() -> None:
    rules = [{"status": 503, "db": "any-db", "count": 1}]
    with start_server(faults=json.dumps(rules)) as server:
        (rule,) = get_faults(server.endpoint)
        assert (rule["status"], rule["db"], rule["fired"]) == (503, "any-db", 0)
        with pytest.raises(RuntimeError, match="400"):
            set_faults(server.endpoint, FaultRule(status="429"))  # type: ignore[arg-type]
        clear_faults(server.endpoint)
        assert get_faults(server.endpoint) == []
    assert server.process.poll() is not None  # stopped on leaving the block


def test_fault_control_refuses_a_remote_endpoint() -> None:
    with pytest.raises(ValueError, match="local server only"):
        set_faults("https://myaccount.documents.azure.com:443/", FaultRule())
