"""Fast units behind the host's speed-ups: history timestamps, the replay executor's payload
class, the receive socket timeout, heartbeats."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from azure.durable_functions.models.history.HistoryEvent import HistoryEvent
from dateutil.parser import parse as dateutil_parse
from dateutil.tz import tzutc

from devstack.host import durable, invoke, replay, servicebus
from devstack.host.app import AppCatalog
from devstack.host.clock import Clock
from devstack.host.config import DurableOptions
from devstack.host.durable import DurableEngine
from devstack.host.store import MISSING, Store


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-30T16:17:46.123456Z",
        "2026-11-30T16:17:46Z",
        "2026-11-30T16:17:46.1234567Z",  # .NET's seven digits
        "2026-11-30T16:17:46.5+00:00",
        "2026-11-30T16:17:46+02:00",
        "2026-11-30 16:17:46",
    ],
)
def test_a_parsed_timestamp_is_the_instant_dateutil_reads(text: str) -> None:
    fast = replay.parse_timestamp(text)
    slow = dateutil_parse(text)
    assert fast == slow if slow.tzinfo is not None else fast.replace(tzinfo=None) == slow
    assert (fast.utcoffset() is None) == (slow.utcoffset() is None)


def test_utc_timestamps_carry_dateutils_utc_zone() -> None:
    parsed = replay.parse_timestamp("2026-11-30T16:17:46.123456Z")
    assert isinstance(parsed.tzinfo, tzutc)
    assert parsed.utcoffset() == timedelta(0)


def test_history_events_parse_through_the_fast_path() -> None:
    module = sys.modules["azure.durable_functions.models.history.HistoryEvent"]
    assert module.dt_parse is replay.parse_timestamp
    event = HistoryEvent(
        EventType=12, EventId=-1, IsPlayed=False, Timestamp="2026-11-30T16:17:46.000001Z"
    )
    assert event.timestamp == dateutil_parse("2026-11-30T16:17:46.000001Z")


def test_the_replay_executor_builds_its_payload_class_once() -> None:
    module = sys.modules["azure.durable_functions.models.TaskOrchestrationExecutor"]
    assert module.namedtuple is replay._namedtuple
    first = module.TaskOrchestrationExecutor().event_to_SetTaskValuePayload
    second = module.TaskOrchestrationExecutor().event_to_SetTaskValuePayload
    assert first.keys() == second.keys()
    for kind, payload in first.items():
        assert type(payload) is type(second[kind])  # one class, not one per executor
        assert payload == second[kind]
        assert payload._fields == ("is_success", "task_id_key")
    # What the SDK reads from it: success flag and the event attribute naming the task.
    completed = first[5]  # TaskCompleted
    assert (completed.is_success, completed.task_id_key) == (True, "TaskScheduledId")
    assert first[6].is_success is False  # TaskFailed


def test_the_cached_namedtuple_still_builds_from_a_list_of_fields() -> None:
    point = replay._namedtuple("Point", ["x", "y"])  # unhashable fields: built, not cached
    assert point(1, 2).y == 2
    assert replay._namedtuple("Pair", ("a", "b")) is replay._namedtuple("Pair", ("a", "b"))


def test_the_receive_socket_timeout_is_short_and_can_be_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DEVSTACK_HOST_SB_SOCKET_TIMEOUT", raising=False)
    assert (
        servicebus.receive_socket_timeout() == servicebus.RECEIVE_SOCKET_TIMEOUT < 0.2
    )  # the SDK's default
    monkeypatch.setenv("DEVSTACK_HOST_SB_SOCKET_TIMEOUT", "0.2")
    assert servicebus.receive_socket_timeout() == 0.2
    monkeypatch.setenv("DEVSTACK_HOST_SB_SOCKET_TIMEOUT", "nonsense")
    assert servicebus.receive_socket_timeout() == servicebus.RECEIVE_SOCKET_TIMEOUT


def _beat(path: Path, host_id: str) -> float | None:
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT heartbeat FROM hosts WHERE host_id=?", (host_id,)).fetchone()
    return row[0] if row else None


def test_heartbeats_go_on_while_the_hosts_loop_is_blocked_and_stop_when_told(
    tmp_path: Path,
) -> None:
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    try:
        store.heartbeat()
        first = _beat(tmp_path / "hub.sqlite", "host-a")
        stop = store.start_heartbeats(0.02)
        time.sleep(1.0)  # the caller's thread is busy (a blocked loop): the thread still beats
        later = _beat(tmp_path / "hub.sqlite", "host-a")
        assert first is not None
        assert later is not None
        assert later > first
        stop()
        stopped_at = _beat(tmp_path / "hub.sqlite", "host-a")
        time.sleep(0.2)
        assert _beat(tmp_path / "hub.sqlite", "host-a") == stopped_at
        store.release_host()
        assert _beat(tmp_path / "hub.sqlite", "host-a") is None  # no beat after the release
    finally:
        store.close()


def _instance(store: Store, iid: str) -> None:
    store.create_or_restart_instance(
        instance_id=iid,
        name="orch",
        version="1.0",
        execution_id=f"{iid}-e",
        input_json=None,
        started_event={"EventType": 0, "EventId": -1, "IsPlayed": False},
        now_iso="2026-11-30T00:00:00.000000Z",
        now_epoch=0.0,
    )


def test_claims_go_oldest_visible_message_first_across_immediate_messages_and_timers(
    tmp_path: Path,
) -> None:
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    try:
        store.heartbeat()
        now = time.time()
        for iid in ("a", "b", "c", "d", "e"):
            _instance(store, iid)  # each gets its ExecutionStarted (visible_at 0), in this order
        store.enqueue("a", "a-e", {"EventType": 5}, 0.0)
        # A fired timer is older than some immediate messages: its id decides, not its kind.
        store.enqueue("z", None, {"EventType": 11}, now - 1)  # no such instance: dropped
        store.enqueue("f", None, {"EventType": 11}, now + 3600)  # not yet visible
        with store.tx() as db:  # "b" is held by a live host, "c" by one whose lease lapsed
            db.execute("INSERT INTO hosts(host_id, heartbeat) VALUES('host-b', ?)", (now,))
            db.execute("INSERT INTO hosts(host_id, heartbeat) VALUES('host-c', ?)", (now - 60,))
            db.execute("UPDATE instances SET lock_owner='host-b' WHERE instance_id='b'")
            db.execute("UPDATE instances SET lock_owner='host-c' WHERE instance_id='c'")
        with store.tx() as db:  # "d" is suspended: only resume, suspend or terminate wake it
            db.execute("UPDATE instances SET status='Suspended' WHERE instance_id='d'")
        assert store.claim_instances(now, 10, busy={"e"}) == ["a", "c"]
        assert (
            store.db.execute("SELECT COUNT(*) FROM inbox WHERE instance_id='z'").fetchone()[0] == 0
        )
        owners = dict(store.db.execute("SELECT instance_id, lock_owner FROM instances").fetchall())
        assert owners == {"a": "host-a", "b": "host-b", "c": "host-a", "d": None, "e": None}

        store.unlock_instance("a")
        store.unlock_instance("c")
        store.enqueue("d", "d-e", {"EventType": 20}, 0.0)  # ExecutionResumed wakes "d"
        assert store.claim_instances(now, 2, busy=set()) == ["a", "c"]  # the limit holds
        # "d" counts from its resume, its first message that may wake it, so "e" goes first.
        assert store.claim_instances(now, 5, busy=set()) == ["e", "d"]
        f_rows = "SELECT COUNT(*) FROM inbox WHERE instance_id='f'"
        assert store.db.execute(f_rows).fetchone()[0] == 1  # not visible yet: left alone
        assert store.claim_instances(now + 7200, 5, busy=set()) == []
        assert store.db.execute(f_rows).fetchone()[0] == 0  # came due, no such instance: dropped
    finally:
        store.close()


def test_the_engines_history_copy_always_reads_as_the_stored_history(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    engine = DurableEngine(store, AppCatalog([]), Clock(), DurableOptions())
    reads: list[int] = []
    tail = store.history_tail

    def counting_tail(instance_id: str, after_seq: int) -> Any:
        count, max_seq, rows = tail(instance_id, after_seq)
        reads.append(len(rows))
        return count, max_seq, rows

    store.history_tail = counting_tail  # type: ignore[method-assign]

    def append(execution: str, *events: dict[str, Any]) -> None:
        with store.tx() as db:
            top = db.execute("SELECT MAX(seq) FROM history WHERE instance_id='i'").fetchone()[0]
            start = -1 if top is None else top
            db.executemany(
                "INSERT INTO history(instance_id, seq, execution_id, event) VALUES('i', ?, ?, ?)",
                [(start + 1 + k, execution, json.dumps(e)) for k, e in enumerate(events)],
            )

    def check(execution: str) -> list[dict[str, Any]]:
        inst = store.get_instance("i")
        assert inst is not None
        assert inst.execution_id == execution
        got = engine._history(inst)
        # As a replay takes it: the stored events, each marked played.
        assert got == [dict(e, IsPlayed=True) for e in store.history("i")]
        # The episode's single read gives the same instance, history and visible messages.
        read, messages, shape = store.episode_reads([("i", -1)], 100.0)["i"]
        assert read == inst
        assert shape == tail("i", -1)
        assert [(m[2]["n"], m[1]) for m in messages] == [(1, "i-e"), (2, None)]
        return got

    try:
        _instance(store, "i")
        with store.tx() as db:
            db.execute("UPDATE instances SET status='Running' WHERE instance_id='i'")
            db.execute("DELETE FROM inbox WHERE instance_id='i'")
        store.enqueue("i", "i-e", {"EventType": 15, "n": 1}, 99.0)
        store.enqueue("i", None, {"EventType": 15, "n": 2}, 0.0)
        store.enqueue("i", None, {"EventType": 11, "n": 3}, 101.0)  # not visible at 100
        assert check("i-e") == []
        append("i-e", {"EventType": 12, "EventId": -1}, {"EventType": 0, "EventId": -1})
        check("i-e")
        append("i-e", {"EventType": 4, "EventId": 0, "Name": "a"})
        reads.clear()
        assert [e["EventType"] for e in check("i-e")] == [12, 0, 4]
        assert reads == [1]  # only the new row was read and parsed
        check("i-e")
        assert reads == [1, 0]

        # A rewind deletes rows in the middle, then the next episode appends after the top.
        with store.tx() as db:
            db.execute("DELETE FROM history WHERE instance_id='i' AND seq=1")
        check("i-e")
        append("i-e", {"EventType": 12, "EventId": -1}, {"EventType": 15, "Name": "go"})
        check("i-e")

        # A restart: a new execution whose history has as many rows as the old one had.
        with store.tx() as db:
            db.execute("DELETE FROM history WHERE instance_id='i'")
            db.execute("UPDATE instances SET execution_id='i-2' WHERE instance_id='i'")
        append("i-2", *({"EventType": 12, "EventId": -1, "n": k} for k in range(4)))
        got = check("i-2")
        assert [e.get("n") for e in got] == [0, 1, 2, 3]
        got.clear()  # the caller's list is its own (the events are shared, read-only)
        check("i-2")

        # An episode this host writes joins the copy as a replay reads it (played), and the
        # next read parses nothing.
        written = [{"EventType": 12, "EventId": -1, "IsPlayed": False, "n": 4}]
        append("i-2", *written)
        engine._remember_written(
            {
                "instance_id": "i",
                "execution_id": "i-2",
                "reset_history": False,
                "new_history": written,
            },
            4,
        )
        reads.clear()
        assert [(e.get("n"), e["IsPlayed"]) for e in check("i-2")] == [
            (0, True),
            (1, True),
            (2, True),
            (3, True),
            (4, True),
        ]
        assert reads == [0]
    finally:
        store.close()


@pytest.mark.parametrize(
    "when",
    [
        datetime(2026, 12, 6, 13, 4, 5, 6, tzinfo=UTC),
        datetime(2026, 12, 6, 13, 4, 5, tzinfo=timezone(timedelta(hours=2))),
        datetime(2026, 12, 6, 13, 4, 5, 120000, tzinfo=tzutc()),
    ],
)
def test_the_hosts_timestamp_text_is_the_strftime_it_replaced(when: datetime) -> None:
    assert durable.iso(when) == when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_a_settlements_wait_on_the_service_bus_loop_answers_as_a_future_would() -> None:
    """`servicebus._wait_on`: the coroutine runs on the other loop's thread; its result, its
    exception, a timeout and a cancellation reach the waiting thread as
    `run_coroutine_threadsafe(...).result(timeout)` would hand them over."""
    import concurrent.futures

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    threads: list[int] = []

    async def answer() -> int:
        threads.append(threading.get_ident())
        await asyncio.sleep(0.01)
        return 7

    async def refuse() -> None:
        raise LookupError("the lock is gone")

    async def dawdle() -> None:
        await asyncio.sleep(0.3)

    async def cancelled() -> None:
        raise asyncio.CancelledError

    try:
        assert servicebus._wait_on(loop, answer(), 5) == 7
        assert threads == [thread.ident]
        with pytest.raises(LookupError, match="the lock is gone"):
            servicebus._wait_on(loop, refuse(), 5)
        with pytest.raises(TimeoutError):
            servicebus._wait_on(loop, dawdle(), 0.05)
        with pytest.raises(concurrent.futures.CancelledError):
            servicebus._wait_on(loop, cancelled(), 5)
        time.sleep(0.4)  # the timed-out one ends on its own
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_sync_calls_return_results_and_raise_errors_to_their_own_callers() -> None:
    """Plain functions on the pool: each caller gets its own result or exception, the calls
    run off the loop's thread, and two loops calling at once each get their own answers."""

    def work(n: int) -> tuple[int, str]:
        if n == 3:
            raise ValueError("three")
        time.sleep(0.001 * (n % 4))
        return n * n, threading.current_thread().name

    async def calls() -> list[Any]:
        return await asyncio.gather(
            *(invoke._sync_calls.call(work, {"n": n}) for n in range(12)), return_exceptions=True
        )

    other: list[Any] = []
    beside = threading.Thread(target=lambda: other.append(asyncio.run(calls())))
    beside.start()  # a second loop calling at the same time, as the Service Bus loop does
    mine = asyncio.run(calls())
    beside.join(10)
    for results in (mine, *other):
        assert isinstance(results[3], ValueError)
        assert str(results[3]) == "three"
        assert [r[0] for i, r in enumerate(results) if i != 3] == [
            n * n for n in range(12) if n != 3
        ]
        assert {r[1] for i, r in enumerate(results) if i != 3} != {threading.main_thread().name}


def test_a_batchs_episode_reads_are_each_instances_own_read(tmp_path: Path) -> None:
    """One statement for a batch of episodes reads, per instance, what its own read does:
    its row, its visible messages in order, its history's shape and the rows after its
    own seq; an instance without a row (purged) reads as none, with its messages."""
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    try:
        for iid in ("a", "b", "c"):
            _instance(store, iid)
        with store.tx() as db:
            db.executemany(
                "INSERT INTO history(instance_id, seq, execution_id, event) VALUES(?, ?, ?, ?)",
                [
                    (iid, seq, f"{iid}-e", json.dumps({"EventType": 12, "n": seq}))
                    for iid, rows in (("a", 3), ("b", 1))
                    for seq in range(rows)
                ],
            )
            db.execute("DELETE FROM instances WHERE instance_id='c'")
        store.enqueue("a", None, {"EventType": 15, "n": "late"}, 101.0)  # not visible at 100
        store.enqueue("b", None, {"EventType": 15, "n": "b1"}, 0.0)
        store.enqueue("a", None, {"EventType": 15, "n": "a1"}, 0.0)
        wanted = [("b", -1), ("a", 1), ("c", -1)]
        batch = store.episode_reads(wanted, 100.0)
        assert batch == {
            iid: store.episode_reads([(iid, after)], 100.0)[iid] for iid, after in wanted
        }
        inst, messages, (count, top, tail) = batch["a"]
        assert inst is not None
        assert inst.instance_id == "a"
        assert [m[2].get("n") for m in messages] == [None, "a1"]  # its start, then a1
        assert (count, top, [seq for seq, _ in tail]) == (3, 2, [2])
        assert batch["b"][2][0:2] == (1, 0)
        assert batch["c"][0] is None
        assert [m[2]["EventType"] for m in batch["c"][1]] == [0]
    finally:
        store.close()


class _OneOrchestrator(AppCatalog):
    """The app's catalog with one orchestrator, "orch" (the engine only asks whether it exists)."""

    def orchestrator(self, name: str) -> Any:
        return object() if name == "orch" else None


def _start_together(engine: DurableEngine, *starts: tuple[str, str]) -> list[Any]:
    async def main() -> list[Any]:
        return await asyncio.gather(
            *(engine.start_new_batched(name, iid, None, None) for name, iid in starts)
        )

    return asyncio.run(main())


def test_starts_that_reach_the_loop_together_share_one_transaction(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    engine = DurableEngine(store, _OneOrchestrator([]), Clock(), DurableOptions())
    statements: list[str] = []
    store.db.set_trace_callback(statements.append)
    try:
        results = _start_together(
            engine, ("orch", "a"), ("orch", "b"), ("orch", "a"), ("orch", "c"), ("nope", "d")
        )
        assert [(r.ok, r.instance_id) for r in results] == [
            (True, "a"),
            (True, "b"),
            (False, "a"),  # the second start of a pending id is refused, as one alone is
            (True, "c"),
            (False, "d"),
        ]
        assert "status Pending already exists" in (results[2].error or "")
        assert results[4].not_found
        assert statements.count("BEGIN IMMEDIATE") == 1
        assert statements.count("COMMIT") == 1
        for iid in "abc":
            inst = store.get_instance(iid)
            assert inst is not None
            assert inst.status == "Pending"
        assert store.get_instance("d") is None
        assert sorted(engine._claimed) == ["a", "b", "c"]  # locked for this host on the way
    finally:
        store.close()


def test_a_batch_of_starts_that_fails_is_written_start_by_start(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    engine = DurableEngine(store, _OneOrchestrator([]), Clock(), DurableOptions())

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("database is locked")

    store.write_turn = refuse  # type: ignore[method-assign]
    try:
        results = _start_together(engine, ("orch", "a"), ("orch", "b"))
        assert [(r.ok, r.instance_id) for r in results] == [(True, "a"), (True, "b")]
        assert [store.get_instance(i) is not None for i in "ab"] == [True, True]
    finally:
        store.close()


def _raise_together(engine: DurableEngine, *events: tuple[str, str]) -> list[Any]:
    async def main() -> list[Any]:
        return await asyncio.gather(
            *(engine.raise_event_batched(iid, name, json.dumps(name)) for iid, name in events),
            return_exceptions=True,
        )

    return asyncio.run(main())


def _inbox(store: Store) -> list[tuple[str, str, str]]:
    return [
        (r["instance_id"], json.loads(r["event"])["Name"], json.loads(r["event"])["Input"])
        for r in store.db.execute("SELECT instance_id, event FROM inbox ORDER BY id")
    ]


def test_events_raised_together_share_one_transaction_in_order(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    engine = DurableEngine(store, _OneOrchestrator([]), Clock(), DurableOptions())
    _start_together(engine, ("orch", "a"), ("orch", "b"))
    store.db.execute("DELETE FROM inbox")  # the starts' own messages
    engine._claimed.clear()
    store.db.execute("UPDATE instances SET lock_owner=NULL")
    statements: list[str] = []
    store.db.set_trace_callback(statements.append)
    try:
        results = _raise_together(engine, ("a", "one"), ("b", "two"), ("a", "three"))
        assert results == [None, None, None]
        assert statements.count("BEGIN IMMEDIATE") == 1
        assert statements.count("COMMIT") == 1
        assert _inbox(store) == [
            ("a", "one", '"one"'),
            ("b", "two", '"two"'),
            ("a", "three", '"three"'),
        ]
        assert sorted(engine._claimed) == ["a", "b"]  # locked for this host on the way
    finally:
        store.close()


def test_a_batch_of_raised_events_that_fails_is_written_event_by_event(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    engine = DurableEngine(store, _OneOrchestrator([]), Clock(), DurableOptions())
    _start_together(engine, ("orch", "a"), ("orch", "b"))
    store.db.execute("DELETE FROM inbox")
    original = store.enqueue

    def refuse_many(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("database is locked")

    def refuse_b(instance_id: str, *args: Any, **kwargs: Any) -> list[str]:
        if instance_id == "b":
            raise sqlite3.OperationalError("disk I/O error")
        return original(instance_id, *args, **kwargs)

    store.write_turn = refuse_many  # type: ignore[method-assign]
    store.enqueue = refuse_b  # type: ignore[method-assign]
    try:
        results = _raise_together(engine, ("a", "one"), ("b", "two"), ("a", "three"))
        assert results[0] is None
        assert results[2] is None
        assert isinstance(results[1], sqlite3.OperationalError)  # its own failure only
        assert _inbox(store) == [("a", "one", '"one"'), ("a", "three", '"three"')]
    finally:
        store.close()


@pytest.mark.parametrize("one_by_one", [False, True])
def test_a_raised_event_for_no_instance_or_an_ended_one_is_refused_by_its_write(
    tmp_path: Path, one_by_one: bool
) -> None:
    """As the extension answers 404 and 410: refused by the turn's write (or, when that
    fails, by the event's own), nothing written for it, the others written."""
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    engine = DurableEngine(store, _OneOrchestrator([]), Clock(), DurableOptions())
    _start_together(engine, ("orch", "a"), ("orch", "done"))
    store.db.execute("DELETE FROM inbox")
    store.db.execute("UPDATE instances SET status='Completed' WHERE instance_id='done'")
    if one_by_one:

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise sqlite3.OperationalError("database is locked")

        store.write_turn = refuse  # type: ignore[method-assign]
    try:
        results = _raise_together(engine, ("a", "one"), ("nobody", "two"), ("done", "three"))
        assert results == [None, MISSING, "Completed"]
        assert _inbox(store) == [("a", "one", '"one"')]
    finally:
        store.close()


def test_a_turns_starts_events_and_activity_results_share_one_transaction(
    tmp_path: Path,
) -> None:
    """What reaches the loop in one turn (a start, two raised events, an activity's result)
    is one BEGIN IMMEDIATE ... COMMIT, each caller answered once it is committed, and the
    instances it woke locked for this host on the way."""
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    engine = DurableEngine(store, _OneOrchestrator([]), Clock(), DurableOptions())
    _start_together(engine, ("orch", "a"), ("orch", "b"))
    store.db.execute("DELETE FROM inbox")
    engine._claimed.clear()
    store.db.execute("UPDATE instances SET lock_owner=NULL")
    store.db.execute(
        "INSERT INTO activities(instance_id, execution_id, task_id, name, input, lock_owner, "
        "dequeue_count) VALUES('b', 'x', 1, 'act', 'null', 'host-a', 1)"
    )
    (work_item,) = store.db.execute("SELECT * FROM activities").fetchall()
    result = durable._event(durable.TASK_COMPLETED, Clock().now(), TaskScheduledId=1, Result="1")
    statements: list[str] = []
    store.db.set_trace_callback(statements.append)

    async def main() -> list[Any]:
        engine._turn.results.append((dict(work_item), result))  # as `_run_activity` leaves it
        return await asyncio.gather(
            engine.start_new_batched("orch", "c", None, None),
            engine.raise_event_batched("a", "one", '"one"'),
            engine.raise_event_batched("b", "two", '"two"'),
        )

    try:
        started, *raised = asyncio.run(main())
        assert (started.ok, started.instance_id) == (True, "c")
        assert raised == [None, None]
        assert statements.count("BEGIN IMMEDIATE") == 1
        assert statements.count("COMMIT") == 1
        assert [
            (i, json.loads(e)["EventType"])
            for i, e in store.db.execute("SELECT instance_id, event FROM inbox ORDER BY id")
        ] == [
            ("c", durable.EXECUTION_STARTED),
            ("a", durable.EVENT_RAISED),
            ("b", durable.EVENT_RAISED),
            ("b", durable.TASK_COMPLETED),
        ]
        assert store.db.execute("SELECT COUNT(*) FROM activities").fetchone()[0] == 0
        assert sorted(engine._claimed) == ["a", "b", "c"]
    finally:
        store.close()


def test_a_turns_writes_go_with_a_batch_of_episodes_and_back_to_their_own_if_it_fails(
    tmp_path: Path,
) -> None:
    """Writes waiting for the turn's end go in the transaction of a batch of episodes
    written before it; if that write fails, the episodes are retried later and the writes
    are made on their own, their callers answered either way."""
    store = Store(str(tmp_path / "hub.sqlite"), "host-a", lease_seconds=5)
    engine = DurableEngine(store, _OneOrchestrator([]), Clock(), DurableOptions())
    _start_together(engine, ("orch", "a"))
    engine._claimed.clear()
    episode = dict(
        instance_id="a",
        execution_id="x",
        reset_history=False,
        new_history=[],
        consumed=[],
        activities=[],
        timers=[],
        messages=[],
        status="Running",
        output=None,
        custom_status=None,
        input_json=None,
        now_iso="2026-12-07T00:00:00.000000Z",
    )
    original = store.commit_episodes
    calls: list[Any] = []

    def commit(writes: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("turn"))
        if len(calls) == 2:
            raise sqlite3.OperationalError("database is locked")
        return original(writes, **kwargs)

    store.commit_episodes = commit  # type: ignore[method-assign]

    async def main() -> list[Any]:
        started = asyncio.ensure_future(engine.start_new_batched("orch", "b", None, None))
        raised = asyncio.ensure_future(engine.raise_event_batched("a", "one", '"one"'))
        await asyncio.sleep(0)  # both wait for the turn's end
        engine._episode_writes.append(dict(episode))
        engine._run_episodes([])  # a batch of episodes is written first: they go with it
        first = await asyncio.wait_for(asyncio.gather(started, raised), 10)
        store.db.execute("UPDATE instances SET lock_owner='host-a' WHERE instance_id='a'")
        again = asyncio.ensure_future(engine.raise_event_batched("a", "two", '"two"'))
        await asyncio.sleep(0)
        engine._episode_writes.append(dict(episode))
        engine._run_episodes([])  # this write fails: the event is written on its own
        return [*first, await asyncio.wait_for(again, 10)]  # lost if not put back

    try:
        started, raised, raised_again = asyncio.run(main())
        assert (started.ok, raised, raised_again) == (True, None, None)
        assert [turn is not None for turn in calls] == [True, True]
        raised_names = [
            json.loads(e)["Name"]
            for (e,) in store.db.execute(
                "SELECT event FROM inbox WHERE instance_id='a' "
                "AND json_extract(event, '$.EventType')=? ORDER BY id",
                (durable.EVENT_RAISED,),
            )
        ]
        assert raised_names == ["one", "two"]
        assert store.get_instance("b") is not None
    finally:
        store.close()


def test_the_hubs_json_is_the_standard_librarys_data() -> None:
    """orjson's text decodes to what `json` would have written, and what orjson refuses
    (a key that is not a string, an integer past 64 bits) is written by `json` instead."""
    from devstack.host import store

    event = {
        "EventType": 4,
        "Name": "send_step",
        "Input": '{"a": [1, 2.5, "é"]}',
        "IsPlayed": False,
    }
    assert json.loads(store._dumps(event)) == event
    odd = {"Input": {1: "one"}, "Big": 2**70}
    assert store._dumps(odd) == json.dumps(odd)
    # A list in one go: orjson's text for each, or `json` for every one if one needs it.
    assert store._dumps_each([event, event]) == [store._dumps(event)] * 2
    assert store._dumps_each([event, odd]) == [store._dumps(event), json.dumps(odd)]
