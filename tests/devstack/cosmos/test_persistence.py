"""The local Cosmos DB server keeps its data in a file across restarts (launcher.js
--data-file): databases, containers with their indexing policy, items with their etags.
Real servers, the real azure-cosmos SDK."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from azure.cosmos import PartitionKey
from azure.cosmos.aio import CosmosClient
from azure.cosmos.exceptions import CosmosResourceNotFoundError

from devstack.cosmos.server import CosmosServer, start_server

pytestmark = pytest.mark.integration

POLICY = {
    "indexingMode": "consistent",
    "includedPaths": [{"path": "/*"}],
    "compositeIndexes": [
        [{"path": "/state", "order": "ascending"}, {"path": "/n", "order": "ascending"}]
    ],
}


def client(server: CosmosServer) -> CosmosClient:
    return CosmosClient(server.endpoint, server.key, connection_verify=False)


async def test_items_containers_and_etags_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "cosmos.json"
    server = start_server(data_file=data)
    try:
        async with client(server) as c:
            db = await c.create_database_if_not_exists("keep")
            box = await db.create_container_if_not_exists(
                id="box", partition_key=PartitionKey(path="/id"), indexing_policy=POLICY
            )
            etags = {}
            for n in range(5):
                item = await box.create_item({"id": f"i{n}", "state": "open", "n": n})
                etags[item["id"]] = item["_etag"]
            await box.delete_item("i4", partition_key="i4")
    finally:
        server.stop()  # SIGTERM: the launcher writes its snapshot on the way out
    assert "ready at" in "\n".join(server.output)

    again = start_server(data_file=data)
    try:
        assert any("loaded 1 databases, 4 items" in line for line in again.output)
        async with client(again) as c:
            box = c.get_database_client("keep").get_container_client("box")
            item = await box.read_item("i2", partition_key="i2")
            assert item["_etag"] == etags["i2"]  # an etag a client holds is still good
            with pytest.raises(CosmosResourceNotFoundError):
                await box.read_item("i4", partition_key="i4")
            # the composite index came back: an ORDER BY on two properties still runs
            rows = [
                r
                async for r in box.query_items(
                    "SELECT c.id FROM c WHERE c.state = 'open' ORDER BY c.state, c.n",
                )
            ]
            assert [r["id"] for r in rows] == ["i0", "i1", "i2", "i3"]
            # new items get fresh resource ids (the counters were restored too)
            new = await box.create_item({"id": "i9", "state": "open", "n": 9})
            old = await box.read_item("i0", partition_key="i0")
            assert new["_rid"] != old["_rid"]
            replaced = await box.replace_item(
                "i2", {**item, "state": "done"}, etag=etags["i2"], match_condition=_if_match()
            )
            assert replaced["state"] == "done"
    finally:
        again.stop()


async def test_a_kill_keeps_what_was_written_a_second_before(tmp_path: Path) -> None:
    import asyncio

    data = tmp_path / "cosmos.json"
    server = start_server(data_file=data)
    try:
        async with client(server) as c:
            db = await c.create_database_if_not_exists("keep")
            box = await db.create_container_if_not_exists(
                id="box", partition_key=PartitionKey(path="/id")
            )
            await box.create_item({"id": "early"})
        for _ in range(50):  # the snapshot is written within a second of the change
            if data.exists() and "early" in data.read_text():
                break
            await asyncio.sleep(0.1)
    finally:
        server.child.kill()
    assert "early" in json.dumps(json.loads(data.read_text()))
    again = start_server(data_file=data)
    try:
        async with client(again) as c:
            box = c.get_database_client("keep").get_container_client("box")
            assert (await box.read_item("early", partition_key="early"))["id"] == "early"
    finally:
        again.stop()


def test_without_a_data_file_nothing_is_kept(tmp_path: Path) -> None:
    server = start_server()
    try:
        assert any("data: memory only" in line for line in server.output)
    finally:
        server.stop()


def test_an_unreadable_data_file_stops_the_start_with_one_clear_line(tmp_path: Path) -> None:
    from devstack.cosmos.server import ServerStartError

    data = tmp_path / "cosmos.json"
    data.write_text("{not json")
    with pytest.raises(ServerStartError, match=r"cannot load .*cosmos\.json.*move it away"):
        start_server(data_file=data)


def _if_match():  # type: ignore[no-untyped-def]
    from azure.core import MatchConditions

    return MatchConditions.IfNotModified
