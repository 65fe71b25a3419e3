"""The task hub: instances, histories and work queues in one SQLite file.

Like the Azure Storage provider, the hub has an instance table, a history table, a
control queue per orchestration (`inbox`: ExecutionStarted, TaskCompleted, TimerFired,
EventRaised, ExecutionTerminated messages, timers being messages that become visible
at their fire time) and a work-item queue for activities. Every change an episode
makes (history rows, new activities and timers, status, consumed messages) is written
in one transaction, so a process killed at any moment leaves either the state before
the episode or the state after it.

Work is owned through host leases: a host writes a heartbeat; a lock whose owner's
heartbeat is older than `lease_seconds` (real time) is free again, to other hosts: a
host never claims a row its own process holds. Several host
processes may share one file (SQLite WAL).
"""

from __future__ import annotations

import heapq
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson


def _dumps(event: Any) -> str:
    """An event as the JSON text the hub stores: orjson's compact text (the task hub's rows
    are read back only by this module and by SQLite's JSON functions). What orjson will not
    encode and the standard library will (a key that is not a string, an integer past 64
    bits) is encoded as before, by `json`."""
    try:
        return orjson.dumps(event).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(event)


def _dumps_each(events: list[Any]) -> list[str]:
    """`_dumps` of each event, without a Python call per event unless one needs `json`."""
    try:
        return [orjson.dumps(e).decode() for e in events]
    except TypeError:
        return [_dumps(e) for e in events]


SCHEMA = """
CREATE TABLE IF NOT EXISTS instances(
    instance_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    version TEXT,
    execution_id TEXT NOT NULL,
    status TEXT NOT NULL,
    input TEXT,
    output TEXT,
    custom_status TEXT,
    created_time TEXT NOT NULL,
    last_updated_time TEXT NOT NULL,
    created_epoch REAL NOT NULL,
    lock_owner TEXT
);
CREATE TABLE IF NOT EXISTS history(
    instance_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    execution_id TEXT NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY(instance_id, seq)
);
CREATE TABLE IF NOT EXISTS inbox(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id TEXT NOT NULL,
    execution_id TEXT,
    event TEXT NOT NULL,
    visible_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS inbox_visible ON inbox(visible_at);
CREATE INDEX IF NOT EXISTS inbox_instance ON inbox(instance_id);
CREATE TABLE IF NOT EXISTS activities(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    input TEXT,
    lock_owner TEXT,
    dequeue_count INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS entities(
    entity_id TEXT PRIMARY KEY,
    state TEXT,
    exists_ INTEGER NOT NULL DEFAULT 0,
    last_updated_time TEXT,
    lock_owner TEXT
);
CREATE TABLE IF NOT EXISTS entity_ops(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    entity_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    input TEXT,
    request_id TEXT,
    reply_instance TEXT,
    reply_execution TEXT
);
CREATE INDEX IF NOT EXISTS entity_ops_entity ON entity_ops(entity_id);
CREATE TABLE IF NOT EXISTS hosts(
    host_id TEXT PRIMARY KEY,
    heartbeat REAL NOT NULL
);
"""

TERMINAL = ("Completed", "Failed", "Terminated", "Canceled")
MISSING = "missing"  # a raised event's refusal: no such instance (`TurnWritten.refused`)

log = logging.getLogger("devstack.host.store")


@dataclass
class Instance:
    instance_id: str
    name: str
    version: str | None
    execution_id: str
    status: str
    input: str | None
    output: str | None
    custom_status: str | None
    created_time: str
    last_updated_time: str

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass
class Claim:
    """What to lock for this host at the end of a write it makes anyway: up to `limit`
    instances with messages visible at `now_epoch`, except those in `skip`."""

    now_epoch: float
    limit: int
    skip: set[str]
    # Only these instances (they were just sent messages): no search of the inbox.
    only: list[str] | None = None


@dataclass
class Written:
    """What a batched write did: per item, whether it was written (False: this host had
    lost its lock), the activity work items it locked for this host, the instances it
    claimed."""

    written: list[bool] = field(default_factory=list)
    # Per episode written: the seq its first new history row got.
    first_seq: list[int] = field(default_factory=list)
    activities: list[dict[str, Any]] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)
    # The turn's other writes, made in the same transaction (`commit_episodes(turn=...)`).
    turn: TurnWritten | None = None


# What an episode reads (`Store.episode_reads`): the instance, its visible inbox messages
# (id, execution id, event) and its history's shape with the rows after a seq
# (`Store.history_tail`).
EpisodeRead = tuple[
    Instance | None,
    list[tuple[int, str | None, dict[str, Any]]],
    tuple[int, int | None, list[tuple[int, dict[str, Any]]]],
]


@dataclass
class TurnWrites:
    """A loop turn's writes besides its episodes (`Store.write_turn`): starts (the keyword
    arguments of `create_or_restart_instance` without `claim`), raised events (instance
    id, event) and activity results (work item id, instance id, execution id, result)."""

    starts: list[dict[str, Any]] = field(default_factory=list)
    raises: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    results: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class TurnWritten:
    """What `Store.write_turn` did: per start, the status that refused it (None: created);
    per raised event, what refused it (None: written; `MISSING`, or the instance's terminal
    status); per result, whether it was written (False: this host no longer held its work
    item); the instances its messages went to; the instances it locked for this host."""

    blocking: list[str | None] = field(default_factory=list)
    refused: list[str | None] = field(default_factory=list)
    results: list[bool] = field(default_factory=list)
    woken: list[str] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)


def _event_refusal(db: sqlite3.Connection, instance_id: str) -> str | None:
    """What refuses an event raised for the instance, as the extension answers one (404 or
    410): `MISSING` without the instance, its status once it has ended; None: accepted."""
    row = db.execute("SELECT status FROM instances WHERE instance_id=?", (instance_id,)).fetchone()
    if row is None:
        return MISSING
    return row[0] if row[0] in TERMINAL else None


def _naming(claim: Claim | None, names: list[str]) -> Claim | None:
    """`claim`, also naming `names` unless it searches the inbox (which finds them too)."""
    if claim is None or claim.only is None:
        return claim
    return Claim(claim.now_epoch, claim.limit, claim.skip, [*claim.only, *names])


class _Transaction:
    """`Store.tx`: a class, not a `contextmanager` generator, since the hub enters one for
    every write (five an order on the product's) and the generator's machinery cost more
    than the BEGIN it wraps (yappi, bench/host_yappi.py)."""

    __slots__ = ("db",)

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.db.execute("ROLLBACK" if exc_type is not None else "COMMIT")


class Store:
    """Thin, synchronous access to the hub file. Calls are short; the loop may make them."""

    def __init__(self, path: str, host_id: str, lease_seconds: float) -> None:
        self.path = path
        self.host_id = host_id
        self.lease_seconds = lease_seconds
        self._stalled_until = 0.0
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def tx(self) -> _Transaction:
        """`with store.tx() as db:` one write transaction (BEGIN IMMEDIATE ... COMMIT, or
        ROLLBACK when the block raises)."""
        return _Transaction(self.db)

    # ---- host leases -------------------------------------------------------------------

    def heartbeat(self) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO hosts(host_id, heartbeat) VALUES(?, ?) "
                "ON CONFLICT(host_id) DO UPDATE SET heartbeat=excluded.heartbeat",
                (self.host_id, time.time()),
            )

    def start_heartbeats(self, every: float) -> Callable[[], None]:
        """Write this host's heartbeat every `every` seconds from a thread with its own
        connection (one autocommitted statement each). Returns the function that stops it.

        A beat that comes more than half a lease after the last one written is logged: other
        hosts may take this host's work over meanwhile (the lease's purpose), but this host
        never takes its own rows back (see `_free_owner_sql`), so a stall cannot make it run
        an activity or an episode twice."""
        stop = threading.Event()

        def beat() -> None:
            db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            last = time.monotonic()
            try:
                while not stop.wait(every):
                    if time.monotonic() < self._stalled_until:
                        continue  # a stall asked for by `stall_heartbeat` (tests)
                    try:
                        db.execute(
                            "INSERT INTO hosts(host_id, heartbeat) VALUES(?, ?) "
                            "ON CONFLICT(host_id) DO UPDATE SET heartbeat=excluded.heartbeat",
                            (self.host_id, time.time()),
                        )
                    except sqlite3.Error as exc:  # busy past the timeout: the next beat tries again
                        log.warning("heartbeat of host %s not written: %s", self.host_id, exc)
                        continue
                    last = self._log_stall(last)
            finally:
                db.close()

        thread = threading.Thread(target=beat, name="hub-heartbeat", daemon=True)
        thread.start()

        def stop_beating() -> None:
            stop.set()
            thread.join(5)

        return stop_beating

    def _log_stall(self, last: float) -> float:
        """Log a beat written late (the gap since `last`); returns the new beat's time."""
        now = time.monotonic()
        if now - last > self.lease_seconds / 2:
            log.warning(
                "heartbeat of host %s stalled for %.1f s (lease %.1f s)%s; it does not reclaim "
                "its own work",
                self.host_id,
                now - last,
                self.lease_seconds,
                ": other hosts may have taken its work over"
                if now - last > self.lease_seconds
                else "",
            )
        return now

    def stall_heartbeat(self, seconds: float) -> None:
        """Write no heartbeat for `seconds` (what a starved thread or a locked file does)."""
        self._stalled_until = time.monotonic() + seconds

    def release_host(self) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM hosts WHERE host_id=?", (self.host_id,))
            db.execute("UPDATE instances SET lock_owner=NULL WHERE lock_owner=?", (self.host_id,))
            db.execute("UPDATE activities SET lock_owner=NULL WHERE lock_owner=?", (self.host_id,))
            db.execute("UPDATE entities SET lock_owner=NULL WHERE lock_owner=?", (self.host_id,))

    def _free_owner_sql(self) -> tuple[str, tuple[Any, ...]]:
        """A row is free when unlocked, or locked by another host whose heartbeat is older
        than the lease. Never when this host holds it: its own heartbeat going stale (a
        stalled thread) must not make every poll claim its running work again."""
        return (
            "(lock_owner IS NULL OR (lock_owner != ? AND lock_owner NOT IN "
            "(SELECT host_id FROM hosts WHERE heartbeat > ?)))",
            (self.host_id, time.time() - self.lease_seconds),
        )

    # ---- instances ---------------------------------------------------------------------

    def event_refusal(self, instance_id: str) -> str | None:
        """What refuses an event raised for the instance now (`_event_refusal`), read on its
        own: for the one-by-one fallback and for a request refused before its write."""
        return _event_refusal(self.db, instance_id)

    def get_instance(self, instance_id: str) -> Instance | None:
        row = self.db.execute(
            "SELECT instance_id, name, version, execution_id, status, input, output, custom_status, "
            "created_time, last_updated_time FROM instances WHERE instance_id=?",
            (instance_id,),
        ).fetchone()
        return Instance(**dict(row)) if row else None

    def query_instances(
        self,
        *,
        created_from: float | None = None,
        created_to: float | None = None,
        statuses: list[str] | None = None,
        prefix: str | None = None,
    ) -> list[Instance]:
        sql = (
            "SELECT instance_id, name, version, execution_id, status, input, output, custom_status, "
            "created_time, last_updated_time FROM instances WHERE 1=1"
        )
        args: list[Any] = []
        if created_from is not None:
            sql += " AND created_epoch >= ?"
            args.append(created_from)
        if created_to is not None:
            sql += " AND created_epoch <= ?"
            args.append(created_to)
        if statuses:
            sql += f" AND status IN ({','.join('?' * len(statuses))})"
            args.extend(statuses)
        if prefix:
            sql += " AND substr(instance_id, 1, ?) = ?"
            args.extend([len(prefix), prefix])
        sql += " ORDER BY created_epoch"
        return [Instance(**dict(r)) for r in self.db.execute(sql, args).fetchall()]

    def history(self, instance_id: str, limit: int = -1) -> list[dict[str, Any]]:
        """The instance's history events in order (the first `limit` of them, if given)."""
        rows = self.db.execute(
            "SELECT event FROM history WHERE instance_id=? ORDER BY seq LIMIT ?",
            (instance_id, limit),
        ).fetchall()
        return [orjson.loads(r["event"]) for r in rows]

    def history_tail(
        self, instance_id: str, after_seq: int
    ) -> tuple[int, int | None, list[tuple[int, dict[str, Any]]]]:
        """(row count, highest seq, the (seq, event) rows after `after_seq` in order), read in
        one snapshot: what a caller that holds the earlier rows needs to extend its copy and to
        see whether anything before `after_seq` changed (rewind, reset) since it read them.
        One statement (its own read snapshot): the shape, joined to the new rows if any."""
        rows = self.db.execute(
            "SELECT s.n, s.m, h.seq, h.event FROM "
            "(SELECT COUNT(*) AS n, MAX(seq) AS m FROM history WHERE instance_id=?1) AS s "
            "LEFT JOIN history AS h ON h.instance_id=?1 AND h.seq > ?2 ORDER BY h.seq",
            (instance_id, after_seq),
        ).fetchall()
        n, m = rows[0][0], rows[0][1]
        return n, m, [(r[2], orjson.loads(r[3])) for r in rows if r[2] is not None]

    def create_or_restart_instance(
        self,
        *,
        instance_id: str,
        name: str,
        version: str | None,
        execution_id: str,
        input_json: str | None,
        started_event: dict[str, Any],
        now_iso: str,
        now_epoch: float,
        claim: Claim | None = None,
    ) -> tuple[str | None, list[str]]:
        """Create the instance (status Pending) and enqueue its ExecutionStarted; with
        `claim`, lock for this host in the same transaction the instances it names that can
        run now (the new one: its first episode then needs no claim of its own).

        Returns the status that blocks the start (Running/Pending), or None on success, and
        the instances locked. A finished instance is replaced: its history and queued
        messages are dropped.
        """
        with self.tx() as db:
            blocking = self._create_in_tx(
                db,
                instance_id=instance_id,
                name=name,
                version=version,
                execution_id=execution_id,
                input_json=input_json,
                started_event=started_event,
                now_iso=now_iso,
                now_epoch=now_epoch,
            )
            return blocking, [] if blocking is not None else self._claim_in_tx(db, claim)

    @staticmethod
    def _create_in_tx(
        db: sqlite3.Connection,
        *,
        instance_id: str,
        name: str,
        version: str | None,
        execution_id: str,
        input_json: str | None,
        started_event: dict[str, Any],
        now_iso: str,
        now_epoch: float,
    ) -> str | None:
        row = db.execute(
            "SELECT status FROM instances WHERE instance_id=?", (instance_id,)
        ).fetchone()
        if row is not None and row["status"] not in TERMINAL:
            return row["status"]
        if row is not None:
            for table in ("history", "inbox", "activities", "instances"):
                db.execute(f"DELETE FROM {table} WHERE instance_id=?", (instance_id,))
        db.execute(
            "INSERT INTO instances(instance_id, name, version, execution_id, status, input, output, "
            "custom_status, created_time, last_updated_time, created_epoch, lock_owner) "
            "VALUES(?, ?, ?, ?, 'Pending', ?, NULL, NULL, ?, ?, ?, NULL)",
            (instance_id, name, version, execution_id, input_json, now_iso, now_iso, now_epoch),
        )
        db.execute(
            "INSERT INTO inbox(instance_id, execution_id, event, visible_at) VALUES(?, ?, ?, ?)",
            (instance_id, execution_id, _dumps(started_event), 0.0),
        )
        return None

    def enqueue(
        self,
        instance_id: str,
        execution_id: str | None,
        event: dict[str, Any],
        visible_at: float = 0.0,
        claim: Claim | None = None,
    ) -> list[str]:
        """Queue a message for an instance; with `claim`, lock for this host in the same
        transaction the instances it names that can run now. Returns those locked."""
        with self.tx() as db:
            db.execute(
                "INSERT INTO inbox(instance_id, execution_id, event, visible_at) VALUES(?, ?, ?, ?)",
                (instance_id, execution_id, _dumps(event), visible_at),
            )
            return self._claim_in_tx(db, claim)

    def write_turn(self, turn: TurnWrites, claim: Claim | None = None) -> TurnWritten:
        """A loop turn's starts, raised events and activity results, in one transaction and
        in that order (each kind in the order given); with `claim`, the instances they gave
        a message to (and, if it searches, any other ready one) locked for this host in it.
        Anything that raises rolls them all back."""
        with self.tx() as db:
            written = self._write_turn_in_tx(db, turn)
            written.claimed = self._claim_in_tx(db, _naming(claim, written.woken))
        return written

    def _write_turn_in_tx(self, db: sqlite3.Connection, turn: TurnWrites) -> TurnWritten:
        out = TurnWritten()
        for start in turn.starts:
            blocking = self._create_in_tx(db, **start)
            out.blocking.append(blocking)
            if blocking is None:
                out.woken.append(start["instance_id"])
        if turn.raises:
            # Read here, in the transaction that writes the event, rather than by the
            # request on its own (a read outside a transaction costs three within).
            accepted: list[tuple[str, str]] = []
            for iid, event in turn.raises:
                refusal = _event_refusal(db, iid)
                out.refused.append(refusal)
                if refusal is None:
                    accepted.append((iid, _dumps(event)))
            if accepted:
                db.executemany(
                    "INSERT INTO inbox(instance_id, execution_id, event, visible_at) "
                    "VALUES(?, NULL, ?, 0)",
                    accepted,
                )
                out.woken += dict.fromkeys(iid for iid, _ in accepted)
        for activity_id, instance_id, execution_id, event in turn.results:
            # At least once: a work item this host no longer holds is left to its new holder.
            cur = db.execute(
                "DELETE FROM activities WHERE id=? AND lock_owner=?", (activity_id, self.host_id)
            )
            out.results.append(cur.rowcount > 0)
            if cur.rowcount:
                db.execute(
                    "INSERT INTO inbox(instance_id, execution_id, event, visible_at) "
                    "VALUES(?, ?, ?, 0)",
                    (instance_id, execution_id, _dumps(event)),
                )
                out.woken.append(instance_id)
        out.woken = list(dict.fromkeys(out.woken))
        return out

    def purge(self, instance_id: str) -> int:
        with self.tx() as db:
            row = db.execute(
                "SELECT status FROM instances WHERE instance_id=?", (instance_id,)
            ).fetchone()
            if row is None or row["status"] not in TERMINAL:
                return 0
            for table in ("history", "inbox", "activities", "instances"):
                db.execute(f"DELETE FROM {table} WHERE instance_id=?", (instance_id,))
            return 1

    # ---- orchestration work ------------------------------------------------------------

    def next_due(self) -> float | None:
        row = self.db.execute("SELECT MIN(visible_at) AS t FROM inbox").fetchone()
        return row["t"] if row and row["t"] is not None else None

    # Visible control messages in id order (FIFO) whose instance has no live owner.
    # Immediate messages have visible_at 0, timers their fire time; each query walks the
    # inbox_visible index (visible_at, then rowid) in id order, so a claim reads only the
    # first rows it needs instead of grouping every visible message of every instance
    # (which cost O(instances waiting) per claim, and a claim follows every episode).
    _READY_SQL = (
        "SELECT m.id, m.instance_id FROM inbox m "
        "LEFT JOIN instances i ON i.instance_id = m.instance_id WHERE {where} "
        "AND (i.lock_owner IS NULL OR (i.lock_owner != ? AND i.lock_owner NOT IN "
        "(SELECT host_id FROM hosts WHERE heartbeat > ?))) "
        # A suspended instance is claimed only for what can change it: resume, suspend, terminate.
        "AND (i.status IS NULL OR i.status != 'Suspended' "
        "OR json_extract(m.event, '$.EventType') IN (3, 19, 20)) ORDER BY m.id"
    )
    _READY_NOW = _READY_SQL.format(where="m.visible_at = 0")
    _READY_FIRED = _READY_SQL.format(where="m.visible_at > 0 AND m.visible_at <= ?")

    def _ready_instances(self, now_epoch: float, limit: int, busy: set[str]) -> list[str]:
        """Up to `limit` unowned instances not in `busy` with visible messages, oldest
        message first (the order of MIN(id) over each instance's visible messages)."""
        live = time.time() - self.lease_seconds
        immediate = self.db.execute(self._READY_NOW, (self.host_id, live))
        fired = self.db.execute(self._READY_FIRED, (now_epoch, self.host_id, live))
        seen: set[str] = set()
        ready: list[str] = []
        try:
            for row in heapq.merge(immediate, fired, key=lambda r: r[0]):
                iid = row[1]
                if iid in seen:
                    continue
                seen.add(iid)
                if iid not in busy:
                    ready.append(iid)
                    if len(ready) >= limit:
                        break
        finally:
            immediate.close()
            fired.close()
        return ready

    def claim_instances(self, now_epoch: float, limit: int, busy: set[str]) -> list[str]:
        """Lock up to `limit` instances that have visible messages and no live owner (one
        write transaction for the batch)."""
        rows = self._ready_instances(now_epoch, limit, busy)
        if not rows:
            return []
        with self.tx() as db:
            return self._lock_instances_in_tx(db, rows)

    def _claim_in_tx(self, db: sqlite3.Connection, claim: Claim | None) -> list[str]:
        """Inside a write transaction this host holds anyway: lock the instances that are
        ready now (`claim_instances` without a transaction of its own)."""
        if claim is None or claim.limit <= 0:
            return []
        if claim.only is None:
            rows = self._ready_instances(claim.now_epoch, claim.limit, claim.skip)
            return self._lock_instances_in_tx(db, rows) if rows else []
        wanted = [i for i in dict.fromkeys(claim.only) if i not in claim.skip]
        # A suspended instance waits for its resume (as `_ready_instances` leaves it).
        return self._lock_instances_in_tx(db, wanted, claim.limit, running=True)

    def _lock_instances_in_tx(
        self, db: sqlite3.Connection, rows: list[str], limit: int = -1, *, running: bool = False
    ) -> list[str]:
        """Lock for this host those of `rows` that are free, up to `limit` (-1: all); with
        `running`, not a suspended one."""
        claimed: list[str] = []
        free_sql, free_args = self._free_owner_sql()
        not_suspended = "status != 'Suspended' AND " if running else ""
        for iid in rows:
            if len(claimed) == limit:
                break
            cur = db.execute(
                f"UPDATE instances SET lock_owner=? WHERE {not_suspended}instance_id=? "
                f"AND {free_sql}",
                (self.host_id, iid, *free_args),
            )
            if cur.rowcount:
                claimed.append(iid)
                continue
            exists = db.execute("SELECT 1 FROM instances WHERE instance_id=?", (iid,)).fetchone()
            if exists is None:
                # Messages for an instance that no longer exists (purged): drop them.
                db.execute("DELETE FROM inbox WHERE instance_id=?", (iid,))
        return claimed

    def episode_reads(
        self, wanted: list[tuple[str, int]], now_epoch: float
    ) -> dict[str, EpisodeRead]:
        """What each episode of a batch reads, for each (instance id, after seq) in
        `wanted`, in one statement and one snapshot for them all: the instance, its inbox
        messages visible at `now_epoch` (id, execution id, event) in order, and what
        `history_tail(instance_id, after_seq)` returns. Not three statements per episode,
        nor one."""
        values = ",".join("(?, ?)" for _ in wanted)
        rows = self.db.execute(
            f"WITH want(iid, after) AS (VALUES {values}) "
            "SELECT w.iid, 0, 0, i.instance_id, i.name, i.version, i.execution_id, i.status, "
            "i.input, i.output, i.custom_status, i.created_time, i.last_updated_time "
            "FROM want AS w JOIN instances AS i ON i.instance_id = w.iid "
            "UNION ALL SELECT w.iid, 1, m.id, m.execution_id, m.event, 0, 0, 0, 0, 0, 0, 0, 0 "
            "FROM want AS w JOIN inbox AS m ON m.instance_id = w.iid AND m.visible_at <= ? "
            "UNION ALL SELECT w.iid, 2, 0, (SELECT COUNT(*) FROM history WHERE instance_id = "
            "w.iid), (SELECT MAX(seq) FROM history WHERE instance_id = w.iid), 0, 0, 0, 0, 0, "
            "0, 0, 0 FROM want AS w "
            "UNION ALL SELECT w.iid, 3, h.seq, h.event, 0, 0, 0, 0, 0, 0, 0, 0, 0 "
            "FROM want AS w JOIN history AS h ON h.instance_id = w.iid AND h.seq > w.after "
            "ORDER BY 1, 2, 3",
            (*(v for pair in wanted for v in pair), now_epoch),
        ).fetchall()
        # Per instance, in order: its row, its messages, its history's shape, its new rows.
        reads: dict[str, EpisodeRead] = {}
        inst: Instance | None = None
        messages: list[tuple[int, str | None, dict[str, Any]]] = []
        tail: list[tuple[int, dict[str, Any]]] = []
        for r in rows:
            kind = r[1]
            if kind == 0:
                inst = Instance(*r[3:])
            elif kind == 1:
                messages.append((r[2], r[3], orjson.loads(r[4])))
            elif kind == 2:
                tail = []
                reads[r[0]] = (inst, messages, (r[3], r[4], tail))
                inst, messages = None, []
            else:
                tail.append((r[2], orjson.loads(r[3])))
        return reads

    def commit_episodes(
        self,
        episodes: list[dict[str, Any]],
        *,
        own_activities: int = 0,
        claim: Claim | None = None,
        turn: TurnWrites | None = None,
    ) -> Written:
        """Write several episodes (each the keyword arguments of `_commit_episode_in_tx`) in
        one transaction: one write lock and one commit for a batch of episodes instead of one
        each. Up to `own_activities` of the activities they schedule are written already
        locked by this host (it runs them at once: no claim of its own); the loop turn's
        other writes (`write_turn`) go in the same transaction, after the episodes; and,
        with `claim`, the instances ready now are locked for this host in it."""
        out = Written()
        with self.tx() as db:
            for episode in episodes:
                ok, rows, first = self._commit_episode_in_tx(db, own=own_activities, **episode)
                own_activities -= len(rows)
                out.written.append(ok)
                out.first_seq.append(first)
                out.activities.extend(rows)
            if turn is not None:
                out.turn = self._write_turn_in_tx(db, turn)
                claim = _naming(claim, out.turn.woken)
            out.claimed = self._claim_in_tx(db, claim)
        return out

    def _commit_episode_in_tx(
        self,
        db: sqlite3.Connection,
        *,
        own: int,
        instance_id: str,
        execution_id: str,
        reset_history: bool,
        new_history: list[dict[str, Any]],
        consumed: list[int],
        activities: list[tuple[int, str, str | None]],
        timers: list[tuple[dict[str, Any], float]],
        messages: list[tuple[str, str | None, dict[str, Any]]],
        status: str,
        output: str | None,
        custom_status: str | None,
        input_json: str | None,
        now_iso: str,
        new_instances: list[dict[str, Any]] | None = None,
        entity_ops: list[dict[str, Any]] | None = None,
    ) -> tuple[bool, list[dict[str, Any]], int]:
        """Write everything one episode produced, inside the caller's transaction. False if
        the lock was lost (then nothing is written). The first `own` activities are written
        locked by this host; their rows are returned, as `claim_activities` returns them,
        with the seq of the first history row written.

        `new_instances` are sub-orchestrations to create (keyword arguments of
        `create_or_restart_instance`); an existing running one is left alone."""
        owner = db.execute(
            "SELECT lock_owner, (SELECT MAX(seq) FROM history WHERE instance_id=?1) AS m "
            "FROM instances WHERE instance_id=?1",
            (instance_id,),
        ).fetchone()
        if owner is None or owner["lock_owner"] != self.host_id:
            return False, [], -1
        if reset_history:
            db.execute("DELETE FROM history WHERE instance_id=?", (instance_id,))
            start = 0
        else:
            start = (owner["m"] + 1) if owner["m"] is not None else 0
        # Empty lists are skipped: most episodes write only some of these.
        if new_history:
            db.executemany(
                "INSERT INTO history(instance_id, seq, execution_id, event) VALUES(?, ?, ?, ?)",
                [
                    (instance_id, start + i, execution_id, text)
                    for i, text in enumerate(_dumps_each(new_history))
                ],
            )
        if consumed:
            db.executemany("DELETE FROM inbox WHERE id=?", [(i,) for i in consumed])
        taken: list[dict[str, Any]] = []
        for tid, name, inp in activities[: max(0, own)]:
            (aid,) = db.execute(
                "INSERT INTO activities(instance_id, execution_id, task_id, name, input, "
                "lock_owner, dequeue_count) VALUES(?, ?, ?, ?, ?, ?, 1) RETURNING id",
                (instance_id, execution_id, tid, name, inp, self.host_id),
            ).fetchone()
            taken.append(
                dict(
                    id=aid,
                    instance_id=instance_id,
                    execution_id=execution_id,
                    task_id=tid,
                    name=name,
                    input=inp,
                    dequeue_count=1,
                )
            )
        if len(activities) > len(taken):
            db.executemany(
                "INSERT INTO activities(instance_id, execution_id, task_id, name, input) "
                "VALUES(?, ?, ?, ?, ?)",
                [
                    (instance_id, execution_id, tid, name, inp)
                    for tid, name, inp in activities[len(taken) :]
                ],
            )
        if timers:
            db.executemany(
                "INSERT INTO inbox(instance_id, execution_id, event, visible_at) VALUES(?, ?, ?, ?)",
                [(instance_id, execution_id, _dumps(ev), at) for ev, at in timers],
            )
        if messages:
            db.executemany(
                "INSERT INTO inbox(instance_id, execution_id, event, visible_at) VALUES(?, ?, ?, 0)",
                [(iid, eid, _dumps(ev)) for iid, eid, ev in messages],
            )
        for child in new_instances or []:
            self._create_in_tx(db, **child)
        for op in entity_ops or []:
            self._enqueue_entity_op_in_tx(db, **op)
        db.execute(
            "UPDATE instances SET execution_id=?, status=?, output=?, custom_status=?, input=?, "
            "last_updated_time=?, lock_owner=NULL WHERE instance_id=?",
            (execution_id, status, output, custom_status, input_json, now_iso, instance_id),
        )
        return True, taken, start

    def drop_messages(self, instance_id: str, ids: list[int]) -> None:
        with self.tx() as db:
            db.executemany("DELETE FROM inbox WHERE id=?", [(i,) for i in ids])
            db.execute(
                "UPDATE instances SET lock_owner=NULL WHERE instance_id=? AND lock_owner=?",
                (instance_id, self.host_id),
            )

    def unlock_instance(self, instance_id: str) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE instances SET lock_owner=NULL WHERE instance_id=? AND lock_owner=?",
                (instance_id, self.host_id),
            )

    # ---- activity work -----------------------------------------------------------------

    def claim_activities(self, limit: int) -> list[sqlite3.Row]:
        if limit <= 0:
            return []
        free_sql, free_args = self._free_owner_sql()
        # A read first: an idle poll must not take the hub's write lock, which every other
        # host's commit then waits for (and SQLite waits by sleeping, on the caller's loop).
        if (
            self.db.execute(
                f"SELECT 1 FROM activities WHERE {free_sql} LIMIT 1", free_args
            ).fetchone()
            is None
        ):
            return []
        with self.tx() as db:
            rows = db.execute(
                f"SELECT id, instance_id, execution_id, task_id, name, input, dequeue_count FROM activities "
                f"WHERE {free_sql} ORDER BY id LIMIT ?",
                (*free_args, limit),
            ).fetchall()
            db.executemany(
                "UPDATE activities SET lock_owner=?, dequeue_count=dequeue_count+1 WHERE id=?",
                [(self.host_id, r["id"]) for r in rows],
            )
        return rows

    def rewind(self, instance_id: str, rewind_event: dict[str, Any], now_iso: str) -> str | None:
        """Undo a Failed instance's failures: the history loses each failed activity and
        sub-orchestration (the scheduling event and its failure) and the execution's end, the
        instance is Running again, and a GenericEvent wakes it, so the replay schedules the
        failed work anew. Returns the status that prevents it, or None."""
        with self.tx() as db:
            row = db.execute(
                "SELECT status, execution_id FROM instances WHERE instance_id=?", (instance_id,)
            ).fetchone()
            if row is None or row["status"] != "Failed":
                return row["status"] if row else "missing"
            rows = db.execute(
                "SELECT seq, event FROM history WHERE instance_id=? ORDER BY seq", (instance_id,)
            ).fetchall()
            events = [(r["seq"], orjson.loads(r["event"])) for r in rows]
            failed = {
                (4 if e["EventType"] == 6 else 7, e.get("TaskScheduledId"))
                for _, e in events
                if e["EventType"] in (6, 9)
            }  # TaskFailed, SubOrchestrationInstanceFailed
            drop = [
                seq
                for seq, e in events
                if e["EventType"] in (1, 6, 9)  # ExecutionCompleted and the failures
                or (e["EventType"], e.get("EventId")) in failed
            ]
            db.executemany(
                "DELETE FROM history WHERE instance_id=? AND seq=?",
                [(instance_id, q) for q in drop],
            )
            db.execute(
                "INSERT INTO inbox(instance_id, execution_id, event, visible_at) VALUES(?, ?, ?, 0)",
                (instance_id, row["execution_id"], _dumps(rewind_event)),
            )
            db.execute(
                "UPDATE instances SET status='Running', output=NULL, last_updated_time=? WHERE instance_id=?",
                (now_iso, instance_id),
            )
        return None

    # ---- entities ----------------------------------------------------------------------

    @staticmethod
    def _enqueue_entity_op_in_tx(
        db: sqlite3.Connection,
        *,
        entity_id: str,
        operation: str,
        input_json: str | None,
        request_id: str | None = None,
        reply_instance: str | None = None,
        reply_execution: str | None = None,
    ) -> None:
        db.execute(
            "INSERT OR IGNORE INTO entities(entity_id, state, exists_) VALUES(?, NULL, 0)",
            (entity_id,),
        )
        db.execute(
            "INSERT INTO entity_ops(entity_id, operation, input, request_id, reply_instance, reply_execution) "
            "VALUES(?, ?, ?, ?, ?, ?)",
            (entity_id, operation, input_json, request_id, reply_instance, reply_execution),
        )

    def enqueue_entity_op(self, **op: Any) -> None:
        """A signal from a client (keyword arguments of `_enqueue_entity_op_in_tx`)."""
        with self.tx() as db:
            self._enqueue_entity_op_in_tx(db, **op)

    def get_entity(self, entity_id: str) -> tuple[bool, str | None] | None:
        """(exists, serialized state) of an entity, or None if it was never addressed."""
        row = self.db.execute(
            "SELECT state, exists_ FROM entities WHERE entity_id=?", (entity_id,)
        ).fetchone()
        return (bool(row["exists_"]), row["state"]) if row else None

    def claim_entities(self, limit: int, busy: set[str]) -> list[str]:
        """Lock up to `limit` entities that have queued operations and no live owner."""
        if limit <= 0:
            return []
        rows = self.db.execute(
            "SELECT entity_id, MIN(id) AS first FROM entity_ops GROUP BY entity_id ORDER BY first LIMIT ?",
            (limit + len(busy),),
        ).fetchall()
        free_sql, free_args = self._free_owner_sql()
        claimed: list[str] = []
        for r in rows:
            eid = r["entity_id"]
            if eid in busy or len(claimed) >= limit:
                continue
            with self.tx() as db:
                cur = db.execute(
                    f"UPDATE entities SET lock_owner=? WHERE entity_id=? AND {free_sql}",
                    (self.host_id, eid, *free_args),
                )
            if cur.rowcount:
                claimed.append(eid)
        return claimed

    def entity_batch(
        self, entity_id: str, limit: int
    ) -> tuple[bool, str | None, list[sqlite3.Row]]:
        row = self.db.execute(
            "SELECT state, exists_ FROM entities WHERE entity_id=?", (entity_id,)
        ).fetchone()
        ops = self.db.execute(
            "SELECT id, operation, input, request_id, reply_instance, reply_execution FROM entity_ops "
            "WHERE entity_id=? ORDER BY id LIMIT ?",
            (entity_id, limit),
        ).fetchall()
        return bool(row["exists_"]) if row else False, row["state"] if row else None, ops

    def commit_entity_batch(
        self,
        entity_id: str,
        *,
        exists: bool,
        state: str | None,
        consumed: list[int],
        responses: list[tuple[str, str | None, dict[str, Any]]],
        now_iso: str,
    ) -> bool:
        """New state, consumed operations and the callers' responses, in one transaction."""
        with self.tx() as db:
            owner = db.execute(
                "SELECT lock_owner FROM entities WHERE entity_id=?", (entity_id,)
            ).fetchone()
            if owner is None or owner["lock_owner"] != self.host_id:
                return False
            db.executemany("DELETE FROM entity_ops WHERE id=?", [(i,) for i in consumed])
            db.executemany(
                "INSERT INTO inbox(instance_id, execution_id, event, visible_at) VALUES(?, ?, ?, 0)",
                [(iid, eid, _dumps(ev)) for iid, eid, ev in responses],
            )
            db.execute(
                "UPDATE entities SET state=?, exists_=?, last_updated_time=?, lock_owner=NULL "
                "WHERE entity_id=?",
                (state if exists else None, int(exists), now_iso, entity_id),
            )
        return True

    def unlock_entity(self, entity_id: str) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE entities SET lock_owner=NULL WHERE entity_id=? AND lock_owner=?",
                (entity_id, self.host_id),
            )
