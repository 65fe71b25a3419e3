"""Timer triggers: NCRONTAB schedules on the controllable clock, past-due runs, and the
singleton blob lease that makes two host processes fire each occurrence once."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from .conftest import HostProcess, wait_for, wait_status

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

HOURLY = "0 0 * * * *"


def timer_env(azurite: str, schedule: str, **extra: str) -> dict[str, str | None]:
    return {"AzureWebJobsStorage": str(azurite), "SAMPLE_TICK_SCHEDULE": schedule, **extra}


def seconds_to_next_hour(now: Any) -> float:
    nxt = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return (nxt - now).total_seconds()


async def test_a_schedule_fires_when_the_clock_reaches_it_and_starts_an_orchestration(
    host_factory: Any, azurite: str
) -> None:
    host = host_factory(
        clock="controllable",
        env=timer_env(azurite, HOURLY, SAMPLE_TICK_STARTS="1"),
        args=["--host-id", "timers-a"],
    )
    await wait_for(lambda: host.timers()[0]["next"], what="the timer listener to hold its lease")
    host.advance(seconds_to_next_hour(host.now()))
    ticks = await wait_for(lambda: host.events("tick"), what="the first occurrence")
    assert len(ticks) == 1
    assert ticks[0]["past_due"] is False
    # The timer function's durable client started an orchestration; its 1 s durable timer
    # waits for the (controllable) clock too.
    iid = f"tick-{ticks[0]['next']}"
    await wait_for(
        lambda: host.events("double_started", instance=iid), what="the started orchestration"
    )
    await wait_for(lambda: _waiting(host, iid), what=f"{iid} waiting")
    host.advance(2)
    status = await wait_status(host.client, iid, "Completed")
    assert status.output == {"doubled": 42, "timeout": True, "version": "2.0"}

    # Three hours pass at once (a suspended machine): one late invocation, not three.
    host.advance(3 * 3600)
    late = await wait_for(lambda: host.events("tick")[1:], what="the late occurrence")
    assert len(late) == 1
    assert late[0]["past_due"] is True
    assert len(host.events("tick")) == 2


async def _waiting(host: Any, iid: str) -> bool:
    s = await host.client.get_status(iid)
    return bool(s) and (s.custom_status or {}).get("stage") == "waiting"


async def test_an_occurrence_missed_while_no_host_ran_fires_past_due_at_start(
    host_factory: Any, azurite: str
) -> None:
    env = timer_env(azurite, HOURLY)
    first = host_factory(clock="controllable", env=env, args=["--host-id", "timers-b"])
    start = first.now()
    await wait_for(lambda: first.timers()[0]["next"], what="the timer listener to hold its lease")
    first.stop()  # releases the lease; the status blob says the next occurrence is the next hour
    assert first.events("tick") == []
    later = (start + timedelta(hours=2)).isoformat()
    host_factory(
        clock="controllable", env=env, args=["--host-id", "timers-b", "--clock-start", later]
    )
    ticks = await wait_for(lambda: first.events("tick"), what="the past-due occurrence")
    assert len(ticks) == 1
    assert ticks[0]["past_due"] is True


async def test_two_hosts_fire_each_occurrence_once(host_factory: Any, azurite: str) -> None:
    env = timer_env(azurite, "* * * * * *")  # every second, on real time
    a = host_factory(env=env, args=["--host-id", "timers-c"])
    b = host_factory(env=env, args=["--host-id", "timers-c"])
    await wait_for(lambda: len(a.events("tick")) >= 6, timeout=30, what="six occurrences")
    a.stop()
    # The lease is released on a clean stop: the other host takes the schedule over.
    n = len(a.events("tick"))
    await wait_for(
        lambda: [t for t in a.events("tick")[n:] if t["pid"] == b.proc.pid],
        timeout=30,
        what="the second host to take over",
    )
    b.stop()
    ticks = a.events("tick")
    occurrences = [t["next"] for t in ticks]
    assert len(occurrences) == len(set(occurrences)), "an occurrence fired twice"
    assert {t["pid"] for t in ticks} == {a.proc.pid, b.proc.pid}


async def test_run_on_startup_fires_when_the_listener_starts(
    host_factory: Any, azurite: str
) -> None:
    host = host_factory(
        clock="controllable",
        env={"AzureWebJobsStorage": str(azurite), "SAMPLE_STARTUP_TICK": "1"},
        args=["--host-id", "timers-d"],
    )
    ticks = await wait_for(lambda: host.events("startup_tick"), what="the startup invocation")
    assert ticks[0]["past_due"] is False


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        (
            None,
            "devstack.host: missing app setting 'AzureWebJobsStorage' (timer triggers keep their singleton lease",
        ),
        (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
            "BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;",
            "devstack.host: cannot reach the AzureWebJobsStorage account for timer singletons",
        ),
    ],
)
def test_storage_problems_are_one_clear_line(
    tmp_path: Path, storage: str | None, message: str
) -> None:
    host = HostProcess(
        tmp_path / "hub",
        tmp_path,
        {"AzureWebJobsStorage": storage, "SAMPLE_TICK_SCHEDULE": HOURLY},
        "real",
        tmp_path / "host.log",
    )
    with pytest.raises(RuntimeError, match="exited"):
        host.start()
    log = (tmp_path / "host.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("devstack.host:")]
    assert len(errors) == 1, errors
    assert errors[0].startswith(message), errors
    assert "Traceback" not in log
