"""Fixtures of the client tests (tests/clients/helpers.py says what they do)."""

from __future__ import annotations

import pytest

from tests.clients.helpers import client_queues
from tests.fixtures.servicebus import EmulatorProcess, ServiceBusEmulator


@pytest.fixture(scope="session")
def client_bus(servicebus_emulator: ServiceBusEmulator) -> EmulatorProcess:
    """One emulator holding every client stack's queues (debug log: outcomes per message)."""
    return servicebus_emulator.start(client_queues(), log_level="DEBUG")
