"""Fast units behind the host's speed-ups: history timestamps, the replay executor's payload
class, the receive socket timeout, heartbeats."""

from __future__ import annotations

import sqlite3
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from azure.durable_functions.models.history.HistoryEvent import HistoryEvent
from dateutil.parser import parse as dateutil_parse
from dateutil.tz import tzutc

from devstack.host import replay, servicebus
from devstack.host.store import Store


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
