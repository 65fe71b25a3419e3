"""--data-dir: messages, settlement outcomes, sequence numbers and the
duplicate-detection history survive a restart (graceful or SIGKILL); without
it the emulator keeps nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from tests.fixtures.servicebus import ServiceBusEmulator

from .helpers import held_messages, receive_all

pytestmark = pytest.mark.integration

QUEUES = {
    "durable": {
        "LockDuration": "PT30S",
        "MaxDeliveryCount": 10,
        "RequiresDuplicateDetection": True,
    },
}


def _send(connection_string: str, *messages: ServiceBusMessage) -> None:
    with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_sender("durable") as sender,
    ):
        sender.send_messages(list(messages))


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["stop", "kill"])
def test_state_survives_a_restart(
    servicebus_emulator: ServiceBusEmulator, tmp_path: Path, stop: str
) -> None:

    emulator = servicebus_emulator.start(QUEUES, data_dir=tmp_path / "data")
    _send(
        emulator.connection_string,
        *(ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(5)),
    )
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_receiver("durable") as receiver,
    ):
        m0, m1, m2, m3, m4 = receive_all(receiver, 5)
        receiver.complete_message(m0)
        receiver.dead_letter_message(m1, reason="kept", error_description="across restarts")
        receiver.defer_message(m2)
        receiver.abandon_message(m3)  # delivery count 1 must survive
        # m4 stays locked: after the restart it is available again
    getattr(emulator, stop)()

    emulator.restart()
    _send(
        emulator.connection_string,
        ServiceBusMessage("dup", message_id="m4"),
        ServiceBusMessage("new", message_id="m5"),
    )
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with client.get_queue_receiver("durable") as receiver:
            # m0 completed, m1 dead-lettered, m2 deferred, m4's duplicate dropped
            assert [m.message_id for m in held_messages(receiver)] == ["m2", "m3", "m4", "m5"]
            received = {m.message_id: m for m in receive_all(receiver, 3)}
            assert sorted(received) == ["m3", "m4", "m5"]
            assert received["m3"].delivery_count == 1
            assert received["m3"].sequence_number == m3.sequence_number
            assert received["m5"].sequence_number > m4.sequence_number  # numbering continues
            for message in received.values():
                receiver.complete_message(message)
            [deferred] = receiver.receive_deferred_messages([m2.sequence_number])
            receiver.complete_message(deferred)
        with client.get_queue_receiver("durable", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            [dead] = receive_all(dlq, 1)
            assert (
                dead.message_id,
                dead.dead_letter_reason,
                dead.dead_letter_error_description,
            ) == (
                "m1",
                "kept",
                "across restarts",
            )
            dlq.complete_message(dead)
    emulator.stop()


def test_without_a_data_dir_nothing_survives(servicebus_emulator: ServiceBusEmulator) -> None:
    emulator = servicebus_emulator.start(QUEUES)
    _send(emulator.connection_string, ServiceBusMessage("volatile", message_id="v1"))
    emulator.stop()
    emulator.restart()
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_receiver("durable") as receiver,
    ):
        assert held_messages(receiver) == []
    emulator.stop()


def test_a_journal_from_before_the_state_time_column_is_read(tmp_path: Path) -> None:
    """A data dir written before session states kept their time: the column is added
    (time 0: not after any filter time) and the state is read as before."""
    import sqlite3

    from devstack.servicebus.journal import SqliteJournal

    with sqlite3.connect(tmp_path / "servicebus.sqlite3") as db:
        db.execute(
            "CREATE TABLE session_states (queue TEXT NOT NULL, session_id TEXT NOT NULL, "
            "state BLOB, PRIMARY KEY (queue, session_id))"
        )
        db.execute("INSERT INTO session_states VALUES ('q', 's', x'6b')")
    journal = SqliteJournal(tmp_path)
    rows = journal._db.execute("SELECT queue, session_id, state, updated_ms FROM session_states")
    assert rows.fetchall() == [("q", "s", b"k", 0)]
    journal.put_session_state("q", "s", b"v", 1234)
    journal.flush()
    rows = journal._db.execute("SELECT state, updated_ms FROM session_states")
    assert rows.fetchall() == [(b"v", 1234)]
