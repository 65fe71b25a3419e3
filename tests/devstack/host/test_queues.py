"""Storage queue triggers on a real host process against Azurite, fed through azure-storage-queue."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import (
    BinaryBase64EncodePolicy,
    TextBase64DecodePolicy,
    TextBase64EncodePolicy,
)
from azure.storage.queue.aio import QueueClient

from .conftest import OFFICIAL_APP, HostProcess, wait_for, wait_status

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture
def queues(tmp_path: Path) -> dict[str, str]:
    suffix = tmp_path.name.lower().replace("_", "-")[-20:].strip("-")
    return {
        "ORDERS_QUEUE": f"orders-{suffix}",
        "FLAKY_QUEUE": f"flaky-{suffix}",
        "FANOUT_QUEUE": f"fan-{suffix}",
    }


@pytest.fixture
def host(host_factory: Any, azurite: str, queues: dict[str, str], tmp_path: Path) -> HostProcess:
    host_json = tmp_path / "host.json"
    host_json.write_text(
        json.dumps(
            {
                "version": "2.0",
                "extensions": {
                    "durableTask": {"hubName": "OfficialHub"},
                    "queues": {
                        "maxPollingInterval": "00:00:01",
                        "maxDequeueCount": 3,
                        "visibilityTimeout": "00:00:00",
                    },
                },
            }
        )
    )
    env = {"AzureWebJobsStorage": str(azurite), "OFFICIAL_QUEUES": "1", **queues}
    return host_factory(
        app_dir=OFFICIAL_APP,
        hub="OfficialHub",
        app="function_app:myApp",
        env=env,
        args=["--host-json", str(host_json)],
    )


def queue(azurite: str, name: str, **kwargs: Any) -> QueueClient:
    return QueueClient.from_connection_string(str(azurite), name, **kwargs)


async def test_a_queue_message_starts_an_orchestration(
    host: HostProcess, azurite: str, queues: dict[str, str]
) -> None:
    # Functions' default messageEncoding is base64, so producers send base64 text.
    async with queue(
        azurite, queues["ORDERS_QUEUE"], message_encode_policy=TextBase64EncodePolicy()
    ) as q:
        await q.create_queue()
        await q.send_message(json.dumps({"id": 17}))
        status = await wait_status(host.client, "order-17", "Completed", "Failed")
        assert status.output == ["Hello Seattle", "Hello Tokyo", "Hello London"]
        await wait_for(lambda: _empty(q), what="the message to be deleted")


async def _empty(q: QueueClient) -> bool:
    props = await q.get_queue_properties()
    return props.approximate_message_count == 0


async def test_failing_messages_are_retried_then_poisoned(
    host: HostProcess, azurite: str, queues: dict[str, str]
) -> None:
    name = queues["FLAKY_QUEUE"]
    async with queue(azurite, name, message_encode_policy=BinaryBase64EncodePolicy()) as q:
        await q.create_queue()
        await q.send_message(b"bad order")
        async with queue(azurite, name + "-poison") as poison:

            async def poisoned() -> list[Any]:
                try:
                    return await poison.peek_messages(max_messages=5)
                except ResourceNotFoundError:  # created on the first poisoned message
                    return []

            messages = await wait_for(poisoned, timeout=30, what="the poison queue")
        assert len(messages) == 1
        attempts = [
            json.loads(line) for line in (host.out_dir / "flaky.jsonl").read_text().splitlines()
        ]
        assert [a["dequeue_count"] for a in attempts] == [1, 2, 3]  # maxDequeueCount from host.json
        assert {a["body"] for a in attempts} == {"bad order"}
        assert await _empty(q)


async def test_a_message_that_is_not_base64_ends_in_the_poison_queue(
    host: HostProcess, azurite: str, queues: dict[str, str]
) -> None:
    name = queues["ORDERS_QUEUE"]
    async with queue(azurite, name) as q:  # no encode policy: plain text
        await q.create_queue()
        await q.send_message("{not base64}")
        async with queue(azurite, name + "-poison") as poison:

            async def poisoned() -> list[Any]:
                try:
                    return [m.content for m in await poison.peek_messages(max_messages=5)]
                except ResourceNotFoundError:
                    return []

            assert await wait_for(poisoned, timeout=30, what="the poison queue") == ["{not base64}"]


async def test_an_http_function_enqueues_through_an_output_binding(host: HostProcess) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{host.base}/api/orders", data=json.dumps({"id": 23})) as r,
    ):
        assert r.status == 202
    # The output binding's message (base64, as the extension writes it) starts the orchestration.
    status = await wait_status(host.client, "order-23", "Completed", "Failed")
    assert status.runtime_status.value == "Completed"


async def test_a_returned_list_is_sent_as_several_messages(
    host: HostProcess, azurite: str, queues: dict[str, str]
) -> None:
    name = queues["FANOUT_QUEUE"]
    async with queue(azurite, name, message_encode_policy=TextBase64EncodePolicy()) as q:
        await q.create_queue()
        await q.send_message("3")
    async with queue(azurite, name + "-out", message_decode_policy=TextBase64DecodePolicy()) as out:

        async def three() -> list[str]:
            try:
                return sorted(m.content for m in await out.peek_messages(max_messages=10))
            except ResourceNotFoundError:
                return []

        parts = await wait_for(lambda: _at_least(three, 3), what="three messages")
    assert parts == ["part 0 of 3", "part 1 of 3", "part 2 of 3"]


async def _at_least(fetch: Any, n: int) -> list[str] | None:
    got = await fetch()
    return got if len(got) >= n else None
