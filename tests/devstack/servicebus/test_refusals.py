"""What the emulator does not do is refused when the link opens, with an error
that names the feature, so the SDK raises at once instead of failing later."""

from __future__ import annotations

import time

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import ServiceBusError

from devstack.servicebus.protocol import is_coordinator
from tests.fixtures.servicebus import EmulatorProcess

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("session_id", ["s-1", NEXT_AVAILABLE_SESSION])
def test_a_session_receiver_on_a_queue_without_sessions_is_refused(
    client: ServiceBusClient, session_id: object
) -> None:
    started = time.monotonic()
    with (
        pytest.raises(ServiceBusError, match="sessionful message receiver") as raised,
        client.get_queue_receiver("refusals", session_id=session_id, max_wait_time=5),
    ):
        pass
    assert "does not require sessions" in str(raised.value)
    assert "amqp:not-allowed" in str(raised.value)
    # Refused at attach: no wait for the 5 s (or the SDK's 65 s) session timeout.
    assert time.monotonic() - started < 4.5


async def test_a_session_receiver_is_refused_through_the_async_client(
    emulator: EmulatorProcess,
) -> None:
    async with AsyncServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with pytest.raises(ServiceBusError, match="does not require sessions"):
            async with client.get_queue_receiver("refusals", session_id="s-1", max_wait_time=5):
                pass


def test_sending_to_a_dead_letter_queue_is_refused(client: ServiceBusClient) -> None:
    with (
        pytest.raises(ServiceBusError, match="dead-letter queue"),
        client.get_queue_sender("refusals/$DeadLetterQueue") as sender,
    ):
        sender.send_messages(ServiceBusMessage("x"))


def test_the_queue_still_works_after_refusals(client: ServiceBusClient) -> None:
    with client.get_queue_sender("refusals") as sender:
        sender.send_messages(ServiceBusMessage("after"))
    with client.get_queue_receiver("refusals", max_wait_time=5) as receiver:
        [message] = receiver.receive_messages(max_wait_time=5)
        assert b"".join(message.body) == b"after"
        receiver.complete_message(message)


def test_a_transaction_coordinator_target_is_recognised() -> None:
    # No public Python SDK API opens a coordinator link (it has no transactions), so the
    # decision is checked on the decoded attach target the codec produces.
    assert is_coordinator([[b"amqp:local-transactions"]])
    assert not is_coordinator([b"amqps://127.0.0.1/orders", None, None])
    assert not is_coordinator(None)
