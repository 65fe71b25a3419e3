"""One emulator for the SDK's copied live tests: a queue per test, declared with the
properties its `ServiceBusQueuePreparer` asks for (see preparers.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.fixtures.servicebus import EmulatorProcess, ServiceBusEmulator


def pytest_configure(config: pytest.Config) -> None:
    for marker in (
        "liveTest: an Azure SDK live test (copied unchanged)",
        "live_test_only: an Azure SDK test that needs a live service",
        "sdk_queue(props): the queue an SDK live test's preparer asks for",
    ):
        config.addinivalue_line("markers", marker)


def pytest_pycollect_makeitem(collector: Any, name: str, obj: Any) -> Any:
    """The SDK names its test classes `...Tests` (unittest collected them); collect them."""
    if isinstance(obj, type) and name.endswith("Tests") and name.startswith("ServiceBus"):
        return pytest.Class.from_parent(collector, name=name)
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Our marks for them: they talk to a real emulator, and most wait for locks, schedules
    or expiry in real time (the schedule tests wait two minutes, as on Azure)."""
    for item in items:
        if item.get_closest_marker("sdk_queue") is not None:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.slow)


def _queue_name(item: pytest.Item) -> str:
    """One queue per test function (a parametrized test's cases share it, as they share the
    SDK preparer's queue): its name without `test_`, underscores as hyphens."""
    name = getattr(item, "originalname", None) or item.name
    return name.removeprefix("test_").replace("_", "-")[:200]


@pytest.fixture(scope="session")
def sdk_emulator(
    request: pytest.FixtureRequest, servicebus_emulator: ServiceBusEmulator
) -> EmulatorProcess:
    queues = {
        _queue_name(item): marker.args[0]
        for item in request.session.items
        if (marker := item.get_closest_marker("sdk_queue")) is not None
    }
    return servicebus_emulator.start(queues, log_level="DEBUG")


@pytest.fixture
def servicebus_namespace_connection_string(sdk_emulator: EmulatorProcess) -> str:
    return sdk_emulator.connection_string


@pytest.fixture
def servicebus_queue(request: pytest.FixtureRequest) -> SimpleNamespace:
    """What the SDK's preparer passes: an object with the queue's `name`."""
    return SimpleNamespace(name=_queue_name(request.node))
