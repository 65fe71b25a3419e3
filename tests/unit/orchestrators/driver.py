"""Drives `order_workflow` through the Durable SDK's own replay path
(devstack.host.replay.run_episode, the local host's engine) with the real
SchedulerActivities over in-memory fakes, a scripted agent and a virtual
clock: each episode replays the whole history plus what happened since, as a
Functions host would. Failures are scripted per activity call."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from activities.policy import ActivityPolicy
from activities.scheduler_activities import SchedulerActivities
from adapters.settings import Settings
from devstack.host.replay import SCHEDULING_EVENTS, run_episode
from domain import state_machine as sm
from domain.ids import order_key, parse_attempt_instance_id
from domain.models import AgentReply, AgentRequest, OrderSubmitted
from domain.steps import DEFAULT_CATALOG
from orchestrators.contracts import SendRequest, event_payload
from orchestrators.order_workflow import VERSION, order_workflow
from orchestrators.policy import StarterPolicy
from orchestrators.requests import AgentRequests
from orchestrators.starter import Starter
from tests.builders import KEYS, ReadClock, order_payload
from tests.fakes import FakeOrders, FakeStateStore, RecordingPublisher

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
STEPS = list(DEFAULT_CATALOG.names)  # domain/steps.json
POLICY = sm.RetryPolicy(
    threshold=3, long_retries=1, long_delay=timedelta(hours=1), claim_timeout=timedelta(seconds=60)
)
SETTINGS = Settings(
    state_account=None,
    orders_account=None,
    servicebus=None,  # type: ignore[arg-type]
    step_timeout=timedelta(seconds=60),
    retry=POLICY,
    agent_keys=KEYS.agents,
    reply_token_keys=KEYS.tokens,
)

EXECUTION_STARTED, TASK_SCHEDULED, TASK_COMPLETED, TASK_FAILED = 0, 4, 5, 6
TIMER_CREATED, TIMER_FIRED, ORCHESTRATOR_STARTED, ORCHESTRATOR_COMPLETED, EVENT_RAISED = (
    10,
    11,
    12,
    13,
    15,
)

# What the scripted agent answers: ("ok", result) / ("transient", error) /
# ("permanent", error), or None for no reply at all; a third item, a
# timedelta, delays this answer (instead of the driver's reply_delay).
Answer = tuple[str, Any] | tuple[str, Any, timedelta] | None


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _event(event_type: int, when: datetime, **fields: Any) -> dict[str, Any]:
    return {
        "EventType": event_type,
        "EventId": fields.pop("EventId", -1),
        "IsPlayed": False,
        "Timestamp": _iso(when),
        **fields,
    }


class ActivityFailure(Exception):
    pass


class StartingClient:
    """A Durable client for the Starter: keeps what it was asked to start."""

    def __init__(self) -> None:
        self.started: dict[str, Any] = {}

    async def start_new(self, name, instance_id, data):
        self.started[instance_id] = data

    async def get_status(self, instance_id):
        """Started instances are Running (the driver runs them later)."""
        if instance_id not in self.started:
            return None
        return type("Status", (), {"runtime_status": type("R", (), {"name": "Running"})()})()


@dataclass
class World:
    store: FakeStateStore = field(default_factory=FakeStateStore)
    orders: FakeOrders = field(default_factory=FakeOrders)
    bus: RecordingPublisher = field(default_factory=RecordingPublisher)
    index: Any = None
    settings: Settings = SETTINGS
    now: datetime = T0
    # Steps run inline (INLINE_STEPS) and the agent library that runs them.
    step_modes: dict[str, str] | None = None
    inline_agent: Any = None
    # The input each claimed attempt was started with, by instance id.
    inputs: dict[str, dict] = field(default_factory=dict)

    def activities(self) -> SchedulerActivities:
        return SchedulerActivities(
            ActivityPolicy.from_settings(self.settings),
            self.store,
            self.orders,
            self.bus,
            STEPS,
            inline_agent=self.inline_agent,
            step_modes=self.step_modes,
            index=self.index,
            clock=ReadClock(lambda: self.now),
        )

    def starter(self) -> Starter:
        """The Starter as the root builds it: its claim marks the steps."""
        return Starter(
            StarterPolicy.from_settings(self.settings, STEPS, self.step_modes),
            self.store,
            self.index,
            clock=ReadClock(lambda: self.now),
            publisher=self.bus,
            orders=self.orders,
            # It sends each attempt's first request itself (ADR 021l).
            requests=AgentRequests(self.settings.scheduler_keys, self.bus, self.orders),
        )

    async def submitted(self, order_id: str = "A1", **fields) -> tuple[Any, str]:
        """What Submit leaves: the order and a Pending record (two creates)."""
        record, etag, _ = await self._submit(order_id, **fields)
        return record, etag

    async def _submit(self, order_id: str, **fields):
        order = OrderSubmitted.model_validate(order_payload(OrderID=order_id, **fields))
        await self.orders.store(order)
        record, etag, _ = await self.store.create_if_absent(sm.new_record(order, self.now, STEPS))
        return record, etag, order

    async def fast_started(self, order_id: str = "A1", **fields) -> tuple[str, dict]:
        """Submitted, then claimed and started through Submit's fast path, as
        the real Starter does it: the attempt's instance id and the input the
        orchestration was started with."""
        record, etag, order = await self._submit(order_id, **fields)
        client = StartingClient()
        instance_id = await self.starter().start_submitted(client, record, etag, order)
        assert instance_id is not None
        return instance_id, client.started[instance_id]

    async def claimed(self, order_id: str = "A1", **fields) -> str:
        """A Pending record claimed by the timer Starter: its attempt's
        instance id (its input kept in `inputs`, where Driver finds it)."""
        record, etag, _ = await self._submit(order_id, **fields)
        client = StartingClient()
        instance_id = await self.starter().claim_and_start(client, record, etag)
        assert instance_id is not None
        self.inputs[instance_id] = client.started[instance_id]
        return instance_id

    async def record(self, order_id: str = "A1"):
        """The record of the webshop's order `order_id` (or of the key given)."""
        key = order_id if ":" in order_id else order_key("webshop", order_id)
        return (await self.store.read(key))[0]

    def statuses(self, queue: str = "replies-webshop") -> list[dict]:
        return [json.loads(body) for body in self.bus.to(queue)]

    def sent(self, queue: str) -> list[tuple[bytes, str]]:
        return [(body, mid) for q, body, mid, _ in self.bus.sent if q == queue]


class Driver:
    """One orchestration instance, episode by episode.

    `agent(send)` answers each agent request (see Answer). `fail(name, call)`
    says whether this call of activity `name` (counted from 0 per name)
    raises. `before_activity(name, data)` runs first (to change the world at
    exactly that point, e.g. a stale write)."""

    def __init__(
        self,
        world: World,
        instance_id: str,
        agent: Callable[[SendRequest], Answer],
        version: str = VERSION,
        fail: Callable[[str, int], bool] = lambda name, call: False,
        before_activity: Callable[[str, dict], Any] | None = None,
        reply_delay: timedelta = timedelta(seconds=1),
        input: dict | str | None = "claimed",
        orchestrator: Callable[[Any], Any] = order_workflow,
    ) -> None:
        """`input`: the orchestration's input; by default the one its claim
        gave it (World.claimed), None for an instance started without one
        (a compensation)."""
        if input == "claimed":
            input = world.inputs.get(instance_id)
        assert not isinstance(input, str)
        # The code each episode replays with: changed between episodes, an upgrade.
        self.orchestrator = orchestrator
        self.world, self.instance_id, self.agent = world, instance_id, agent
        self.fail, self.before_activity, self.reply_delay = fail, before_activity, reply_delay
        self.history: list[dict] = [
            _event(ORCHESTRATOR_STARTED, world.now),
            _event(
                EXECUTION_STARTED,
                world.now,
                Name="order_workflow",
                Version=version,
                Input=None if input is None else json.dumps(input),
            ),
            _event(ORCHESTRATOR_COMPLETED, world.now),
        ]
        self.input = input
        self.calls: list[tuple[str, dict]] = []
        self._counts: dict[str, int] = {}
        self._timers: dict[int, datetime] = {}
        self._events: list[tuple[datetime, dict]] = []  # (arrives at, EventRaised)
        self.episodes = 0
        self.outcome: str | None = None
        self.output: dict | None = None
        self.error: str | None = None
        # The request the Starter sent as it started the attempt (ADR 021l) is
        # on the queue already: the agent answers it as it answers any.
        for queue, body, _, _ in world.bus.sent:
            if queue == "agent-requests":
                request = AgentRequest.model_validate_json(body)
                if request.InstanceId == instance_id:
                    self._answer(_as_send(request))

    async def _activity(self, name: str, data: dict) -> Any:
        call = self._counts.get(name, 0)
        self._counts[name] = call + 1
        self.calls.append((name, data))
        if self.before_activity is not None:
            result = self.before_activity(name, data)
            if hasattr(result, "__await__"):
                await result
        if self.fail(name, call):
            raise ActivityFailure(f"scripted failure of {name} call {call}")
        before = len(self.world.bus.sent)
        # As the activity triggers do (triggers.activities): decode, run, encode.
        result = await self.world.activities().run(name, data)
        if name == "send_agent_request":
            if len(self.world.bus.sent) > before:  # duplicate detection drops a repeated id
                self._answer(SendRequest.model_validate(data))
        elif name in ("begin_attempt", "advance_attempt", "send_step"):
            # Answer the request the activity sent (a re-send dropped by
            # duplicate detection gets no second answer).
            for queue, body, _, _ in self.world.bus.sent[before:]:
                if queue == "agent-requests":
                    self._answer(_as_send(AgentRequest.model_validate_json(body)))
        return result

    def _answer(self, send: SendRequest) -> None:
        answer = self.agent(send)
        if answer is None:
            return
        outcome, detail, *later = answer  # a third item: this answer's own delay
        order_id, attempt = parse_attempt_instance_id(send.InstanceId)
        from domain.ids import reply_event_name

        event_name = reply_event_name(send.Step, attempt, send.label)
        reply = AgentReply(
            InstanceId=send.InstanceId,
            OrderID=order_id,
            Step=send.Step,
            Action=send.Action,
            Attempt=attempt,
            EventName=event_name,
            EventId=f"{event_name}/1",
            Outcome=outcome,
            Result=detail if outcome == "ok" else None,
            Error=None if outcome == "ok" else detail,
        )
        arrives = self.world.now + (later[0] if later else self.reply_delay)
        # Raised as the reply bridge raises it (orchestrators.contracts.event_payload).
        raised = json.dumps(event_payload(reply))
        self._events.append((arrives, _event(EVENT_RAISED, arrives, Name=event_name, Input=raised)))

    async def run(self, max_episodes: int = 200) -> str:
        new_events: list[dict] = []
        while self.episodes < max_episodes:
            self.episodes += 1
            scheduled_before = {
                e["EventId"]: e for e in self.history if e["EventType"] in SCHEDULING_EVENTS
            }
            started = _event(ORCHESTRATOR_STARTED, self.world.now)
            replay = [dict(e, IsPlayed=True) for e in self.history] + [started] + new_events
            result = run_episode(
                self.orchestrator,
                instance_id=self.instance_id,
                history=replay,
                input_json=None if self.input is None else json.dumps(self.input),
                scheduled_before=scheduled_before,
            )
            scheduled = []
            activities = []
            for task in result.new_tasks:
                if task.kind == "activity":
                    scheduled.append(
                        _event(
                            TASK_SCHEDULED,
                            self.world.now,
                            EventId=task.task_id,
                            Name=task.name,
                            Input=task.input,
                        )
                    )
                    activities.append(task)
                elif task.kind == "timer":
                    fire_at = (
                        task.fire_at if task.fire_at.tzinfo else task.fire_at.replace(tzinfo=UTC)
                    )
                    scheduled.append(
                        _event(
                            TIMER_CREATED,
                            self.world.now,
                            EventId=task.task_id,
                            FireAt=_iso(fire_at),
                        )
                    )
                    self._timers[task.task_id] = fire_at
            self.history += [
                started,
                *new_events,
                *scheduled,
                _event(ORCHESTRATOR_COMPLETED, self.world.now),
            ]
            if result.outcome in ("completed", "failed"):
                self.outcome = result.outcome
                self.output = json.loads(result.output_json) if result.output_json else None
                self.error = result.error
                return result.outcome
            new_events = []
            for task in activities:
                data = json.loads(task.input) if task.input else None
                try:
                    value = await self._activity(task.name, data)
                    new_events.append(
                        _event(
                            TASK_COMPLETED,
                            self.world.now,
                            TaskScheduledId=task.task_id,
                            Result=json.dumps(value),
                        )
                    )
                except Exception as exc:
                    new_events.append(
                        _event(
                            TASK_FAILED,
                            self.world.now,
                            TaskScheduledId=task.task_id,
                            Reason=str(exc),
                            Details=None,
                        )
                    )
            if new_events:
                continue
            # Nothing ran: the next thing to happen is a reply or a timer, whichever is first.
            upcoming = [(at, "event", i) for i, (at, _) in enumerate(self._events)]
            upcoming += [(at, "timer", tid) for tid, at in self._timers.items()]
            if not upcoming:
                raise AssertionError("the orchestration waits for nothing that will happen")
            at, kind, key = min(upcoming, key=lambda u: (u[0], u[1] != "event"))
            self.world.now = max(self.world.now, at)
            if kind == "event":
                new_events.append(self._events.pop(key)[1])
            else:
                fire_at = self._timers.pop(key)
                new_events.append(_event(TIMER_FIRED, fire_at, TimerId=key, FireAt=_iso(fire_at)))
        raise AssertionError(f"no end after {max_episodes} episodes")

    def activity_calls(self, name: str) -> list[dict]:
        return [data for n, data in self.calls if n == name]

    def writes(self) -> list[str]:
        return [d["Kind"] for d in self.activity_calls("write_state")]


# --- helpers the workflow tests share (test_workflow_v2.py, test_workflow_v2_4.py)
STATUS_QUEUE = "replies-webshop"


def _as_send(request: AgentRequest) -> SendRequest:
    return SendRequest(
        InstanceId=request.InstanceId,
        Step=request.Step,
        Action=request.Action,
        Deadline=request.Deadline,
        Payload=request.Payload,
    )


def ok(send: SendRequest) -> tuple[str, dict[str, str]]:
    """An agent that does every step and undo: a reference per step and action."""
    return ("ok", {"Reference": f"ref-{send.Step}-{send.Action}"})


def fail_step(
    step: str, outcome: str = "permanent", error: str = "card declined"
) -> Callable[[SendRequest], tuple[str, Any]]:
    """An agent whose `step` fails (`outcome`, `error`); everything else is ok."""

    def agent(send: SendRequest) -> tuple[str, Any]:
        if send.Action == "do" and send.Step == step:
            return (outcome, error)
        return ok(send)

    return agent


def statuses(world: World) -> list[str]:
    return [json.loads(body)["Status"] for body in world.bus.to(STATUS_QUEUE)]


def requests(world: World) -> list[dict[str, Any]]:
    return [json.loads(body) for body, _ in world.sent("agent-requests")]
