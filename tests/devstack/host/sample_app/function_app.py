"""A small app for testing devstack.host (not the product).

It uses every trigger kind the product uses, registered the way the product does
(blueprints on a DFApp): Service Bus triggers with and without manual settlement and
the SDK-type parameters, a timer trigger, durable clients on both, orchestrations
racing an external event against a durable timer, activities, retries.

Functions report what they did as JSON lines in $SAMPLE_OUT_DIR/events.jsonl so the
tests can check effects across host restarts. Service Bus functions are registered
only when $SAMPLE_SERVICEBUS is set, so the Durable tests need no broker.
"""

import asyncio
import json
import os
import time
from datetime import timedelta

import azure.durable_functions as df
import azure.functions as func


def record(kind: str, **fields):
    """Append one line to the events file (O_APPEND: safe across processes)."""
    line = json.dumps({"kind": kind, "pid": os.getpid(), "t": time.time(), **fields}) + "\n"
    fd = os.open(
        os.path.join(os.environ["SAMPLE_OUT_DIR"], "events.jsonl"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    )
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def count(kind: str, **match) -> int:
    path = os.path.join(os.environ["SAMPLE_OUT_DIR"], "events.jsonl")
    if not os.path.exists(path):
        return 0
    n = 0
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            if e["kind"] == kind and all(e.get(k) == v for k, v in match.items()):
                n += 1
    return n


# ---- orchestrations and activities (a blueprint) -------------------------------------

durable_bp = df.Blueprint()


@durable_bp.orchestration_trigger(context_name="context")
def race(context: df.DurableOrchestrationContext):
    """Double a number, then wait for an event or a deadline, whichever comes first."""
    data = context.get_input()
    context.set_custom_status({"stage": "doubling"})
    doubled = yield context.call_activity(
        "double", {"x": data["x"], "sleep": data.get("sleep", 0), "instance": context.instance_id}
    )
    context.set_custom_status({"stage": "waiting"})
    deadline = context.current_utc_datetime + timedelta(seconds=data.get("timeout", 3600))
    event = context.wait_for_external_event(data.get("event", "go"))
    timer = context.create_timer(deadline)
    winner = yield context.task_any([event, timer])
    if winner == event:
        timer.cancel()
        effect = yield context.call_activity(
            "record_effect", {"instance": context.instance_id, "value": event.result}
        )
        context.set_custom_status({"stage": "done"})
        return {
            "doubled": doubled,
            "event": event.result,
            "effect": effect,
            "version": context.version,
        }
    context.set_custom_status({"stage": "timed out"})
    return {"doubled": doubled, "timeout": True, "version": context.version}


@durable_bp.activity_trigger(input_name="payload")
async def double(payload: dict) -> int:
    record("double_started", instance=payload.get("instance"))
    # Only the first attempt is slow: a re-run after a crash finishes quickly.
    if payload.get("sleep") and count("double_started", instance=payload.get("instance")) == 1:
        await asyncio.sleep(payload["sleep"])
    return payload["x"] * 2


@durable_bp.activity_trigger(input_name="payload")
def record_effect(payload: dict) -> str:
    # A plain (sync) activity: the host runs it on a thread, as the worker does.
    record("effect", instance=payload["instance"], value=payload["value"])
    return f"effect:{payload['instance']}"


@durable_bp.orchestration_trigger(context_name="context")
def retrying(context: df.DurableOrchestrationContext):
    """call_activity_with_retry: the host adds the retry timers DTFx would."""
    result = yield context.call_activity_with_retry(
        "fails_twice",
        df.RetryOptions(first_retry_interval_in_milliseconds=200, max_number_of_attempts=4),
        context.instance_id,
    )
    return result


@durable_bp.activity_trigger(input_name="instance")
def fails_twice(instance: str) -> str:
    record("fails_twice", instance=instance)
    if count("fails_twice", instance=instance) <= 2:
        raise RuntimeError("transient failure")
    return "third time lucky"


@durable_bp.orchestration_trigger(context_name="context")
def replay_flags(context: df.DurableOrchestrationContext):
    """What `is_replaying` reads after each step, as the last episode saw it."""
    seen = [context.is_replaying]
    for value in (1, 2):
        yield context.call_activity(
            "record_effect", {"instance": context.instance_id, "value": value}
        )
        seen.append(context.is_replaying)
    return seen


_episodes = {"n": 0}


@durable_bp.orchestration_trigger(context_name="context")
def unstable(context: df.DurableOrchestrationContext):
    """Non-deterministic on purpose: schedules a different activity on replay."""
    _episodes["n"] += 1
    name = "double" if _episodes["n"] == 1 else "record_effect"
    yield context.call_activity(name, {"x": 1, "instance": context.instance_id, "value": 1})
    return "unreachable"


@durable_bp.orchestration_trigger(context_name="context")
def parent(context: df.DurableOrchestrationContext):
    results = yield context.task_all(
        [
            context.call_sub_orchestrator(
                "child", i, instance_id=f"{context.instance_id}-child-{i}"
            )
            for i in range(2)
        ]
    )
    return sum(results)


@durable_bp.orchestration_trigger(context_name="context")
def unnamed_parent(context: df.DurableOrchestrationContext):
    """A child started without an instance id: DurableTask.Core names it."""
    doubled = yield context.call_activity("double", {"x": 1, "instance": context.instance_id})
    result = yield context.call_sub_orchestrator("child", doubled)
    return result


@durable_bp.orchestration_trigger(context_name="context")
def child(context: df.DurableOrchestrationContext):
    n = context.get_input()
    doubled = yield context.call_activity("double", {"x": n, "instance": context.instance_id})
    return doubled


@durable_bp.orchestration_trigger(context_name="context")
def counter(context: df.DurableOrchestrationContext):
    """Eternal-orchestration style: continue_as_new until the input reaches 3."""
    n = context.get_input()
    if n >= 3:
        return n
    yield context.call_activity("double", {"x": n, "instance": context.instance_id})
    context.continue_as_new(n + 1)


# ---- timer trigger with a durable client ---------------------------------------------

timer_bp = df.Blueprint()


@timer_bp.timer_trigger(arg_name="timer", schedule="%SAMPLE_TICK_SCHEDULE%", run_on_startup=False)
@timer_bp.durable_client_input(client_name="client")
async def tick(timer: func.TimerRequest, client: df.DurableOrchestrationClient) -> None:
    status = timer.schedule_status
    record("tick", next=status.get("Next"), last=status.get("Last"), past_due=timer.past_due)
    if os.environ.get("SAMPLE_TICK_STARTS"):
        await client.start_new("race", f"tick-{status.get('Next')}", {"x": 21, "timeout": 1})


startup_bp = df.Blueprint()


@startup_bp.timer_trigger(arg_name="timer", schedule="0 0 0 1 1 *", run_on_startup=True)
def startup_tick(timer: func.TimerRequest) -> None:
    record("startup_tick", past_due=timer.past_due)


# ---- the app -------------------------------------------------------------------------

app = df.DFApp(http_auth_level=func.AuthLevel.ANONYMOUS)
app.register_functions(durable_bp)
if os.environ.get("SAMPLE_TICK_SCHEDULE"):
    app.register_functions(timer_bp)
if os.environ.get("SAMPLE_STARTUP_TICK"):
    app.register_functions(startup_bp)
if os.environ.get("SAMPLE_SERVICEBUS"):
    from servicebus_functions import servicebus_bp

    app.register_functions(servicebus_bp)
