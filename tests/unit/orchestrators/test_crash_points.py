"""Crash points are a hook the composition root injects: each use case calls
the hook it was given at its step boundary (after the effect it guards), and
the environment-driven hook (adapters.crashpoints) kills the process there
once per marker directory."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from activities.policy import ActivityPolicy
from activities.scheduler_activities import SchedulerActivities
from adapters.crashpoints import EnvCrashPoints, from_environment
from domain.codec import encode
from domain.models import AgentReply, ReplyOutcome
from orchestrators.contracts import SendRequest
from orchestrators.reply_bridge import bridge_reply
from orchestrators.requests import AgentRequests
from orchestrators.starter import Starter
from tests.builders import KEYS, ReadClock, signed_reply
from tests.unit.orchestrators.driver import SETTINGS, STEPS, StartingClient, World


class Recorder:
    """A hook that notes each point with what `seen()` says at that moment."""

    def __init__(self, seen) -> None:
        self.seen = seen
        self.calls: list[tuple[str, object]] = []

    def __call__(self, name: str) -> None:
        self.calls.append((name, self.seen()))


async def test_the_starter_calls_its_hook_after_the_claim_and_before_the_start():
    world = World()
    record, etag = await world.submitted()
    client = StartingClient()
    hook = Recorder(lambda: (world.store.docs["webshop:A1"][0]["LockedBy"], dict(client.started)))
    starter = Starter(
        SETTINGS, world.store, world.index, clock=ReadClock(lambda: world.now), crash_point=hook
    )
    instance_id = await starter.claim_and_start(client, record, etag)
    assert instance_id == "webshop:A1:1"
    assert hook.calls == [("starter.after_claim", ("webshop:A1:1", {}))]
    assert list(client.started) == ["webshop:A1:1"]


async def test_the_starter_calls_its_hook_after_the_start_and_before_the_first_request():
    world = World()
    record, etag = await world.submitted()
    client = StartingClient()
    hook = Recorder(lambda: (list(client.started), len(world.sent("agent-requests"))))
    starter = Starter(
        SETTINGS,
        world.store,
        world.index,
        clock=ReadClock(lambda: world.now),
        crash_point=hook,
        publisher=world.bus,
        requests=AgentRequests(world.settings.scheduler_keys, world.bus, world.orders),
    )
    assert await starter.claim_and_start(client, record, etag) == "webshop:A1:1"
    assert hook.calls[-1] == ("starter.after_start", (["webshop:A1:1"], 0))
    assert len(world.sent("agent-requests")) == 1


async def test_the_agent_request_send_calls_its_hook_after_the_send():
    world = World()
    iid = await world.claimed()
    hook = Recorder(lambda: len(world.sent("agent-requests")))
    acts = SchedulerActivities(
        ActivityPolicy.from_settings(world.settings),
        world.store,
        world.orders,
        world.bus,
        STEPS,
        crash_point=hook,
    )
    deadline = world.now + timedelta(minutes=1)
    await acts.send_agent_request(
        SendRequest(InstanceId=iid, Step="reserve-inventory", Deadline=deadline)
    )
    assert hook.calls == [("workflow.after_send", 1)]


class RaisingClient:
    def __init__(self) -> None:
        self.raised: list[tuple[str, str]] = []

    async def raise_event(self, instance_id, event_name, data):
        self.raised.append((instance_id, event_name))


async def test_the_bridge_calls_its_hook_after_raising_the_event():
    client = RaisingClient()
    hook = Recorder(lambda: list(client.raised))
    reply = AgentReply(
        InstanceId="webshop:A1:1",
        OrderID="webshop:A1",
        Step="reserve-inventory",
        Action="do",
        Attempt=1,
        EventName="reply-reserve-inventory-do-1",
        EventId="e1",
        Outcome=ReplyOutcome.OK,
        Result={"Reference": "r1"},
    )
    settle = await bridge_reply(encode(signed_reply(reply)), client, KEYS, crash_point=hook)
    assert settle.kind.value == "complete"
    assert hook.calls == [
        ("bridge.after_raise", [("webshop:A1:1", "reply-reserve-inventory-do-1")])
    ]


def test_without_crash_points_in_the_environment_there_is_no_hook():
    assert from_environment({}) is None
    assert from_environment({"CRASH_POINTS": ""}) is None
    hook = from_environment({"CRASH_POINTS": "a,b", "CRASH_POINTS_DIR": "/nowhere"})
    assert isinstance(hook, EnvCrashPoints)
    assert hook.points == frozenset({"a", "b"})
    hook("c")  # not named: returns


def test_a_named_point_kills_the_process_once_per_marker_directory(tmp_path: Path):
    script = (
        "from adapters.crashpoints import from_environment\n"
        "hook = from_environment()\n"
        "hook('other')\n"
        "hook('starter.after_claim')\n"
        "print('ran past')\n"
    )
    env = {"CRASH_POINTS": "starter.after_claim", "CRASH_POINTS_DIR": str(tmp_path)}
    root = Path(__file__).resolve().parents[3]

    def run():
        return subprocess.run(
            [sys.executable, "-c", script],
            env={**env, "PYTHONPATH": str(root)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    first = run()
    assert first.returncode == 137, first.stderr
    assert first.stdout == ""
    assert (tmp_path / "crashed-starter.after_claim").exists()
    second = run()
    assert second.returncode == 0, second.stderr
    assert second.stdout == "ran past\n"


def test_the_composition_root_chooses_the_hook_from_the_environment(monkeypatch, tmp_path):
    import bootstrap
    from orchestrators.hooks import no_crash_point

    build = bootstrap.crash_point.__wrapped__  # uncached: once per process otherwise
    monkeypatch.delenv("CRASH_POINTS", raising=False)
    assert build() is no_crash_point
    monkeypatch.setenv("CRASH_POINTS", "workflow.after_send")
    monkeypatch.setenv("CRASH_POINTS_DIR", str(tmp_path))
    hook = build()
    assert isinstance(hook, EnvCrashPoints)
    assert (hook.points, hook.marker_dir) == (frozenset({"workflow.after_send"}), tmp_path)
