"""Durable Functions in memory: instances, their histories and inboxes, the
durable client the Starter and the reply bridge call, activities delivered at
least once, durable timers, and events buffered until the orchestrator waits.

Episodes run through the local host's replay engine
(`devstack.host.replay.run_episode`, the Durable SDK's own replay); this
module only keeps the host's bookkeeping, with the same history events as
devstack.host.durable."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from azure.durable_functions.models.OrchestrationRuntimeStatus import OrchestrationRuntimeStatus
from azure.functions import meta
from azure.functions.durable_functions import ActivityTriggerConverter
from pydantic import ValidationError

from devstack.host.durable import (
    EVENT_RAISED,
    EXECUTION_COMPLETED,
    EXECUTION_STARTED,
    ORCHESTRATOR_COMPLETED,
    ORCHESTRATOR_STARTED,
    TASK_COMPLETED,
    TASK_FAILED,
    TASK_SCHEDULED,
    TIMER_CREATED,
    TIMER_FIRED,
    _event,
    iso,
)
from devstack.host.errors import NonDeterminismError
from devstack.host.invoke import call_function
from devstack.host.replay import SCHEDULING_EVENTS, run_episode

from .world import World

_TERMINAL = ("Completed", "Failed", "Terminated")


@dataclass
class Instance:
    instance_id: str
    name: str
    version: str
    execution: int
    status: str = "Pending"
    history: list[dict[str, Any]] = field(default_factory=list)
    inbox: list[dict[str, Any]] = field(default_factory=list)
    busy: bool = False
    output: Any = None
    done_tasks: set[int] = field(default_factory=set)
    input: str | None = None


def default_version() -> str:
    """host.json's durableTask defaultVersion: what a new instance runs, as
    the Durable extension stamps it when the client names no version."""
    from pathlib import Path

    host = json.loads((Path(__file__).parents[1] / "host.json").read_text(encoding="utf-8-sig"))
    return str(
        ((host.get("extensions") or {}).get("durableTask") or {}).get("defaultVersion") or ""
    )


class SimDurable:
    def __init__(self, world: World, catalog) -> None:
        self.world = world
        self.catalog = catalog
        # What a new instance runs when its client names no version (host.json).
        self.version = default_version()
        self.instances: dict[str, Instance] = {}
        self.starts: list[str] = []
        # (instance id, event name) of every external event an episode handed
        # to the orchestrator; and each finished execution's outcome, with the
        # record's owner at that moment (set by the simulation's hook).
        self.heard: dict[tuple[str, str], list[str | None]] = {}
        self.finished: dict[str, tuple[str, Any, str | None]] = {}
        # When an execution last ended: the Starter acts on an ended instance
        # (a compensation's restart) only at its next run (Simulation.fixed_point).
        self.last_ended: datetime | None = None
        # (instance, event) of every raise_event answered "no such instance" or "gone"
        self.gone_answers: set[tuple[str, str]] = set()
        # (instance, event name): an event raised on an instance that had ended.
        self.on_gone_answer = None
        # The simulation's path checks (None: none): an event raised (instance,
        # event name), a durable timer created (instance, fire time, the episode's
        # time), an
        # activity's result (instance, activity, its result as returned).
        self.on_raise: Any = None
        self.on_timer: Any = None
        self.on_activity_result: Any = None
        self.owner_of: Any = lambda instance_id: None
        # Whether an execution dies at this episode (the simulation's
        # compensation deaths): it ends Failed instead of running it, as an
        # instance whose orchestrator raised does.
        self.dies: Any = lambda instance_id: False
        self.invalid_own_data: list[str] = []  # activities that failed validating their own output
        # Overload's backed-up control queues (FaultConfig.episode_wait), a stream of their own.
        self._wait_rng = random.Random(f"episode-wait/{world.seed}")

    # --- the durable client (the methods the Starter and the bridge call)
    async def start_new(
        self,
        orchestration_function_name: str,
        instance_id: str | None = None,
        client_input: Any = None,
        version: str | None = None,
    ) -> str:
        await self.world.point("durable.start_new")
        self._fail_before("start_new", instance_id)
        inst = self.instances.get(instance_id)
        if inst is not None and inst.status not in _TERMINAL:
            raise Exception(
                f"An Orchestration instance with the status {inst.status} already exists."
            )
        execution = (inst.execution + 1) if inst else 1
        # The client sends its input as JSON (DurableOrchestrationClient.start_new);
        # the host hands that text to every episode.
        input_json = json.dumps(client_input) if client_input is not None else None
        new = Instance(
            instance_id,
            orchestration_function_name,
            version or self.version,
            execution,
            input=input_json,
        )
        new.inbox.append(
            _event(
                EXECUTION_STARTED,
                self.world.clock.now,
                Name=orchestration_function_name,
                Version=new.version,
                Input=input_json,
                OrchestrationInstance={"InstanceId": instance_id, "ExecutionId": str(execution)},
            )
        )
        self.instances[instance_id] = new
        self.starts.append(instance_id)
        self.world.log(f"durable start {instance_id} (execution {execution})")
        self._kick(new)
        self._fail_after("start_new", instance_id)
        return instance_id

    async def raise_event(
        self,
        instance_id: str,
        event_name: str,
        event_data: Any = None,
        task_hub_name=None,
        connection_name=None,
    ) -> None:
        await self.world.point("durable.raise_event")
        if self.on_raise is not None:
            self.on_raise(instance_id, event_name)
        self._fail_before("raise_event", instance_id)
        inst = self.instances.get(instance_id)
        if inst is None or inst.status in _TERMINAL:
            self.gone_answers.add((instance_id, event_name))  # for the simulation's checks
            if inst is not None and self.on_gone_answer is not None:
                self.on_gone_answer(inst, event_name)
        if inst is None:
            raise Exception(f"No instance with ID {instance_id} found.")
        if inst.status in _TERMINAL:
            raise Exception(f"Instance with ID {instance_id} is gone: either completed or failed")
        inst.inbox.append(
            _event(
                EVENT_RAISED, self.world.clock.now, Name=event_name, Input=json.dumps(event_data)
            )
        )
        self.world.log(f"durable event {event_name} -> {instance_id}")
        self._kick(inst)
        self._fail_after("raise_event", instance_id)

    async def get_status(self, instance_id: str, *args: Any, **kwargs: Any):
        await self.world.point("durable.get_status")
        self._fail_before("get_status", instance_id)
        inst = self.instances.get(instance_id)
        if inst is None:
            # The SDK's answer to a 404: a status with no runtime status, not an error
            # (DurableOrchestrationClient.get_status treats 200/202/400/404/500 alike).
            return SimpleNamespace(instance_id=None, runtime_status=None, message="")
        return SimpleNamespace(
            instance_id=instance_id, runtime_status=OrchestrationRuntimeStatus(inst.status)
        )

    # --- the client's faults: what the SDK raises for a 5xx, a 429 or a dropped
    # connection (its HTTP helper re-raises aiohttp's errors; any other status code
    # becomes a bare Exception). Before the effect, or after it (the host did the
    # work, the answer was lost).
    @staticmethod
    def last_failure(inst: Instance) -> tuple[str | None, str]:
        """The activity the instance's last TaskFailed records (after its
        retries: the one that ended a Failed orchestration), and that try's
        reason. Not the instance's output: an orchestration that caught one
        failure and then met another may end with the first one's error (a
        lost begin whose plan could not be read again, seed 2100043)."""
        names = {
            e.get("EventId"): e.get("Name")
            for e in inst.history
            if e["EventType"] == TASK_SCHEDULED
        }
        failed = [e for e in inst.history if e["EventType"] == TASK_FAILED]
        if not failed:
            return None, ""
        return names.get(failed[-1].get("TaskScheduledId")), str(failed[-1].get("Reason") or "")

    def _fail_before(self, method: str, instance_id: str | None) -> None:
        faults = self.world.faults
        if faults.draw(faults.config.durable_fail, "durable_fail", f"{method} {instance_id}"):
            raise Exception("The operation failed with an unexpected status code 503")

    def _fail_after(self, method: str, instance_id: str | None) -> None:
        faults = self.world.faults
        if faults.draw(
            faults.config.durable_fail / 2, "durable_fail_after", f"{method} {instance_id}"
        ):
            raise TimeoutError(f"{method} timed out after the host took it")

    # --- the host's work
    def _kick(self, inst: Instance) -> None:
        if inst.busy or not inst.inbox or inst.status in _TERMINAL:
            return
        inst.busy = True
        execution = inst.execution

        async def episode() -> None:
            await self.world.point(f"episode {inst.instance_id}", delay=self._episode_wait())
            inst.busy = False
            if self.instances.get(inst.instance_id) is not inst or inst.execution != execution:
                return
            self._episode(inst)
            self._kick(inst)

        def lost() -> None:  # the worker died mid-episode: the inbox stays; run again
            inst.busy = False
            self.world.at(self.world.clock.now, "episode retry", lambda: self._kick(inst))

        self.world.spawn(f"orch:{inst.instance_id}", episode, on_crash=lost)

    def _episode_wait(self) -> float | None:
        """How long an episode's work item waits in its control queue: under
        overload, while faults last, 0 to FaultConfig.episode_wait seconds (the
        task hub's queues backed up: an attempt's reply taken seconds after it
        came), or 60-240 s when its worker stalls (FaultConfig.episode_stalls);
        otherwise the scheduler's own draw (None)."""
        config = self.world.faults.config
        if not (config.episode_wait or config.episode_stalls) or not self.world.faults.active:
            return None
        if config.episode_stalls and self._wait_rng.random() < config.episode_stalls:
            return round(self._wait_rng.uniform(60, 240), 3)
        if not config.episode_wait:
            return None
        return round(self._wait_rng.uniform(0, config.episode_wait), 3)

    def _episode(self, inst: Instance) -> None:
        now = self.world.clock.now
        if inst.status in _TERMINAL:
            inst.inbox.clear()
            return
        new_events, inst.inbox = inst.inbox, []
        for e in new_events:
            if e["EventType"] == EVENT_RAISED:
                self.heard.setdefault((inst.instance_id, e.get("Name")), []).append(e.get("Input"))
        if not inst.history and not any(e["EventType"] == EXECUTION_STARTED for e in new_events):
            inst.inbox = new_events
            return
        if self.dies(inst.instance_id):
            inst.status = "Failed"
            inst.output = "injected: the orchestration failed (an activity's retries spent)"
            self._ended(inst)
            self.world.log(f"durable {inst.instance_id} FAILED (injected: the instance died)")
            self.world.counters["compensation_died"] += 1
            return
        inst.status = "Running"
        marker = _event(ORCHESTRATOR_STARTED, now)
        past = [dict(e, IsPlayed=True) for e in inst.history]
        scheduled_before = {
            e["EventId"]: e for e in inst.history if e["EventType"] in SCHEDULING_EVENTS
        }
        spec = self.catalog.orchestrator(inst.name)
        try:
            result = run_episode(
                spec.func,
                instance_id=inst.instance_id,
                history=[*past, marker, *new_events],
                input_json=inst.input,
                scheduled_before=scheduled_before,
            )
        except NonDeterminismError as exc:
            inst.status, inst.output = "Failed", str(exc)
            self._ended(inst)
            self.world.log(f"durable {inst.instance_id} NONDETERMINISTIC {exc}")
            return
        scheduled = []
        for task in result.new_tasks:
            if task.kind == "activity":
                scheduled.append(
                    _event(
                        TASK_SCHEDULED, now, EventId=task.task_id, Name=task.name, Input=task.input
                    )
                )
                self._activity(inst, inst.execution, task.task_id, task.name, task.input)
            elif task.kind == "timer":
                fire_at = task.fire_at if task.fire_at.tzinfo else task.fire_at.replace(tzinfo=UTC)
                if self.on_timer is not None:
                    self.on_timer(inst.instance_id, fire_at, now)
                scheduled.append(
                    _event(TIMER_CREATED, now, EventId=task.task_id, FireAt=iso(fire_at))
                )
                self._timer(inst, inst.execution, task.task_id, fire_at)
        inst.history += [marker, *new_events, *scheduled]
        if result.outcome == "completed":
            inst.history += [
                _event(ORCHESTRATOR_COMPLETED, now),
                _event(
                    EXECUTION_COMPLETED,
                    now,
                    OrchestrationStatus="Completed",
                    Result=result.output_json,
                ),
            ]
            inst.status, inst.output = "Completed", json.loads(result.output_json or "null")
            self._ended(inst)
            self.world.log(f"durable {inst.instance_id} completed {result.output_json}")
        elif result.outcome == "failed":
            inst.status, inst.output = "Failed", result.error
            self._ended(inst)
            self.world.log(f"durable {inst.instance_id} FAILED {str(result.error)[:200]}")
            self.world.counters["orchestration_failed"] += 1
        else:
            inst.history.append(_event(ORCHESTRATOR_COMPLETED, now))

    def _ended(self, inst: Instance) -> None:
        self.finished[inst.instance_id] = (
            inst.status,
            inst.output,
            self.owner_of(inst.instance_id),
        )
        self.last_ended = self.world.clock.now

    def _deliver(self, inst: Instance, execution: int, event: dict[str, Any]) -> None:
        if self.instances.get(inst.instance_id) is not inst or inst.execution != execution:
            return  # news for a replaced execution: dropped, as DTFx does
        inst.inbox.append(event)
        self._kick(inst)

    def _timer(self, inst: Instance, execution: int, task_id: int, fire_at) -> None:
        event = _event(TIMER_FIRED, fire_at, TimerId=task_id, FireAt=iso(fire_at))
        self.world.at(
            fire_at, f"timer {inst.instance_id}", lambda: self._deliver(inst, execution, event)
        )

    def _activity(
        self, inst: Instance, execution: int, task_id: int, name: str, input_json: str | None
    ) -> None:
        spec = self.catalog.activity(name)
        runs = (
            2
            if self.world.faults.draw(
                self.world.faults.config.duplicate_activity,
                "activity_twice",
                f"{inst.instance_id} {name}",
            )
            else 1
        )

        def run_once() -> None:
            async def body() -> None:
                await self.world.point(f"activity {name}")
                arg = ActivityTriggerConverter.decode(
                    meta.Datum(type="json", value=input_json or "null"), trigger_metadata=None
                )
                try:
                    value = await call_function(spec, {spec.trigger["name"]: arg})
                    if self.on_activity_result is not None:
                        self.on_activity_result(inst.instance_id, name, value)
                    result = ActivityTriggerConverter.encode(value, expected_type=None).value
                    event = _event(
                        TASK_COMPLETED, self.world.clock.now, TaskScheduledId=task_id, Result=result
                    )
                except Exception as exc:
                    self.world.log(
                        f"activity {name} for {inst.instance_id} failed: {str(exc)[:160]}"
                    )
                    self.world.counters["activity_failed"] += 1
                    if isinstance(exc, ValidationError):
                        # Our own model refused what our own code built: retrying
                        # cannot help (e.g. a provider's text that does not fit).
                        self.invalid_own_data.append(
                            f"activity {name} for {inst.instance_id}: {str(exc)[:200]}"
                        )
                    event = _event(
                        TASK_FAILED,
                        self.world.clock.now,
                        TaskScheduledId=task_id,
                        Reason=str(exc) or type(exc).__name__,
                        Details=None,
                    )
                if task_id in inst.done_tasks:
                    return  # another delivery of this activity finished first
                inst.done_tasks.add(task_id)
                self._deliver(inst, execution, event)

            def again() -> None:  # the worker died: the work item is delivered again
                self.world.at(self.world.clock.now, "activity redelivery", run_once)

            self.world.spawn(f"act:{name}:{inst.instance_id}", body, on_crash=again)

        for _ in range(runs):
            run_once()
