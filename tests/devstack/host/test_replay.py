"""Replay through the SDK, in-process: determinism against a golden history recorded by the host."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from devstack.host import NonDeterminismError, index_app, load_app, run_episode
from devstack.host.replay import SCHEDULING_EVENTS

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "histories" / "race_event_wins.json"
ORCHESTRATOR_STARTED, ORCHESTRATOR_COMPLETED, EXECUTION_COMPLETED = 12, 13, 1


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Any:
    os.environ.setdefault("SAMPLE_OUT_DIR", str(tmp_path_factory.mktemp("out")))
    saved = sys.modules.pop("function_app", None)  # the product's app module, if a test loaded it
    try:
        return index_app(load_app("function_app:app", str(HERE / "sample_app")))
    finally:
        sys.path.remove(str((HERE / "sample_app").resolve()))
        sys.modules.pop("function_app", None)
        if saved is not None:
            sys.modules["function_app"] = saved


def episodes(history: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    for e in history:
        if e["EventType"] == ORCHESTRATOR_STARTED:
            out.append([])
        out[-1].append(e)
    return out


def replay_episode(
    catalog: Any, golden: dict[str, Any], k: int, history: list[dict[str, Any]] | None = None
):
    """Replay episode k of a recorded history: the past as played, then the episode's new events."""
    eps = episodes(history or golden["history"])
    past = [dict(e, IsPlayed=True) for ep in eps[:k] for e in ep]
    current = [
        e
        for e in eps[k]
        if e["EventType"] not in (*SCHEDULING_EVENTS, ORCHESTRATOR_COMPLETED, EXECUTION_COMPLETED)
    ]
    scheduled_before = {e["EventId"]: e for e in past if e["EventType"] in SCHEDULING_EVENTS}
    spec = catalog.orchestrator(golden["orchestrator"])
    return run_episode(
        spec.func,
        instance_id=golden["instanceId"],
        history=past + current,
        input_json=golden["input"],
        scheduled_before=scheduled_before,
    ), eps[k]


@pytest.fixture
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def test_every_episode_of_the_golden_history_replays_to_the_recorded_decisions(
    catalog: Any, golden: dict[str, Any]
) -> None:
    eps = episodes(golden["history"])
    assert len(eps) == 4
    for k in range(len(eps)):
        result, recorded = replay_episode(catalog, golden, k)
        scheduled = [
            (e["EventId"], e["EventType"], e.get("Name"))
            for e in recorded
            if e["EventType"] in SCHEDULING_EVENTS
        ]
        decided = [
            (t.task_id, {"activity": 4, "timer": 10}[t.kind], t.name) for t in result.new_tasks
        ]
        assert decided == scheduled, f"episode {k}"
        done = [e for e in recorded if e["EventType"] == EXECUTION_COMPLETED]
        assert (result.outcome == "completed") == bool(done), f"episode {k}"
        if done:
            assert json.loads(result.output_json) == json.loads(done[0]["Result"])


def test_the_same_history_gives_the_same_actions(catalog: Any, golden: dict[str, Any]) -> None:
    first, _ = replay_episode(catalog, golden, 1)
    second, _ = replay_episode(catalog, golden, 1)
    assert first.state == second.state
    assert first.state[
        "actions"
    ]  # the race: CallActivity, then WhenAny(WaitForExternalEvent, CreateTimer)
    kinds = [a["actionType"] for a in first.state["actions"][0]]
    assert kinds == [0, 11]
    assert [a["actionType"] for a in first.state["actions"][0][1]["compoundActions"]] == [6, 5]


def test_a_changed_activity_name_is_reported_as_non_determinism(
    catalog: Any, golden: dict[str, Any]
) -> None:
    history = copy.deepcopy(golden["history"])
    for e in history:
        if e["EventType"] == 4 and e["EventId"] == 0:
            e["Name"] = "triple"
    with pytest.raises(NonDeterminismError, match="history has activity triple with id 0"):
        replay_episode(catalog, golden, 1, history)


def test_a_recorded_task_the_replay_no_longer_schedules_is_reported(
    catalog: Any, golden: dict[str, Any]
) -> None:
    history = copy.deepcopy(golden["history"])
    first_episode_end = next(
        i for i, e in enumerate(history) if e["EventType"] == ORCHESTRATOR_COMPLETED
    )
    history.insert(
        first_episode_end,
        {
            "EventType": 10,
            "EventId": 7,
            "IsPlayed": False,
            "Timestamp": history[0]["Timestamp"],
            "FireAt": history[0]["Timestamp"],
        },
    )
    with pytest.raises(NonDeterminismError, match="with id 7"):
        replay_episode(catalog, golden, 1, history)


def test_an_event_that_arrives_before_the_wait_is_buffered(
    catalog: Any, golden: dict[str, Any]
) -> None:
    # Move the EventRaised into the episode that completes the activity: the orchestrator
    # is not waiting yet when it is replayed, and must still take it when it starts waiting.
    history = copy.deepcopy(golden["history"])
    raised = next(e for e in history if e["EventType"] == 15)
    history.remove(raised)
    completed = next(i for i, e in enumerate(history) if e["EventType"] == 5)
    history.insert(completed, raised)
    eps = episodes(history)
    result, _ = replay_episode(catalog, golden, 1, history)
    assert len(eps) >= 2
    assert [(t.kind, t.name) for t in result.new_tasks] == [
        ("timer", None),
        ("activity", "record_effect"),
    ]


def test_the_state_read_without_its_text_is_the_sdks_json(
    catalog: Any, golden: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_episode takes the SDK's state as a dict rather than encoding it to text and decoding
    it: every episode's result equals the one read from the SDK's own text."""
    from azure.durable_functions.models.TaskOrchestrationExecutor import (
        TaskOrchestrationExecutor,
    )

    from devstack.host import replay

    eps = range(len(episodes(golden["history"])))
    fast = [replay_episode(catalog, golden, k)[0] for k in eps]
    monkeypatch.setattr(replay, "_state", TaskOrchestrationExecutor.get_orchestrator_state_str)
    text = [replay_episode(catalog, golden, k)[0] for k in eps]
    assert [r.outcome for r in fast] == ["running", "running", "running", "completed"]
    for k, (f, t) in enumerate(zip(fast, text, strict=True)):
        assert f == t, f"episode {k}"
        assert json.dumps(f.state) == json.dumps(t.state), f"episode {k}"
