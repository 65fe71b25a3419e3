"""Service Bus triggers on the host, against our emulator through the real SDK."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from .conftest import HostProcess, wait_for, wait_status

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

MAX_DELIVERY = 3
QUEUE_PROPS = {
    "DeadLetteringOnMessageExpiration": True,
    "DefaultMessageTimeToLive": "PT1H",
    "DuplicateDetectionHistoryTimeWindow": "PT10M",
    "ForwardDeadLetteredMessagesTo": "",
    "ForwardTo": "",
    "LockDuration": "PT2S",  # short, so that a slow function outlives it unless the host renews
    "MaxDeliveryCount": MAX_DELIVERY,
    "RequiresDuplicateDetection": False,
    "RequiresSession": False,
}


@pytest.fixture(scope="module")
def broker(servicebus_emulator: Any) -> Iterator[Any]:
    emulator = servicebus_emulator.start({"host-commands": QUEUE_PROPS, "host-events": QUEUE_PROPS})
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def sb_host(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    base = tmp_path_factory.mktemp("sbhost")
    (base / "out").mkdir()
    host = HostProcess(
        base / "hub",
        base / "out",
        {
            "SAMPLE_SERVICEBUS": "1",
            "SAMPLE_COMMANDS_QUEUE": "host-commands",
            "SAMPLE_EVENTS_QUEUE": "host-events",
            "ServiceBusConnection": broker.connection_string,
        },
        "real",
        base / "host.log",
    )
    host.start()
    yield host
    host.stop()


async def send(broker: Any, queue: str, body: dict[str, Any]) -> str:
    message_id = uuid.uuid4().hex
    async with (
        ServiceBusClient.from_connection_string(broker.connection_string) as client,
        client.get_queue_sender(queue) as sender,
    ):
        await sender.send_messages(ServiceBusMessage(json.dumps(body), message_id=message_id))
    return message_id


async def dead_letters(broker: Any, queue: str) -> list[Any]:
    async with (
        ServiceBusClient.from_connection_string(broker.connection_string) as client,
        client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver,
    ):
        return list(await receiver.peek_messages(max_message_count=50))


async def active(broker: Any, queue: str) -> list[Any]:
    async with (
        ServiceBusClient.from_connection_string(broker.connection_string) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        return list(await receiver.peek_messages(max_message_count=50))


async def test_a_message_starts_an_orchestration_and_another_raises_its_event(
    broker: Any, sb_host: HostProcess
) -> None:
    mid = await send(broker, "host-commands", {"cmd": "start", "id": "sb-1", "input": {"x": 2}})
    await wait_for(lambda: sb_host.events("started", instance="sb-1"), what="the start command")
    await wait_for(lambda: _waiting(sb_host, "sb-1"), what="sb-1 waiting")
    await send(broker, "host-events", {"id": "sb-1", "event": "go", "data": "hi"})
    status = await wait_status(sb_host.client, "sb-1", "Completed", "Failed")
    assert status.output == {
        "doubled": 4,
        "event": '"hi"',
        "effect": "effect:sb-1",
        "version": "2.0",
    }
    # Completed by the function (manual settlement): gone from the queue, not dead-lettered.
    assert len(sb_host.events("command", message_id=mid)) == 1
    assert not [m for m in await active(broker, "host-commands") if m.message_id == mid]
    assert not [m for m in await dead_letters(broker, "host-commands") if m.message_id == mid]


async def _waiting(host: HostProcess, iid: str) -> bool:
    s = await host.client.get_status(iid)
    return bool(s) and (s.custom_status or {}).get("stage") == "waiting"


async def test_a_failing_function_is_retried_then_dead_lettered(
    broker: Any, sb_host: HostProcess
) -> None:
    mid = await send(broker, "host-events", {"fail": True})

    async def dead() -> list[Any]:
        return [m for m in await dead_letters(broker, "host-events") if m.message_id == mid]

    letters = await wait_for(dead, timeout=60, what="the poison message in the dead-letter queue")
    attempts = sb_host.events("event_message", message_id=mid)
    # abandoned each time; counted from 1, as the Functions host counts
    assert [a["delivery_count"] for a in attempts] == list(range(1, MAX_DELIVERY + 1))
    assert letters[0].dead_letter_reason == "MaxDeliveryCountExceeded"


async def test_manual_dead_letter_keeps_the_reason(broker: Any, sb_host: HostProcess) -> None:
    mid = await send(broker, "host-commands", {"cmd": "deadletter"})

    async def dead() -> list[Any]:
        return [m for m in await dead_letters(broker, "host-commands") if m.message_id == mid]

    letters = await wait_for(dead, what="the rejected message in the dead-letter queue")
    assert letters[0].dead_letter_reason == "Rejected"
    assert letters[0].dead_letter_error_description == "asked to"
    assert len(sb_host.events("command", message_id=mid)) == 1


async def test_a_function_that_outlives_the_lock_keeps_it(
    broker: Any, sb_host: HostProcess
) -> None:
    manual = await send(broker, "host-commands", {"cmd": "slow", "sleep": 5})
    auto = await send(broker, "host-events", {"sleep": 5})
    for mid in (manual, auto):
        done = await wait_for(
            lambda mid=mid: sb_host.events("slow_done", message_id=mid),
            timeout=30,
            what="the slow function",
        )
        # a first delivery, counted from 1 for both trigger kinds (the SDK-type binding's
        # message carries the host's count, not the wire's 0)
        assert done[0]["delivery_count"] == 1
    for queue, mid in (("host-commands", manual), ("host-events", auto)):
        await wait_for(lambda q=queue, m=mid: _gone(broker, q, m), what=f"{mid} settled")
        assert not [m for m in await dead_letters(broker, queue) if m.message_id == mid]
    # Never redelivered: one invocation each, although each ran three lock durations.
    assert len(sb_host.events("command", message_id=manual)) == 1
    assert len(sb_host.events("event_message", message_id=auto)) == 1


async def _gone(broker: Any, queue: str, mid: str) -> bool:
    return not [m for m in await active(broker, queue) if m.message_id == mid]


async def test_the_durable_client_from_inside_a_function(broker: Any, sb_host: HostProcess) -> None:
    await send(broker, "host-commands", {"cmd": "client", "id": "from-fn"})
    recorded = await wait_for(
        lambda: sb_host.events("client_results", instance="from-fn"),
        timeout=60,
        what="the client calls",
    )
    results = recorded[0]["results"]
    assert "already exists" in results["restart_running"]
    assert results["status"] in ("Pending", "Running")
    assert results["listed"] is True
    assert results["output"]["event"] == '"from-client"'
    assert "is gone" in results["late_event"]
    assert results["terminated"] == "Terminated"
    assert results["terminated_output"] == "stop it"
    assert results["purged"] == 1
    assert results["after_purge"] is False
    assert results["reused"] is True
    status = await wait_status(sb_host.client, "from-fn", "Completed", "Failed")
    assert status.output["doubled"] == 10  # the reused id ran again with its new input


def test_a_missing_connection_setting_is_one_clear_line(tmp_path: Path) -> None:
    host = HostProcess(
        tmp_path / "hub",
        tmp_path,
        {
            "SAMPLE_SERVICEBUS": "1",
            "SAMPLE_COMMANDS_QUEUE": "host-commands",
            "SAMPLE_EVENTS_QUEUE": "host-events",
            "ServiceBusConnection": None,
        },
        "real",
        tmp_path / "host.log",
    )
    with pytest.raises(RuntimeError, match="exited"):
        host.start()
    log = (tmp_path / "host.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("devstack.host:")]
    assert errors == [
        "devstack.host: missing app setting 'ServiceBusConnection' (Service Bus connection of "
        "function commands); set it in local.settings.json or the environment"
    ]
    assert "Traceback" not in log


def test_an_unreachable_broker_is_one_clear_line(tmp_path: Path) -> None:
    host = HostProcess(
        tmp_path / "hub",
        tmp_path,
        {
            "SAMPLE_SERVICEBUS": "1",
            "SAMPLE_COMMANDS_QUEUE": "host-commands",
            "SAMPLE_EVENTS_QUEUE": "host-events",
            "ServiceBusConnection": "Endpoint=sb://127.0.0.1:9;SharedAccessKeyName=k;SharedAccessKey=v;"
            "UseDevelopmentEmulator=true",
        },
        "real",
        tmp_path / "host.log",
    )
    with pytest.raises(RuntimeError, match="exited"):
        host.start()
    log = (tmp_path / "host.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("devstack.host:")]
    assert len(errors) == 1
    assert "cannot open Service Bus queue 'host-commands'" in errors[0]
    assert "Traceback" not in log


async def test_max_concurrent_calls_from_host_json_bounds_the_invocations(
    broker: Any, sb_host: HostProcess
) -> None:
    ids = [uuid.uuid4().hex for _ in range(8)]
    async with (
        ServiceBusClient.from_connection_string(broker.connection_string) as client,
        client.get_queue_sender("host-events") as sender,
    ):
        await sender.send_messages(  # all at once
            [ServiceBusMessage(json.dumps({"sleep": 2}), message_id=m) for m in ids]
        )
    for mid in ids:
        await wait_for(
            lambda m=mid: sb_host.events("slow_done", message_id=m), what="the slow messages"
        )
    spans = []
    for mid in ids:
        start = sb_host.events("event_message", message_id=mid)[0]["t"]
        end = sb_host.events("slow_done", message_id=mid)[0]["t"]
        spans.append((start, end))
    overlap = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert 1 < overlap <= 4  # sample host.json: maxConcurrentCalls 4
