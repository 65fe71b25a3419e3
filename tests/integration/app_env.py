"""Helpers for running the app's functions in-process against the real local
servers: the environment the app reads, and a Service Bus delivery loop that
hands a function a real received message and a recording message-actions
object, then settles through the real receiver as the host would."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

import adapters.settings
from tests.builders import KEY_SETTINGS

REGISTRY = {"webshop": "replies-webshop", "partner-portal": "replies-partner-portal"}
# Each application's ingress queue (devstack/servicebus/Config.json).
INGRESS = {"webshop": "orders-webshop", "partner-portal": "orders-partner-portal"}


def app_environment(
    cosmos_server, servicebus_emulator, database: str, **extra: str
) -> dict[str, str]:
    return {
        "CosmosDbConnection": cosmos_server.connection_string,
        "COSMOS_VERIFY_TLS": "false",
        "COSMOS_CREATE_CONTAINERS": "true",
        "STATE_DATABASE_NAME": database,
        "ORDERS_DATABASE_NAME": f"{database}-orders",
        "ServiceBusConnection": servicebus_emulator.connection_string,
        "REPLY_QUEUE_REGISTRY": json.dumps(REGISTRY),
        "ORDER_INGRESS_QUEUES": json.dumps(INGRESS),
        **KEY_SETTINGS,
        **extra,
    }


@pytest.fixture
def app_env(monkeypatch, cosmos_server, servicebus_emulator, cosmos_database):
    """Point the app's settings at the local servers and a fresh database."""

    def apply(**extra: str) -> dict[str, str]:
        env = app_environment(cosmos_server, servicebus_emulator, cosmos_database, **extra)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        adapters.settings.settings.cache_clear()
        return env

    apply()
    yield apply
    adapters.settings.settings.cache_clear()


@dataclass
class RecordingActions:
    """The methods of ServiceBusMessageActions, recording what was asked."""

    calls: list[tuple] = field(default_factory=list)

    def complete(self, message) -> None:
        self.calls.append(("complete",))

    def abandon(self, message) -> None:
        self.calls.append(("abandon",))

    def deadletter(
        self, message, deadletter_reason=None, deadletter_error_description=None
    ) -> None:
        self.calls.append(("deadletter", deadletter_reason, deadletter_error_description))

    def defer(self, message) -> None:
        self.calls.append(("defer",))


class Bus:
    """One Service Bus client for a test (a connection costs ~0.5 s of the
    SDK's own handshake cadence, so tests reuse it)."""

    def __init__(self, connection_string: str) -> None:
        self.client = ServiceBusClient.from_connection_string(connection_string)

    async def close(self) -> None:
        await self.client.close()

    async def send(
        self,
        queue: str,
        body: bytes,
        message_id: str | None = None,
        properties: dict[str, Any] | None = None,
    ) -> None:
        async with self.client.get_queue_sender(queue) as sender:
            await sender.send_messages(
                ServiceBusMessage(
                    body,
                    message_id=message_id or str(uuid.uuid4()),
                    application_properties=properties,
                )
            )

    async def deliver(self, queue: str, function, wait: float = 10, **extra) -> tuple[str, ...]:
        """Receive one message, run `function(message, actions, **extra)`,
        settle as asked (abandon when the function raises, as the host does).
        Returns the settlement call."""
        receiver = self.client.get_queue_receiver(
            queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK
        )
        async with receiver:
            messages = await receiver.receive_messages(max_message_count=1, max_wait_time=wait)
            assert messages, f"no message arrived on {queue}"
            message = messages[0]
            actions = RecordingActions()
            try:
                await function(message=message, message_actions=actions, **extra)
            except Exception:
                await receiver.abandon_message(message)
                raise
            call = actions.calls[-1] if actions.calls else ("abandon",)
            if call[0] == "complete":
                await receiver.complete_message(message)
            elif call[0] == "deadletter":
                await receiver.dead_letter_message(
                    message, reason=call[1], error_description=call[2]
                )
            else:
                await receiver.abandon_message(message)
            return call

    async def drain(self, queue: str, wait: float = 1) -> list[dict]:
        """Everything currently on `queue`, received and deleted, as JSON."""
        out = []
        receiver = self.client.get_queue_receiver(
            queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        )
        async with receiver:
            while True:
                batch = await receiver.receive_messages(max_message_count=100, max_wait_time=wait)
                if not batch:
                    return out
                for message in batch:
                    try:  # a data body; a hostile sender's value or sequence body is kept raw
                        body = b"".join(message.body)
                        parsed = json.loads(body)
                    except TypeError:
                        parsed = {"raw": repr(message.body)}
                    except ValueError:
                        parsed = {"raw": body.decode("utf-8", "replace")}
                    if not isinstance(parsed, dict):
                        parsed = {"raw": parsed}
                    parsed["_dead_letter_reason"] = message.dead_letter_reason
                    parsed["_dead_letter_description"] = message.dead_letter_error_description
                    parsed["_message_id"] = message.message_id
                    out.append(parsed)


def registered(blueprint, name: str):
    """The user function registered under `name`, read from an app the way
    the host reads it (get_functions on a DFApp with the blueprint)."""
    import azure.durable_functions as df

    app = df.DFApp()
    app.register_functions(blueprint)
    for function in app.get_functions():
        if function.get_function_name() == name:
            return function.get_user_function()
    raise KeyError(name)
