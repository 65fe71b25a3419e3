"""Persistence for `--data-dir`: an embedded SQLite database.

Why SQLite rather than an append-only journal file: the state we keep is a
table that changes in place (a message's delivery count, its deferred flag,
its removal on completion), and SQLite gives that with atomic commits, crash
safety and no compaction code to write. It is in the standard library.

What survives a restart: every message that was not settled (active,
deferred, scheduled, dead-lettered) with its delivery count, each queue's
next sequence number, the duplicate-detection history and session states. Locks do not: a
message locked when the emulator stopped is available again after restart,
exactly as if its lock had expired, except that the restart itself is not
counted as a delivery.

Durability: WAL mode with `synchronous=NORMAL`, and the connection commits
before it writes any acknowledgement to the socket (protocol.Connection),
so an accepted send or a settled message survives the emulator process being
killed at any point. (Power loss could lose the last commits; this is a
development tool.)
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from .codec import encode_message, parse_message
from .entities import AVAILABLE, LOCKED, SCHEDULED, Broker, StoredMessage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    queue TEXT NOT NULL,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    delivery_count INTEGER NOT NULL,
    enqueued_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    scheduled_ms INTEGER,
    deferred INTEGER NOT NULL,
    dead_letter_source TEXT,
    body BLOB NOT NULL,
    PRIMARY KEY (queue, seq)
);
CREATE TABLE IF NOT EXISTS sequences (queue TEXT PRIMARY KEY, next INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS duplicates (
    queue TEXT NOT NULL, message_id TEXT NOT NULL, seen_ms INTEGER NOT NULL,
    PRIMARY KEY (queue, message_id)
);
CREATE TABLE IF NOT EXISTS session_states (
    queue TEXT NOT NULL, session_id TEXT NOT NULL, state BLOB,
    updated_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, session_id)
);
"""


class SqliteJournal:
    """Buffers changes and commits them in one transaction per flush."""

    def __init__(self, data_dir: str | Path) -> None:
        path = Path(data_dir)
        path.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path / "servicebus.sqlite3", isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(session_states)")}
        if "updated_ms" not in columns:  # a journal written before the column
            self._db.execute(
                "ALTER TABLE session_states ADD COLUMN updated_ms INTEGER NOT NULL DEFAULT 0"
            )
        self._messages: dict[tuple[str, int], StoredMessage | None] = {}
        self._sequences: dict[str, int] = {}
        self._duplicates: dict[tuple[str, str], int] = {}
        self._session_states: dict[tuple[str, str], tuple[bytes | None, int]] = {}
        self._closed = False

    # -- the entities.Journal protocol ---------------------------------------

    def put(self, queue: str, message: StoredMessage) -> None:
        self._messages[(queue, message.sequence_number)] = message

    def delete(self, queue: str, sequence_number: int) -> None:
        self._messages[(queue, sequence_number)] = None

    def put_sequence(self, queue: str, next_sequence_number: int) -> None:
        self._sequences[queue] = next_sequence_number

    def put_duplicate(self, queue: str, message_id: str, seen_ms: int) -> None:
        self._duplicates[(queue, message_id)] = seen_ms

    def put_session_state(
        self, queue: str, session_id: str, state: bytes | None, updated_ms: int = 0
    ) -> None:
        self._session_states[(queue, session_id)] = (state, updated_ms)

    def flush(self) -> None:
        if self._closed or not (
            self._messages or self._sequences or self._duplicates or self._session_states
        ):
            return
        upserts: list[tuple[Any, ...]] = []
        deletes: list[tuple[str, int]] = []
        for (queue, seq), message in self._messages.items():
            if message is None:
                deletes.append((queue, seq))
            else:
                upserts.append(_row(queue, message))
        db = self._db
        db.execute("BEGIN")
        try:
            if deletes:
                db.executemany("DELETE FROM messages WHERE queue = ? AND seq = ?", deletes)
            if upserts:
                db.executemany(
                    "INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", upserts
                )
            if self._sequences:
                db.executemany(
                    "INSERT OR REPLACE INTO sequences VALUES (?, ?)", self._sequences.items()
                )
            if self._duplicates:
                db.executemany(
                    "INSERT OR REPLACE INTO duplicates VALUES (?, ?, ?)",
                    [(q, m, s) for (q, m), s in self._duplicates.items()],
                )
            for (queue, session_id), (state, updated_ms) in self._session_states.items():
                if state is None:
                    db.execute(
                        "DELETE FROM session_states WHERE queue = ? AND session_id = ?",
                        (queue, session_id),
                    )
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO session_states VALUES (?, ?, ?, ?)",
                        (queue, session_id, state, updated_ms),
                    )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._messages.clear()
        self._sequences.clear()
        self._duplicates.clear()
        self._session_states.clear()

    # -- restart ----------------------------------------------------------------

    def restore(self, broker: Broker) -> int:
        """Load the saved state into `broker`; return the number of messages restored."""
        for queue_name, next_seq in self._db.execute("SELECT queue, next FROM sequences"):
            queue = broker.entity(queue_name)
            if queue is not None:
                queue.next_sequence_number = max(queue.next_sequence_number, next_seq)
        now_ms = broker.clock()
        for queue_name, message_id, seen_ms in self._db.execute(
            "SELECT queue, message_id, seen_ms FROM duplicates ORDER BY seen_ms"
        ):
            queue = broker.entity(queue_name)
            if queue is not None and seen_ms >= now_ms - int(
                queue.settings.duplicate_window * 1000
            ):
                queue.duplicates[message_id] = seen_ms
        for queue_name, session_id, state, updated_ms in self._db.execute(
            "SELECT queue, session_id, state, updated_ms FROM session_states"
        ):
            queue = broker.queues.get(queue_name)
            if queue is not None:
                session = queue.session(session_id)
                session.state = bytes(state)
                session.state_updated_ms = updated_ms
        restored = 0
        for row in self._db.execute("SELECT * FROM messages ORDER BY queue, seq"):
            queue = broker.queues.get(row[0])
            if queue is None:
                continue  # the queue was removed from the config
            message = StoredMessage(
                sequence_number=row[1],
                body=parse_message(row[9]),
                enqueued_ms=row[4],
                expires_ms=row[5],
                scheduled_ms=row[6],
                state=AVAILABLE if row[2] == LOCKED else row[2],
                delivery_count=row[3],
                deferred=bool(row[7]),
                dead_letter_source=row[8],
            )
            queue.restore(message)
            if message.state == SCHEDULED:
                broker.add_timer(message.scheduled_ms, "scheduled", (queue, message))
            else:
                broker.add_timer(message.expires_ms, "expiry", (queue, message))
            restored += 1
        return restored

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True
            self._db.close()


def _row(queue: str, message: StoredMessage) -> tuple[Any, ...]:
    state = AVAILABLE if message.state == LOCKED else message.state
    if message.deferred and state == AVAILABLE:
        state = "deferred"
    return (
        queue,
        message.sequence_number,
        state,
        message.delivery_count,
        message.enqueued_ms,
        message.expires_ms,
        message.scheduled_ms,
        int(message.deferred),
        message.dead_letter_source,
        # The stored form is the message as encoded for delivery, minus broker annotations.
        encode_message(message.body, 0, []),
    )
