"""Stand-ins for the Azure SDK test harness names that `test_queues.py` imports.

The SDK's live tests get a namespace connection string and a fresh queue from
`devtools_testutils`/`servicebus_preparer` decorators that create Azure resources. Here the
decorators only record the queue properties they ask for (as a `sdk_queue` mark); the
conftest starts one emulator whose Config.json declares a queue per test with those
properties, and passes the test its connection string and queue as the SDK's preparers
pass them (`servicebus_namespace_connection_string`, `servicebus_queue`). This is the
only adaptation of the copied tests: how they get a connection string and a queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

# The Azure queue properties `ServiceBusQueuePreparer` sets (servicebus_preparer.py of the
# SDK), with its defaults, in the emulator's Config.json vocabulary.
_PREPARER_DEFAULTS: dict[str, Any] = {
    "requires_duplicate_detection": False,
    "dead_lettering_on_message_expiration": False,
    "requires_session": False,
    "lock_duration": "PT30S",
}
_CONFIG_NAMES = {
    "requires_duplicate_detection": "RequiresDuplicateDetection",
    "dead_lettering_on_message_expiration": "DeadLetteringOnMessageExpiration",
    "requires_session": "RequiresSession",
    "lock_duration": "LockDuration",
}

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _unchanged(*_args: Any, **_kwargs: Any) -> Decorator:
    return lambda fn: fn


# A resource group and a namespace: the emulator is the namespace.
CachedResourceGroupPreparer = _unchanged
CachedServiceBusResourceGroupPreparer = _unchanged
CachedServiceBusNamespacePreparer = _unchanged


def ServiceBusQueuePreparer(name_prefix: str = "", **kwargs: Any) -> Decorator:  # noqa: N802 - the SDK's name
    unknown = set(kwargs) - set(_PREPARER_DEFAULTS)
    if unknown:
        raise TypeError(f"ServiceBusQueuePreparer: {sorted(unknown)} not mapped to the emulator")
    props = {_CONFIG_NAMES[k]: v for k, v in {**_PREPARER_DEFAULTS, **kwargs}.items()}
    return pytest.mark.sdk_queue(props)


CachedServiceBusQueuePreparer = ServiceBusQueuePreparer


class AzureMgmtTestCase:
    """The SDK's test base class; nothing of it is used by the copied tests."""


class AzureMgmtRecordedTestCase:
    """The base class of the SDK's later tests (test_queues_7_11.py); nothing of it is used."""


def uamqp_transport() -> tuple[list[bool], list[str]]:
    """The SDK's utilities.uamqp_transport parametrizes over uamqp (where installed) and
    pyamqp. Here pyamqp only: it is the SDK's default transport since 7.9 and the one the app
    and the local host use; uamqp is no dependency of the app (a machine may still have it)."""
    return [False], ["pyamqp"]


class ArgPasser:
    """The SDK's utilities.ArgPasser passes the preparers' keyword arguments to a test
    whose parameters after `uamqp_transport` are keyword-only with defaults, which pytest
    does not fill from fixtures. Here it gives the test the same two keyword arguments from
    this directory's fixtures (conftest.py), under a signature that names them."""

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def _preparer(
            self: Any,
            uamqp_transport: bool,
            servicebus_namespace_connection_string: str,
            servicebus_queue: Any,
        ) -> Any:
            return fn(
                self,
                uamqp_transport=uamqp_transport,
                servicebus_namespace_connection_string=servicebus_namespace_connection_string,
                servicebus_queue=servicebus_queue,
            )

        _preparer.__name__ = fn.__name__
        _preparer.__qualname__ = fn.__qualname__
        return _preparer


def get_logger(level: int) -> logging.Logger:
    """The SDK's utilities.get_logger sets the whole `azure` logger to `level` with a stdout
    handler, for the rest of the process; here a logger of the copied tests' own."""
    logger = logging.getLogger("tests.sdk_live_tests")
    logger.setLevel(level)
    return logger
