"""Sessions, through the public SDK: session-enabled queues refuse messages
without a SessionId and non-session receivers; a session receiver (a given
session or the next available one) gets that session's messages, in order,
alone; session state; session lock renewal and expiry."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    AutoLockRenewer,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from tests.fixtures.servicebus import EmulatorProcess, ServiceBusEmulator

from .helpers import body_text, receive_all

pytestmark = pytest.mark.integration


def _send(client: ServiceBusClient, queue: str, *messages: tuple[str, str]) -> None:
    """Send (session id, body) pairs."""
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(body, session_id=sid) for sid, body in messages])


def test_a_message_without_a_session_id_is_refused(client: ServiceBusClient) -> None:
    with client.get_queue_sender("session-send") as sender:
        with pytest.raises(ServiceBusError, match="SessionId was not set"):
            sender.send_messages(ServiceBusMessage("no session"))
        # A batch with one message lacking the id is refused whole.
        with pytest.raises(ServiceBusError, match="SessionId was not set"):
            sender.send_messages(
                [ServiceBusMessage("ok", session_id="s"), ServiceBusMessage("no session")]
            )
    with client.get_queue_receiver("session-send", session_id="s", max_wait_time=1) as receiver:
        assert receiver.receive_messages(max_wait_time=1) == []


def test_a_receiver_without_a_session_is_refused(client: ServiceBusClient) -> None:
    with (
        pytest.raises(ServiceBusError, match="requires sessions"),
        client.get_queue_receiver("session-send"),
    ):
        pass


def test_a_session_receiver_gets_its_session_only_in_order(client: ServiceBusClient) -> None:
    _send(
        client,
        "session-order",
        *[("a", f"a{i}") for i in range(3)],
        *[("b", f"b{i}") for i in range(2)],
        ("a", "a3"),
    )
    with client.get_queue_receiver("session-order", session_id="a") as receiver:
        assert receiver.session.session_id == "a"
        # Peeking through a session receiver shows that session's messages only.
        peeked = receiver.peek_messages(max_message_count=10, sequence_number=1)
        assert [body_text(m) for m in peeked] == ["a0", "a1", "a2", "a3"]
        assert receiver.session.locked_until_utc is not None
        received = receive_all(receiver, 4)
        assert [body_text(m) for m in received] == ["a0", "a1", "a2", "a3"]
        assert {m.session_id for m in received} == {"a"}
        assert receiver.receive_messages(max_wait_time=1) == []
        for message in received:
            receiver.complete_message(message)
    with client.get_queue_receiver("session-order", session_id="b") as receiver:
        received = receive_all(receiver, 2)
        assert [body_text(m) for m in received] == ["b0", "b1"]
        for message in received:
            receiver.complete_message(message)


def test_next_available_session_takes_sessions_with_messages(
    client: ServiceBusClient, emulator: EmulatorProcess
) -> None:
    _send(client, "session-next", ("first", "f0"), ("second", "s0"), ("first", "f1"))
    with client.get_queue_receiver(
        "session-next", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
    ) as one:
        # The session holding the oldest message comes first.
        assert one.session.session_id == "first"
        with client.get_queue_receiver(
            "session-next", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        ) as two:
            assert two.session.session_id == "second"
            [s0] = receive_all(two, 1)
            two.complete_message(s0)
        received = receive_all(one, 2)
        assert [body_text(m) for m in received] == ["f0", "f1"]
        for message in received:
            one.complete_message(message)
    # Nothing left: the service waits up to max_wait_time, then the SDK raises a timeout.
    with ServiceBusClient.from_connection_string(
        emulator.connection_string, retry_total=0
    ) as no_retry:
        started = time.monotonic()
        with (
            pytest.raises(OperationTimeoutError, match="No session"),
            no_retry.get_queue_receiver(
                "session-next", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1
            ),
        ):
            pass
        assert 0.9 < time.monotonic() - started < 10


def test_a_waiting_next_available_receiver_gets_a_session_when_one_arrives(
    client: ServiceBusClient, emulator: EmulatorProcess
) -> None:
    def send_later() -> None:
        time.sleep(1.5)
        with ServiceBusClient.from_connection_string(emulator.connection_string) as other:
            _send(other, "session-next", ("late", "l0"))

    sender = threading.Thread(target=send_later)
    sender.start()
    with client.get_queue_receiver(
        "session-next", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=15
    ) as receiver:
        assert receiver.session.session_id == "late"
        [message] = receive_all(receiver, 1)
        receiver.complete_message(message)
    sender.join()


def test_a_session_is_locked_to_one_receiver_until_it_closes(
    client: ServiceBusClient, emulator: EmulatorProcess
) -> None:
    _send(client, "session-exclusive", ("x", "x0"), ("x", "x1"))
    with ServiceBusClient.from_connection_string(
        emulator.connection_string, retry_total=0
    ) as no_retry:
        with client.get_queue_receiver("session-exclusive", session_id="x") as holder:
            [x0] = holder.receive_messages(max_message_count=1, max_wait_time=5)
            with (
                pytest.raises(SessionCannotBeLockedError, match="'x'"),
                no_retry.get_queue_receiver("session-exclusive", session_id="x"),
            ):
                pass
            holder.complete_message(x0)
        # Closing the receiver released the session at once; the rest is still in order.
        with no_retry.get_queue_receiver("session-exclusive", session_id="x") as next_holder:
            received = receive_all(next_holder, 1)
            assert [body_text(m) for m in received] == ["x1"]
            next_holder.complete_message(received[0])


def test_session_state_is_kept_per_session(client: ServiceBusClient) -> None:
    with client.get_queue_receiver("session-state", session_id="s1") as receiver:
        assert receiver.session.get_state() is None
        receiver.session.set_state("step-2")
        assert receiver.session.get_state() == b"step-2"
    with client.get_queue_receiver("session-state", session_id="s2") as receiver:
        assert receiver.session.get_state() is None
        receiver.session.set_state(b"\x00\x01")
    with client.get_queue_receiver("session-state", session_id="s1") as receiver:
        assert receiver.session.get_state() == b"step-2"
        receiver.session.set_state(None)
        assert receiver.session.get_state() is None
    with client.get_queue_receiver("session-state", session_id="s2") as receiver:
        assert receiver.session.get_state() == b"\x00\x01"


def test_list_queue_sessions_names_sessions_with_messages_or_state(
    client: ServiceBusClient,
) -> None:
    """azure-servicebus 7.15's ServiceBusClient.list_queue_sessions (get-message-sessions):
    by default the sessions with an active message or a stored state, in pages of 100;
    with `state_updated_after`, those whose state was set after it; none: an empty list."""
    assert list(client.list_queue_sessions("session-list")) == []
    _send(client, "session-list", *[(f"s{i:03}", "m") for i in range(150)])
    assert sorted(client.list_queue_sessions("session-list")) == [f"s{i:03}" for i in range(150)]
    with client.get_queue_receiver("session-list", session_id="s000") as receiver:
        [message] = receive_all(receiver, 1)
        receiver.complete_message(message)
        receiver.session.set_state("kept")  # no message left, but a state: still listed
    with client.get_queue_receiver("session-list", session_id="s001") as receiver:
        [message] = receive_all(receiver, 1)
        receiver.complete_message(message)  # neither: no longer listed
    listed = set(client.list_queue_sessions("session-list"))
    assert listed == {f"s{i:03}" for i in range(150)} - {"s001"}
    before = datetime.now(UTC) - timedelta(seconds=1)
    with client.get_queue_receiver("session-list", session_id="s002") as receiver:
        receiver.session.set_state("later")
    assert list(client.list_queue_sessions("session-list", state_updated_after=before)) == ["s002"]
    assert (
        list(client.list_queue_sessions("session-list", state_updated_after=datetime.now(UTC)))
        == []
    )
    with pytest.raises(ServiceBusError, match="not session-enabled"):
        list(client.list_queue_sessions("basic"))


def test_renewing_the_session_lock_moves_its_expiry(client: ServiceBusClient) -> None:
    _send(client, "session-renew", ("r", "r0"))
    with client.get_queue_receiver("session-renew", session_id="r") as receiver:
        before = receiver.session.locked_until_utc
        [message] = receive_all(receiver, 1)
        time.sleep(0.5)
        receiver.session.renew_lock()
        assert receiver.session.locked_until_utc > before
        receiver.complete_message(message)


@pytest.mark.slow
def test_auto_lock_renewer_keeps_a_session(client: ServiceBusClient) -> None:
    _send(client, "session-expiry", ("auto", "a0"))
    renewer = AutoLockRenewer()
    try:
        with client.get_queue_receiver(
            "session-expiry", session_id="auto", auto_lock_renewer=renewer
        ) as receiver:
            [message] = receive_all(receiver, 1)
            time.sleep(3.5)  # LockDuration PT2S: only renewal keeps the session
            assert receiver.session.auto_renew_error is None
            receiver.complete_message(message)
    finally:
        renewer.close()


@pytest.mark.slow
def test_an_expired_session_lock_returns_its_messages(client: ServiceBusClient) -> None:
    _send(client, "session-expiry", ("e", "e0"))
    with client.get_queue_receiver("session-expiry", session_id="e") as receiver:
        [message] = receive_all(receiver, 1)
        assert message.delivery_count == 0
        time.sleep(3)  # LockDuration PT2S, never renewed
        with pytest.raises(SessionLockLostError):
            receiver.complete_message(message)
    with client.get_queue_receiver("session-expiry", session_id="e") as receiver:
        [again] = receive_all(receiver, 1)
        assert body_text(again) == "e0"
        assert again.delivery_count == 1  # the lost lock counted as a delivery
        receiver.complete_message(again)


@pytest.mark.slow
def test_a_renewed_session_outlives_its_lock_duration(client: ServiceBusClient) -> None:
    _send(client, "session-expiry", ("k", "k0"))
    with client.get_queue_receiver("session-expiry", session_id="k") as receiver:
        [message] = receive_all(receiver, 1)
        for _ in range(4):  # 4 x 0.8 s outlives the 2 s lock
            time.sleep(0.8)
            receiver.session.renew_lock()
        receiver.complete_message(message)
    with client.get_queue_receiver("session-expiry", session_id="k", max_wait_time=1) as receiver:
        assert receiver.receive_messages(max_wait_time=1) == []


def test_an_abandoned_message_comes_back_first(client: ServiceBusClient) -> None:
    _send(client, "session-abandon", ("o", "o0"), ("o", "o1"))
    with client.get_queue_receiver("session-abandon", session_id="o") as receiver:
        [o0] = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.abandon_message(o0)
        received = receive_all(receiver, 2)
        assert [(body_text(m), m.delivery_count) for m in received] == [("o0", 1), ("o1", 0)]
        for message in received:
            receiver.complete_message(message)


def test_deferred_and_dead_lettered_session_messages(client: ServiceBusClient) -> None:
    _send(client, "session-defer", ("d", "d0"), ("d", "d1"))
    with client.get_queue_receiver("session-defer", session_id="d") as receiver:
        d0, d1 = receive_all(receiver, 2)
        receiver.defer_message(d0)
        receiver.dead_letter_message(d1, reason="test")
        [deferred] = receiver.receive_deferred_messages([d0.sequence_number])
        assert body_text(deferred) == "d0"
        receiver.complete_message(deferred)
    # The dead-letter queue of a session queue is read without a session.
    with client.get_queue_receiver(
        "session-defer", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        [dead] = receive_all(dlq, 1)
        assert (body_text(dead), dead.session_id, dead.dead_letter_reason) == ("d1", "d", "test")
        dlq.complete_message(dead)


def test_receive_and_delete_on_a_session(client: ServiceBusClient) -> None:
    _send(client, "session-delete", ("z", "z0"), ("z", "z1"))
    with client.get_queue_receiver(
        "session-delete", session_id="z", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        assert [body_text(m) for m in receive_all(receiver, 2)] == ["z0", "z1"]
    with client.get_queue_receiver("session-delete", session_id="z", max_wait_time=1) as receiver:
        assert receiver.receive_messages(max_wait_time=1) == []


async def test_sessions_through_the_async_client(emulator: EmulatorProcess) -> None:
    async with AsyncServiceBusClient.from_connection_string(emulator.connection_string) as client:
        async with client.get_queue_sender("session-async") as sender:
            await sender.send_messages(
                [ServiceBusMessage(f"q{i}", session_id="q") for i in range(3)]
            )
        async with client.get_queue_receiver(
            "session-async", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5
        ) as receiver:
            assert receiver.session.session_id == "q"
            await receiver.session.set_state("async-state")
            await receiver.session.renew_lock()
            received = []
            while len(received) < 3:
                batch = await receiver.receive_messages(max_message_count=3, max_wait_time=5)
                assert batch
                received.extend(batch)
            assert [str(m) for m in received] == ["q0", "q1", "q2"]
            for message in received:
                await receiver.complete_message(message)
            assert await receiver.session.get_state() == b"async-state"


@pytest.mark.slow
def test_session_state_survives_a_restart(
    servicebus_emulator: ServiceBusEmulator, tmp_path: Path
) -> None:
    emulator = servicebus_emulator.start(
        {"durable-sessions": {"LockDuration": "PT30S", "RequiresSession": True}},
        data_dir=tmp_path / "data",
    )
    before = datetime.now(UTC) - timedelta(seconds=1)
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        _send(client, "durable-sessions", ("p", "p0"))
        with client.get_queue_receiver("durable-sessions", session_id="p") as receiver:
            receiver.session.set_state("kept")
    emulator.kill()
    emulator.restart()
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        # The state's time is kept too: the filtered listing still finds it.
        assert list(client.list_queue_sessions("durable-sessions", state_updated_after=before)) == [
            "p"
        ]
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_receiver("durable-sessions", session_id="p") as receiver,
    ):
        assert receiver.session.get_state() == b"kept"
        [message] = receive_all(receiver, 1)
        assert body_text(message) == "p0"
        receiver.complete_message(message)
    emulator.stop()
