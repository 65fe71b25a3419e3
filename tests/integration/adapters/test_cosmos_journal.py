"""The local Cosmos server's request journal, as the cost bench reads it
(bench/host_cost.py): every document request the server answered becomes
one priced request, with the documents it touched, as the simulation's
recorder makes them (bench/order_cost.py)."""

from __future__ import annotations

import pytest
from azure.cosmos.aio import ContainerProxy
from azure.cosmos.exceptions import CosmosResourceNotFoundError

from bench.cosmos_ru import Op, RuModel, bicep_policies
from bench.host_cost import ops_from_journal, price, start_journal, take_journal
from bench.order_cost import load_limits
from devstack.cosmos import CosmosServer


@pytest.fixture
def journal(cosmos_server: CosmosServer):
    start_journal(cosmos_server.port)
    yield lambda: take_journal(cosmos_server.port)
    import http.client
    import ssl

    context = ssl._create_unverified_context()  # the dev server's self-signed certificate
    connection = http.client.HTTPSConnection("127.0.0.1", cosmos_server.port, context=context)
    connection.request("DELETE", "/_devstack/journal")  # off again for the other tests
    connection.getresponse().read()


async def test_each_request_is_priced_from_the_documents_it_touched(
    state_container: ContainerProxy, journal
) -> None:
    first = {"id": "o1", "ProcessState": "Pending", "LockedBy": None, "Steps": {"a": {}}}
    second = {**first, "ProcessState": "Processing", "LockedBy": "o1:1", "Note": "x" * 1500}
    gauge = {"id": "_backlog", "PendingCount": 3}
    await state_container.create_item(first)
    await state_container.read_item("o1", partition_key="o1")
    await state_container.replace_item("o1", second)
    with pytest.raises(CosmosResourceNotFoundError):
        await state_container.read_item("absent", partition_key="absent")
    await state_container.upsert_item(gauge)
    found = [
        d
        async for d in state_container.query_items(
            "SELECT * FROM c WHERE c.ProcessState = 'Processing'"
        )
    ]
    assert [d["id"] for d in found] == ["o1"]
    await state_container.delete_item("o1", partition_key="o1")

    ops = ops_from_journal(journal(), {state_container.id: "state"})
    assert [(op.kind, op.failed) for op in ops] == [
        ("create", False),
        ("read", False),
        ("replace", False),
        ("read", True),
        ("upsert", False),
        ("query", False),
        ("delete", False),
    ]
    model = RuModel(load_limits(), bicep_policies())
    priced = price(ops, model, orders=1)
    stored = ops[2].new
    assert stored is not None
    assert stored["Note"] == second["Note"]  # the version the server stored, as it answered it
    own = [
        Op("state", "create", "x", new=first),
        Op("state", "read", "x", returned=[ops[0].new or {}]),
        Op("state", "replace", "x", new=second, old=first),
        Op("state", "read", "x", failed=True),
        Op("state", "delete", "x", old=second),
    ]
    # The order's own: every request but the query and the gauge's upsert.
    assert priced.requests == {
        "state create": 1,
        "state delete": 1,
        "state read": 1,
        "state read (refused)": 1,
        "state replace": 1,
    }
    assert priced.ru_per_order == pytest.approx(sum(model.charge(op) for op in own), rel=0.01)
    assert priced.periodic_requests == 2
    # The replace is charged on both versions: more than the create of either alone.
    assert priced.ru["state replace"] > model.charge(Op("state", "create", "x", new=second))
