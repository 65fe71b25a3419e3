"""Fixtures for the emulator's own tests: one emulator with a test config in
which every test owns its queues, so tests do not see each other's messages,
and short lock durations and TTLs keep the suite fast."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from tests.fixtures.servicebus import EmulatorProcess, ServiceBusEmulator

LONG_LOCK = {"LockDuration": "PT30S", "MaxDeliveryCount": 10}
SHORT_LOCK = {"LockDuration": "PT1S", "MaxDeliveryCount": 10}

#: name -> Properties, in the official emulator's Config.json vocabulary.
TEST_QUEUES: dict[str, dict[str, Any]] = {
    "basic": LONG_LOCK,
    "batch": LONG_LOCK,
    "receive-and-delete": LONG_LOCK,
    "abandon": LONG_LOCK,
    "dead-letter": LONG_LOCK,
    "defer": LONG_LOCK,
    "peek": LONG_LOCK,
    "schedule": LONG_LOCK,
    "async": LONG_LOCK,
    "competing": LONG_LOCK,
    "many-connections": LONG_LOCK,
    "prefetch": LONG_LOCK,
    "properties": LONG_LOCK,
    "large": LONG_LOCK,
    "lock-expiry": SHORT_LOCK,
    "lock-duration": {"LockDuration": "PT3S", "MaxDeliveryCount": 10},
    "renew": {"LockDuration": "PT3S", "MaxDeliveryCount": 10},
    "abrupt": SHORT_LOCK,
    "max-delivery": {"LockDuration": "PT1S", "MaxDeliveryCount": 3},
    "max-delivery-expiry": {"LockDuration": "PT1S", "MaxDeliveryCount": 2},
    "dedup": {
        **LONG_LOCK,
        "RequiresDuplicateDetection": True,
        "DuplicateDetectionHistoryTimeWindow": "PT10M",
    },
    "dedup-short": {
        **LONG_LOCK,
        "RequiresDuplicateDetection": True,
        "DuplicateDetectionHistoryTimeWindow": "PT20S",  # Azure's minimum
    },
    "no-dedup": {**LONG_LOCK, "RequiresDuplicateDetection": False},
    "ttl-dead-letter": {
        **LONG_LOCK,
        "DefaultMessageTimeToLive": "PT1S",
        "DeadLetteringOnMessageExpiration": True,
    },
    "ttl-drop": {
        **LONG_LOCK,
        "DefaultMessageTimeToLive": "PT1S",
        "DeadLetteringOnMessageExpiration": False,
    },
    "ttl-per-message": {
        **LONG_LOCK,
        "DefaultMessageTimeToLive": "P1D",
        "DeadLetteringOnMessageExpiration": True,
    },
    "limited-count": {**LONG_LOCK, "MaxMessageCount": 3},
    "limited-size": {**LONG_LOCK, "MaxSizeInMegabytes": 1},
    "limit-header": LONG_LOCK,
    "limit-size": LONG_LOCK,
    "refusals": LONG_LOCK,
    # Session queues: one per test, so no test sees another's sessions.
    **{
        name: {**LONG_LOCK, "RequiresSession": True}
        for name in (
            "session-send",
            "session-order",
            "session-next",
            "session-exclusive",
            "session-state",
            "session-renew",
            "session-abandon",
            "session-defer",
            "session-async",
            "session-delete",
            "session-list",
        )
    },
    "session-expiry": {"LockDuration": "PT2S", "MaxDeliveryCount": 10, "RequiresSession": True},
    "annotations": LONG_LOCK,
    "message-state": LONG_LOCK,
    "admin-refusal": LONG_LOCK,
}


@pytest.fixture(scope="session")
def emulator(servicebus_emulator: ServiceBusEmulator) -> EmulatorProcess:
    """The emulator running TEST_QUEUES (debug logging, so outcomes can be checked in its log)."""
    return servicebus_emulator.start(TEST_QUEUES, log_level="DEBUG")


@pytest.fixture
def client(emulator: EmulatorProcess) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(emulator.connection_string) as sb_client:
        yield sb_client
