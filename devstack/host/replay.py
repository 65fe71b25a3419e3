"""One orchestrator episode through the Durable SDK's own replay engine.

The host builds the context JSON a real host sends (history, instanceId, input,
upperSchemaVersion), the SDK's `Orchestrator` replays the generator against it and
returns its state JSON. Like DTFx, the host then matches what the orchestrator
scheduled against what the history says was scheduled, task id by task id: a
different name or kind at the same id, or a recorded task the replay no longer
schedules, is a non-deterministic orchestrator and fails the instance instead of
running on. What is scheduled beyond the history is the episode's new work.

Task ids are the SDK's own sequence numbers (the same ones DTFx gives TaskScheduled
and TimerCreated events); the host reads them as the SDK assigns them rather than
re-deriving them from the action list, which would miss the timers and re-schedules
that `call_*_with_retry` adds without an action.
"""

from __future__ import annotations

import collections
import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from azure.durable_functions import DurableOrchestrationContext
from azure.durable_functions.models.actions.CallActivityAction import CallActivityAction
from azure.durable_functions.models.actions.CallActivityWithRetryAction import (
    CallActivityWithRetryAction,
)
from azure.durable_functions.models.actions.CallEntityAction import CallEntityAction
from azure.durable_functions.models.actions.CallHttpAction import CallHttpAction
from azure.durable_functions.models.actions.CallSubOrchestratorAction import (
    CallSubOrchestratorAction,
)
from azure.durable_functions.models.actions.CallSubOrchestratorWithRetryAction import (
    CallSubOrchestratorWithRetryAction,
)
from azure.durable_functions.models.actions.CreateTimerAction import CreateTimerAction
from azure.durable_functions.models.actions.NoOpAction import NoOpAction
from azure.durable_functions.models.actions.SignalEntityAction import SignalEntityAction
from azure.durable_functions.models.OrchestratorState import OrchestratorState
from azure.durable_functions.models.Task import AtomicTask, RetryAbleTask
from azure.durable_functions.models.TaskOrchestrationExecutor import TaskOrchestrationExecutor
from azure.durable_functions.models.utils.df_serialization import df_dumps
from dateutil.parser import parse as _dateutil_parse
from dateutil.tz import tzutc

from .errors import NonDeterminismError

_TZUTC = tzutc()


@functools.lru_cache(maxsize=200_000)
def parse_timestamp(value: str) -> datetime:
    """What `dateutil.parser.parse` returns for a history timestamp, about 30 times faster.

    Remembered (the answers are immutable): a replay re-parses every timestamp of the
    history on every episode, the same strings each time.

    The SDK parses every history event's timestamp with dateutil on every replay, which was
    half of an episode's CPU time. The host writes ISO-8601 UTC timestamps, which
    `datetime.fromisoformat` reads; the zone is dateutil's `tzutc()` (what dateutil gives a
    'Z' on a machine whose local zone is not UTC). Anything else still goes to dateutil."""
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return _dateutil_parse(value)
    offset = parsed.utcoffset()
    if offset is not None and not offset:
        return parsed.replace(tzinfo=_TZUTC)
    return _dateutil_parse(value)  # naive or another offset: rare, and dateutil decides its zone


def install_fast_timestamps() -> None:
    """Point the SDK's HistoryEvent at `parse_timestamp` (its module imports dateutil's parse
    as `dt_parse`). Idempotent; called when this module is imported."""
    module = sys.modules.get("azure.durable_functions.models.history.HistoryEvent")
    if module is not None and getattr(module, "dt_parse", None) is not parse_timestamp:
        module.dt_parse = parse_timestamp  # type: ignore[attr-defined]


install_fast_timestamps()


@functools.cache
def _cached_namedtuple(typename: str, field_names: Any, **kwargs: Any) -> Any:
    return collections.namedtuple(typename, field_names, **kwargs)


def _namedtuple(typename: str, field_names: Any, **kwargs: Any) -> Any:
    """`collections.namedtuple`, built once per (name, fields) instead of once per call.

    The SDK's `TaskOrchestrationExecutor.__init__` builds its `SetTaskValuePayload` class
    with `namedtuple` on every episode (`Orchestrator(fn)` is made per call), which is
    about a fifth of an episode's replay CPU: class creation compiles source text. The class
    is the same every time (same name, same fields), so building it once changes nothing
    the replay computes. Unhashable arguments (a list of fields) still go to namedtuple."""
    try:
        return _cached_namedtuple(typename, field_names, **kwargs)
    except TypeError:
        return collections.namedtuple(typename, field_names, **kwargs)


def install_cached_namedtuple() -> None:
    """Point the SDK's TaskOrchestrationExecutor module at `_namedtuple` (it imports
    `namedtuple` from collections by name). Idempotent; called when this module is imported."""
    module = sys.modules.get("azure.durable_functions.models.TaskOrchestrationExecutor")
    if module is not None and getattr(module, "namedtuple", None) is not _namedtuple:
        module.namedtuple = _namedtuple  # type: ignore[attr-defined]


install_cached_namedtuple()


def install_settled_strict_mode() -> None:
    """Read the worker library's strict-typing setting (`AZURE_FUNCTIONS_DURABLE_STRICT_TYPING`)
    once, now, instead of on every encode and decode: its `df_dumps`/`df_loads` (every
    action's input, every activity's input and result) look the variable up in `os.environ`
    each time, about 3 % of a py-spy profile of bench/host_bench.py. Call after the app's settings
    are in the environment; the setting then stays as it was at start, as an app setting
    does on Azure (a change restarts the worker)."""
    from azure.functions import _durable_functions as codec

    strict = bool(codec._is_strict_mode())
    # The bool's own __bool__, not a lambda: called some fifty times an order, and a lambda
    # is a Python frame each time.
    codec._is_strict_mode = strict.__bool__


HTTP_ACTIVITY = "BuiltIn::HttpActivity"  # the extension runs call_http as this built-in activity
UPPER_SCHEMA_VERSION = 2  # ReplaySchema.V3: task_any/task_all as compound actions

TASK_SCHEDULED = 4
SUB_ORCHESTRATION_CREATED = 7
TIMER_CREATED = 10
EVENT_SENT = 14  # an entity call or signal, as the extension records it
SCHEDULING_EVENTS = (TASK_SCHEDULED, SUB_ORCHESTRATION_CREATED, TIMER_CREATED, EVENT_SENT)
_KIND_OF_EVENT = {
    TASK_SCHEDULED: "activity",
    SUB_ORCHESTRATION_CREATED: "suborchestration",
    TIMER_CREATED: "timer",
    EVENT_SENT: "entity",
}


@dataclass
class NewTask:
    """Work the orchestrator scheduled in this episode."""

    task_id: int
    kind: str  # activity | timer | suborchestration | entity
    name: str | None = None  # for an entity: its scheduler id, "@name@key"
    input: str | None = None
    fire_at: datetime | None = None
    instance_id: str | None = None
    version: str | None = None
    operation: str | None = None  # entity operation
    signal: bool = False  # entity signal (no response) rather than call


@dataclass
class EpisodeResult:
    """What one replay decided.

    Attributes:
        outcome: ``running``, ``completed``, ``failed`` or ``continued_as_new``.
        output_json: the orchestrator's return value as JSON (completed), or None.
        error: the exception message (failed).
        custom_status_json: the custom status as JSON, or None.
        new_tasks: work scheduled beyond the history.
        continue_input: the new input (continued_as_new).
        state: the raw state JSON the SDK returned (what a real host receives), as the
            dict it decodes to. The host itself reads none of it; for a running episode
            it is built only when asked for (`state_of`), since encoding the actions was
            a tenth of the replay's CPU in bench/host_bench.py.
    """

    outcome: str
    output_json: str | None = None
    error: str | None = None
    custom_status_json: str | None = None
    new_tasks: list[NewTask] = field(default_factory=list)
    continue_input: str | None = None
    state_of: Callable[[], dict[str, Any] | None] | None = field(
        default=None, repr=False, compare=False
    )

    @functools.cached_property
    def state(self) -> dict[str, Any] | None:
        return self.state_of() if self.state_of is not None else None


@functools.lru_cache(maxsize=4096)
def _decoded_text(input_json: str) -> Any:
    return json.loads(input_json)


def _decoded_input(input_json: str | None) -> Any:
    """The start payload as the real host gives it, decoded. A JSON string (what the SDK
    client's double encoding makes of every input) is immutable, so it is decoded once per
    instance rather than on every episode; anything else is decoded each time, since the
    orchestrator may change what it gets."""
    if input_json is None:
        return None
    if input_json.startswith('"'):
        return _decoded_text(input_json)
    return json.loads(input_json)


def build_context(
    *, instance_id: str, history: list[dict[str, Any]], input_json: str | None, is_replaying: bool
) -> dict[str, Any]:
    return {
        "history": history,
        "instanceId": instance_id,
        "isReplaying": is_replaying,
        "parentInstanceId": None,
        # As the real host: the deserialized start payload. The SDK client posts its input
        # JSON-encoded a second time, so this is usually the JSON text get_input() decodes.
        "input": _decoded_input(input_json),
        "upperSchemaVersion": UPPER_SCHEMA_VERSION,
    }


def _action_of(task: AtomicTask) -> Any:
    action = task.action_repr
    if isinstance(action, list):
        action = action[0] if action else None
    return action


def _describe(task: AtomicTask, now: datetime) -> NewTask:
    action = _action_of(task)
    tid = task.id
    if isinstance(action, (CallActivityAction, CallActivityWithRetryAction)):
        return NewTask(tid, "activity", name=action.function_name, input=action.input_)
    if isinstance(action, CreateTimerAction):
        return NewTask(tid, "timer", fire_at=action.fire_at)
    if isinstance(action, CallHttpAction):
        return NewTask(
            tid, "activity", name=HTTP_ACTIVITY, input=json.dumps(action.http_request.to_json())
        )
    if isinstance(action, (CallEntityAction, SignalEntityAction)):
        return NewTask(
            tid,
            "entity",
            name=action.instance_id,
            input=action.input_,
            operation=action.operation,
            signal=isinstance(action, SignalEntityAction),
        )
    if isinstance(action, (CallSubOrchestratorAction, CallSubOrchestratorWithRetryAction)):
        return NewTask(
            tid,
            "suborchestration",
            name=action.function_name,
            input=action._input,
            instance_id=action.instance_id,
            version=action.version,
        )
    if isinstance(action, NoOpAction):
        parent = task.parent
        if isinstance(parent, RetryAbleTask):
            if action.metadata == "-WithRetry timer":
                # DTFx RetryInterceptor: wait FirstRetryInterval (backoff 1) after each failure.
                delay = timedelta(
                    milliseconds=parent.retry_options.first_retry_interval_in_milliseconds
                )
                return NewTask(tid, "timer", fire_at=now + delay)
            original = parent.actions[0] if isinstance(parent.actions, list) else parent.actions
            rescheduled = _describe_action(tid, original)
            if rescheduled is not None:
                return rescheduled
    raise NotImplementedError(
        f"devstack.host does not run {type(action).__name__} (task {tid}); "
        "supported: activities (with retry), timers, external events, sub-orchestrations, entity calls and signals, "
        "call_http"
    )


def _describe_action(tid: int, action: Any) -> NewTask | None:
    if isinstance(action, (CallActivityAction, CallActivityWithRetryAction)):
        return NewTask(tid, "activity", name=action.function_name, input=action.input_)
    if isinstance(action, (CallSubOrchestratorAction, CallSubOrchestratorWithRetryAction)):
        return NewTask(
            tid,
            "suborchestration",
            name=action.function_name,
            input=action._input,
            instance_id=action.instance_id,
            version=action.version,
        )
    return None


def _parse_failure(exc: Exception) -> tuple[str, dict[str, Any] | None]:
    text = str(exc)
    marker = "\n\n$OutOfProcData$:"
    if marker in text:
        message, _, data = text.partition(marker)
        try:
            return message, json.loads(data)
        except json.JSONDecodeError:
            return message, None
    return text, None


def _state(executor: TaskOrchestrationExecutor) -> dict[str, Any] | str:
    """The state the SDK returns from an episode, as the dict its JSON decodes to, without
    encoding it to text and decoding it again (the host reads a few fields of it; the two
    were about 4 % of a py-spy profile of bench/host_bench.py). The actions' own `to_json` already
    encodes their inputs; a custom status still goes through the library's codec, as in the
    text. An episode with an output or an error (once per execution) takes the SDK's own
    path, text and all, so that its checks and its failure message stay the SDK's."""
    if executor.output is not None or executor.exception is not None:
        return TaskOrchestrationExecutor.get_orchestrator_state_str(executor)
    ctx = executor.context
    state = OrchestratorState(
        is_done=executor.orchestration_invocation_succeeded,
        actions=ctx._actions,
        output=None,
        replay_schema=ctx._replay_schema,
        error=None,
        custom_status=ctx.custom_status,
    ).to_json()
    if "customStatus" in state:
        state["customStatus"] = json.loads(df_dumps(state["customStatus"]))
    return state


def _returned(executor: TaskOrchestrationExecutor) -> dict[str, Any] | str | None:
    """What the host has the SDK return from an episode (`get_orchestrator_state_str`): the
    SDK's state (`_state`) when the orchestrator returned or raised, else nothing: the host
    reads only `isDone` and the custom status of a running episode, which it takes from
    the executor, and `EpisodeResult.state` builds the rest when asked for."""
    if executor.output is not None or executor.exception is not None:
        return _state(executor)
    return None


def _state_dict(executor: TaskOrchestrationExecutor) -> dict[str, Any] | None:
    state = _state(executor)
    return json.loads(state) if isinstance(state, str) else state


def _custom_status_json(custom: Any) -> str | None:
    """The custom status as `_state` gives it (the library's codec, and only if truthy, as
    `OrchestratorState.to_json` includes it), as JSON text."""
    if not custom:
        return None
    value = json.loads(df_dumps(custom))
    return json.dumps(value) if value is not None else None


def _shared_executor_fields() -> dict[str, Any]:
    """What `TaskOrchestrationExecutor.__init__` sets besides `initialize()`: its tables of
    event types (built anew for every episode, and only read)."""
    built = TaskOrchestrationExecutor()
    bare = TaskOrchestrationExecutor.__new__(TaskOrchestrationExecutor)
    bare.initialize()
    return {k: v for k, v in vars(built).items() if k not in vars(bare)}


_EXECUTOR_FIELDS = _shared_executor_fields()


def _new_executor() -> TaskOrchestrationExecutor:
    """A `TaskOrchestrationExecutor()` whose constant tables are shared rather than built
    again (with `Orchestrator(fn)`, about 6 % of the replay's CPU in bench/host_bench.py)."""
    executor = TaskOrchestrationExecutor.__new__(TaskOrchestrationExecutor)
    executor.__dict__.update(_EXECUTOR_FIELDS)
    executor.initialize()
    return executor


def run_episode(
    handle: Callable[..., Any],
    *,
    instance_id: str,
    history: list[dict[str, Any]],
    input_json: str | None,
    scheduled_before: dict[int, dict[str, Any]],
) -> EpisodeResult:
    """Replay `history` through the SDK and classify the result.

    Args:
        handle: the registered orchestrator (``get_user_function()`` of an
            orchestration trigger: the SDK's ``Orchestrator.create`` handle).
        history: past events (IsPlayed true) + OrchestratorStarted + the new events.
        scheduled_before: history events that scheduled work, by EventId.

    Raises:
        NonDeterminismError: the replay does not match `scheduled_before`.
    """
    body = build_context(
        instance_id=instance_id,
        history=history,
        input_json=input_json,
        is_replaying=bool(scheduled_before),
    )
    # The constructor from_json would call after decoding the text: the context is built from the
    # dict directly, which saves encoding and decoding the whole history on every episode.
    ctx = DurableOrchestrationContext(**body)
    ctx._input_expected_type = getattr(handle, "_df_input_type", None)

    recorded: dict[int, AtomicTask] = {}
    original = ctx._add_to_open_tasks

    def recording_add(task: Any) -> None:
        original(task)
        if isinstance(task, AtomicTask) and isinstance(task.id, int) and task.id >= 0:
            recorded.setdefault(task.id, task)

    ctx._add_to_open_tasks = recording_add  # type: ignore[method-assign]

    # signal_entity never opens a task: it records its action and takes a sequence number,
    # which is the EventId the host gives its EventSent.
    signals: dict[int, NewTask] = {}
    original_fire = ctx._record_fire_and_forget_action

    def recording_fire(action: Any) -> None:
        seq = ctx._sequence_number
        original_fire(action)
        if isinstance(action, SignalEntityAction):
            signals.setdefault(
                seq,
                NewTask(
                    seq,
                    "entity",
                    name=action.instance_id,
                    input=action.input_,
                    operation=action.operation,
                    signal=True,
                ),
            )

    ctx._record_fire_and_forget_action = recording_fire  # type: ignore[method-assign]
    user_fn = getattr(handle, "orchestrator_function", handle)

    executor = _new_executor()
    executor.get_orchestrator_state_str = functools.partial(_returned, executor)
    state: dict[str, Any] | None = None
    state_of: Callable[[], dict[str, Any] | None] | None = None
    try:
        # What `Orchestrator(fn).handle(ctx)` does, without building the Orchestrator.
        returned = executor.execute(ctx, ctx.histories, user_fn)
        if returned is None:  # neither output nor error: the state waits until it is asked for
            state_of = functools.partial(_state_dict, executor)
            is_done = executor.orchestration_invocation_succeeded
            custom_json = _custom_status_json(ctx.custom_status)
        else:
            state = json.loads(returned) if isinstance(returned, str) else returned
        failure = None
    except Exception as exc:  # the orchestrator raised: the SDK wraps its state in the message
        message, state = _parse_failure(exc)
        failure = message
    if state_of is None or ctx.will_continue_as_new:
        state = state if state_of is None else state_of()
        state_of = functools.partial(lambda s: s, state)
        is_done = bool(state and state.get("isDone"))
        custom = (state or {}).get("customStatus")
        custom_json = json.dumps(custom) if custom is not None else None

    now = ctx.current_utc_datetime
    # Match the replay against what the history says was scheduled (DTFx's determinism check).
    for event_id, event in sorted(scheduled_before.items()):
        task = recorded.get(event_id)
        expected_kind = _KIND_OF_EVENT[event["EventType"]]
        expected_name = (
            event.get("InstanceId") if event["EventType"] == EVENT_SENT else event.get("Name")
        )
        if task is None and event_id in signals:
            got = signals[event_id]
        elif task is None:
            if failure is not None or is_done:
                continue
            raise NonDeterminismError(
                f"Non-Deterministic workflow detected: the history has {expected_kind} "
                f"{expected_name or ''} with id {event_id}, which the orchestrator no longer schedules"
            )
        else:
            try:
                got = _describe(task, now)
            except NotImplementedError:
                got = NewTask(event_id, "unsupported")
        if got.kind != expected_kind or (expected_name is not None and got.name != expected_name):
            raise NonDeterminismError(
                f"Non-Deterministic workflow detected: the history has {expected_kind} "
                f"{expected_name or ''} with id {event_id}, the replay scheduled {got.kind} {got.name or ''}"
            )

    new_tasks = [_describe(recorded[i], now) for i in sorted(recorded) if i not in scheduled_before]
    new_tasks += [
        signals[i] for i in sorted(signals) if i not in scheduled_before and i not in recorded
    ]
    new_tasks.sort(key=lambda t: t.task_id)

    if failure is not None:
        return EpisodeResult(
            "failed", error=failure, custom_status_json=custom_json, state_of=state_of
        )
    if ctx.will_continue_as_new:
        assert state is not None
        cont = None
        for action in (state.get("actions") or [[]])[-1]:
            if action.get("actionType") == 4:
                cont = action.get("input")
        return EpisodeResult(
            "continued_as_new",
            continue_input=cont,
            custom_status_json=custom_json,
            state_of=state_of,
        )
    if is_done:
        output = state.get("output") if state is not None else None
        return EpisodeResult(
            "completed",
            output_json=json.dumps(output) if output is not None else None,
            custom_status_json=custom_json,
            new_tasks=new_tasks,
            state_of=state_of,
        )
    return EpisodeResult(
        "running", custom_status_json=custom_json, new_tasks=new_tasks, state_of=state_of
    )
