"""Calls and admin look-ups shared by the remote service tests."""

from __future__ import annotations

from typing import Any

from aiohttp import ClientSession


async def call(
    client: ClientSession,
    path: str,
    key: str | None = "o1/reserve-inventory",
    token: int | str | None = 1,
    body: Any = None,
    **kwargs: Any,
):
    headers = {}
    if key is not None:
        headers["Idempotency-Key"] = key
    if token is not None:
        headers["Fencing-Token"] = str(token)
    return await client.post(
        path, json={"OrderID": "o1"} if body is None else body, headers=headers, **kwargs
    )


async def effects(client: ClientSession, order_id: str | None = None) -> dict[str, Any]:
    params = {"order_id": order_id} if order_id else {}
    response = await client.get("/_admin/side-effects", params=params)
    assert response.status == 200
    return await response.json()


async def effect_count(client: ClientSession, order: str, step: str, operation: str) -> int:
    for row in (await effects(client))["effects"]:
        if (row["order_id"], row["step"], row["operation"]) == (order, step, operation):
            return row["count"]
    return 0


async def add_fault(client: ClientSession, **rule: Any) -> int:
    response = await client.post("/_admin/faults", json=rule)
    assert response.status == 201, await response.text()
    return (await response.json())["ids"][0]
