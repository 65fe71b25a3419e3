"""The emulator as a process: the ready line, per-message debug logs, unknown
entities, a bad config, and the project's own Config.json."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import MessagingEntityNotFoundError

from tests.fixtures.servicebus import ROOT, ServiceBusEmulator

from .conftest import TEST_QUEUES
from .helpers import receive_all

pytestmark = pytest.mark.integration


def test_prints_one_ready_line_with_host_port_and_queue_count(emulator) -> None:
    assert (
        emulator.ready_line.strip()
        == f"devstack.servicebus ready host=127.0.0.1 port={emulator.port} queues={len(TEST_QUEUES)}"
    )


def test_logs_each_message_outcome_at_debug_level(client: ServiceBusClient, emulator) -> None:
    with client.get_queue_sender("basic") as sender:
        sender.send_messages(ServiceBusMessage("logged", message_id="log-me"))
    with client.get_queue_receiver("basic") as receiver:
        [message] = receive_all(receiver, 1)
        receiver.complete_message(message)
    log = emulator.log_path.read_text()
    assert "entity=basic message_id=log-me" in log
    assert f"sequence={message.sequence_number} delivery_count=0 outcome=complete" in log


def test_unknown_entities_fail_fast_with_entity_not_found(emulator) -> None:
    with ServiceBusClient.from_connection_string(
        emulator.connection_string, retry_total=0
    ) as client:
        with (
            pytest.raises(MessagingEntityNotFoundError),
            client.get_queue_sender("no-such-queue") as sender,
        ):
            sender.send_messages(ServiceBusMessage("x"))
        with (
            pytest.raises(MessagingEntityNotFoundError),
            client.get_queue_receiver("no-such-queue") as receiver,
        ):
            receiver.receive_messages(max_wait_time=5)


async def test_unknown_entities_fail_fast_with_the_async_client(emulator) -> None:
    async with AsyncServiceBusClient.from_connection_string(
        emulator.connection_string, retry_total=0
    ) as client:
        with pytest.raises(MessagingEntityNotFoundError):
            async with client.get_queue_sender("no-such-queue") as sender:
                await sender.send_messages(ServiceBusMessage("x"))


def test_the_project_config_serves_the_project_queues(
    servicebus_emulator: ServiceBusEmulator,
) -> None:

    # Every queue of the project's Config.json (the app's and each client
    # application's ingress queue), counted from the file itself.
    config = json.loads((ROOT / "devstack" / "servicebus" / "Config.json").read_text())
    queues = [q["Name"] for ns in config["UserConfig"]["Namespaces"] for q in ns["Queues"]]
    assert "orders-webshop" in queues
    assert f"queues={len(queues)}" in servicebus_emulator.default.ready_line
    with ServiceBusClient.from_connection_string(servicebus_emulator.connection_string) as client:
        with client.get_queue_sender("orders-webshop") as sender:
            sender.send_messages(ServiceBusMessage("order", message_id="project-config-check"))
        with client.get_queue_receiver("orders-webshop") as receiver:
            [message] = receive_all(receiver, 1)
            assert message.message_id == "project-config-check"
            receiver.complete_message(message)


def test_a_bad_config_exits_with_an_error(tmp_path) -> None:
    bad = tmp_path / "Config.json"
    bad.write_text(
        '{"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q", "Properties": {"LockDuration": "soon"}}]}]}}'
    )
    result = subprocess.run(
        [sys.executable, "-m", "devstack.servicebus", "--port", "0", "--config", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "soon" in result.stderr


def test_the_fixture_fails_loudly_when_the_emulator_cannot_start(
    servicebus_emulator: ServiceBusEmulator, tmp_path
) -> None:
    bad = tmp_path / "Config.json"
    bad.write_text("not json")
    with pytest.raises(RuntimeError, match="did not start"):
        servicebus_emulator.start(bad)
