"""The history corpus replayed, as Temporal's `Replayer` does: the
determinism guard of the live version (docs/adr/018d-versioning.md). Every
recorded history of tests/fixtures/histories (real order_workflow instances,
recorded by the local host: tests/fixtures/histories/record.py) goes
episode by episode through the Durable SDK's replay engine
(devstack.host.replay.run_episode) with the orchestrator function_app.py
registers, and must decide exactly what the host recorded: the same
activities (name and input) and timers (fire time) at the same task ids, and
the same end and output. A change that alters what an instance in flight
does on replay fails here, named by file, instance and episode: such a change
is a branch on `context.version`, with histories of the new version recorded."""

from __future__ import annotations

import copy
import json
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from devstack.host.durable import iso
from devstack.host.replay import SCHEDULING_EVENTS, EpisodeResult, run_episode

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "histories"
FILES = sorted(CORPUS.glob("*.json"))
OUTCOMES = ("processed", "compensated", "failed", "retried", "unconfirmed")

EXECUTION_STARTED, EXECUTION_COMPLETED = 0, 1
TASK_SCHEDULED, TIMER_CREATED = 4, 10
ORCHESTRATOR_STARTED, ORCHESTRATOR_COMPLETED = 12, 13


@pytest.fixture(scope="module")
def orchestrator() -> Any:
    """The orchestrator function as the app registers it (as sim.system.catalog reads it)."""
    import function_app
    from devstack.host import index_app

    spec = index_app(function_app.app).orchestrator("order_workflow")
    assert spec is not None
    return spec.func


def _episodes(history: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    for event in history:
        if event["EventType"] == ORCHESTRATOR_STARTED:
            out.append([])
        out[-1].append(event)
    return out


def _recorded(episode: list[dict[str, Any]]) -> list[tuple]:
    """What the host recorded this episode deciding: its scheduled work, in order."""
    out = []
    for e in episode:
        if e["EventType"] == TASK_SCHEDULED:
            out.append((e["EventId"], "activity", e["Name"], e.get("Input")))
        elif e["EventType"] == TIMER_CREATED:
            out.append((e["EventId"], "timer", None, e["FireAt"]))
        elif e["EventType"] in SCHEDULING_EVENTS:
            out.append((e["EventId"], "other", e.get("Name"), e.get("Input")))
    return out


def _decided(result: EpisodeResult) -> list[tuple]:
    out = []
    for t in result.new_tasks:
        if t.kind == "activity":
            out.append((t.task_id, "activity", t.name, t.input))
        elif t.kind == "timer":
            assert t.fire_at is not None
            fire_at = t.fire_at if t.fire_at.tzinfo else t.fire_at.replace(tzinfo=UTC)
            out.append((t.task_id, "timer", None, iso(fire_at)))
        else:
            out.append((t.task_id, "other", t.name, t.input))
    return out


def replay_differences(func: Any, instance: dict[str, Any]) -> list[str]:
    """Replay every episode of `instance` and say where the replay decides
    otherwise than the recorded history (empty: it replays as recorded)."""
    history = instance["history"]
    episodes = _episodes(history)
    differences = []
    for k, episode in enumerate(episodes):
        past = [dict(e, IsPlayed=True) for ep in episodes[:k] for e in ep]
        current = [
            e
            for e in episode
            if e["EventType"]
            not in (*SCHEDULING_EVENTS, ORCHESTRATOR_COMPLETED, EXECUTION_COMPLETED)
        ]
        try:
            result = run_episode(
                func,
                instance_id=instance["instanceId"],
                history=past + current,
                input_json=instance["input"],
                scheduled_before={
                    e["EventId"]: e for e in past if e["EventType"] in SCHEDULING_EVENTS
                },
            )
        except Exception as exc:  # NonDeterminismError, or the code failing on this history
            differences.append(f"episode {k}: {type(exc).__name__}: {exc}")
            break
        recorded, decided = _recorded(episode), _decided(result)
        if decided != recorded:
            wrong = next(
                (i for i, (d, r) in enumerate(zip(decided, recorded, strict=False)) if d != r),
                min(len(decided), len(recorded)),
            )
            differences.append(
                f"episode {k}: decided {decided[wrong : wrong + 1] or 'nothing more'}, "
                f"recorded {recorded[wrong : wrong + 1] or 'nothing more'} "
                f"({len(decided)} vs {len(recorded)} tasks)"
            )
        ended = [e for e in episode if e["EventType"] == EXECUTION_COMPLETED]
        if ended:
            if result.outcome != "completed" or ended[0].get("OrchestrationStatus") != "Completed":
                differences.append(
                    f"episode {k}: ended {result.outcome} ({result.error}), recorded "
                    f"{ended[0].get('OrchestrationStatus')}"
                )
            elif json.loads(result.output_json or "null") != json.loads(ended[0]["Result"]):
                differences.append(
                    f"episode {k}: output {result.output_json}, recorded {ended[0]['Result']}"
                )
        elif result.outcome != "running":
            differences.append(f"episode {k}: ended {result.outcome}, recorded running on")
    return differences


def _instances() -> list[Any]:
    out = []
    for path in FILES:
        for i, instance in enumerate(json.loads(path.read_text())["instances"]):
            out.append(pytest.param(instance, id=f"{path.stem}[{i}]:{instance['version']}"))
    return out


@pytest.mark.parametrize("instance", _instances())
def test_every_recorded_history_replays_to_what_the_host_recorded(
    orchestrator: Any, instance: dict[str, Any]
) -> None:
    started = instance["history"][1]
    assert started["EventType"] == EXECUTION_STARTED
    assert started["Version"] == instance["version"]
    assert instance["status"] == "Completed"
    assert replay_differences(orchestrator, instance) == []


def test_the_corpus_holds_every_outcome_of_the_live_version() -> None:
    from orchestrators.order_workflow import VERSION

    assert {p.stem for p in FILES} == {f"{VERSION}-{o}" for o in OUTCOMES}
    for path in FILES:
        version, outcome = path.stem.split("-", 1)
        versions = [i["version"] for i in json.loads(path.read_text())["instances"]]
        if outcome == "retried":
            assert versions == [version, version], path.name
        elif outcome == "unconfirmed":
            # Attempt 1 deferred; each restart is an attempt on the same version.
            assert len(versions) >= 2, path.name
            assert set(versions) == {version}, path.name
        else:
            assert versions == [version], path.name


def _a_history_with_activities() -> dict[str, Any]:
    from orchestrators.order_workflow import VERSION

    return json.loads((CORPUS / f"{VERSION}-compensated.json").read_text())["instances"][0]


def test_a_changed_activity_input_in_the_history_is_a_difference(orchestrator: Any) -> None:
    instance = copy.deepcopy(_a_history_with_activities())
    scheduled = [e for e in instance["history"] if e["EventType"] == TASK_SCHEDULED]
    target = scheduled[len(scheduled) // 2]
    target["Input"] = json.dumps({**json.loads(target["Input"]), "Step": "another-step"})
    differences = replay_differences(orchestrator, instance)
    assert len(differences) == 1
    assert f"recorded [({target['EventId']}, 'activity'" in differences[0]


def test_a_missing_scheduled_task_is_a_difference(orchestrator: Any) -> None:
    instance = copy.deepcopy(_a_history_with_activities())
    last = max(i for i, e in enumerate(instance["history"]) if e["EventType"] in SCHEDULING_EVENTS)
    del instance["history"][last]
    assert replay_differences(orchestrator, instance) != []


def test_a_changed_output_is_a_difference(orchestrator: Any) -> None:
    instance = copy.deepcopy(_a_history_with_activities())
    ended = instance["history"][-1]
    assert ended["EventType"] == EXECUTION_COMPLETED
    ended["Result"] = json.dumps({**json.loads(ended["Result"]), "Outcome": "failed"})
    (difference,) = replay_differences(orchestrator, instance)
    assert "output" in difference
