"""The Docker compose file for the official emulators fits the settings the
app reads locally and the queues Azure gets.

No Docker engine runs here, so the file is checked as text: it mounts the
project's own Service Bus Config.json into the official emulator, and it
publishes every port local.settings.template.json points at."""

from __future__ import annotations

import re
from urllib.parse import urlparse

from tests.infra.bicep_model import COMPOSE, ROOT, SERVICEBUS_CONFIG, template_settings
from tests.infra.test_queues import config_json_queues, local_queue_names

DOCS = ROOT / "docs" / "local-with-docker.md"
EMULATOR_CONFIG_PATH = "/ServiceBus_Emulator/ConfigFiles/Config.json"


def compose() -> str:
    return COMPOSE.read_text()


def published_ports() -> set[int]:
    return {int(host) for host, _ in re.findall(r'^\s+- "(\d+):(\d+)"', compose(), re.MULTILINE)}


def _connection(name: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in template_settings()[name].split(";") if part)


def test_service_bus_emulator_reads_the_generated_config():
    """Not the project's file itself: its TTLs and windows are beyond the
    official emulator's limits (test_emulator_config.py)."""
    mount = f'"./devstack/docker/servicebus-config.json:{EMULATOR_CONFIG_PATH}:ro"'
    assert mount in compose()
    assert SERVICEBUS_CONFIG.relative_to(ROOT).as_posix() in compose()  # named as the source
    assert "image: mcr.microsoft.com/azure-messaging/servicebus-emulator" in compose()


def test_compose_config_and_bicep_name_the_same_queues():
    """Config.json's queues are Bicep's fixed queues plus one reply queue per
    default client application, and that application's ingress queue."""
    assert sorted(config_json_queues()) == local_queue_names()


def test_official_images():
    for image in (
        "mcr.microsoft.com/azure-storage/azurite",
        "mcr.microsoft.com/azure-messaging/servicebus-emulator",
        "mcr.microsoft.com/cosmosdb/linux/azure-cosmos-emulator",
        "mcr.microsoft.com/mssql/server",
        "mcr.microsoft.com/dts/dts-emulator",
    ):
        assert f"image: {image}" in compose(), image


def test_ports_match_the_local_settings():
    ports = published_ports()
    assert template_settings()["AzureWebJobsStorage"] == "UseDevelopmentStorage=true"
    assert {10000, 10001, 10002} <= ports  # Azurite's blob, queue and table defaults
    servicebus = urlparse(
        _connection("ServiceBusConnection")["Endpoint"].replace("sb://", "tcp://")
    )
    assert servicebus.port in ports
    cosmos = urlparse(_connection("CosmosDbConnection")["AccountEndpoint"])
    assert cosmos.port in ports
    assert cosmos.scheme == "https"
    assert "PROTOCOL: https" in compose()  # the vNext emulator speaks HTTP unless told otherwise


def test_dts_emulator_ports_are_published():
    assert {8080, 8082} <= published_ports()


def test_azurite_accepts_current_sdks():
    assert "--skipApiVersionCheck" in compose()


def test_licence_acceptance_is_the_users_choice():
    assert 'ACCEPT_EULA: "${ACCEPT_EULA:?' in compose()


def test_docs_walk_through_func_start():
    docs = DOCS.read_text()
    for needle in (
        "docker compose up",
        "local.settings.template.json",
        "local.settings.json",
        "func start",
        "COSMOS_CREATE_CONTAINERS",
        "devstack/servicebus/Config.json",
        "python -m devstack.docker.servicebus_config",
        "DURABLE_TASK_SCHEDULER_CONNECTION_STRING",
    ):
        assert needle in docs, needle
