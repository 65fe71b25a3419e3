"""A Functions app with the Service Bus trigger kinds the emulator serves beyond plain
queues, written as the library's samples write them (nothing here is adapted to the
host): a topic-subscription trigger, a session trigger with manual settlement, session
state and lock renewal through the message actions, and batch triggers
(`cardinality="many"`) with the library's and the SDK's message types.

Every invocation appends a line to $TRIGGERS_OUT/events.jsonl for the tests to read.
"""

import json
import os
import time
import typing

import azure.functions as func
from azurefunctions.extensions.bindings.servicebus import (
    ServiceBusMessageActions,
    ServiceBusReceivedMessage,
)

app = func.FunctionApp()


def record(kind: str, **fields: typing.Any) -> None:
    line = json.dumps({"kind": kind, "t": time.time(), **fields}) + "\n"
    fd = os.open(
        os.path.join(os.environ["TRIGGERS_OUT"], "events.jsonl"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
    )
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.service_bus_topic_trigger(
    arg_name="msg",
    topic_name="%TOPIC_NAME%",
    subscription_name="%SUBSCRIPTION_NAME%",
    connection="ServiceBusConnection",
)
def on_topic(msg: func.ServiceBusMessage) -> None:
    body = json.loads(msg.get_body())
    if body.get("fail"):
        record("topic_failed", message_id=msg.message_id, delivery_count=msg.delivery_count)
        raise RuntimeError("asked to fail")
    record(
        "topic",
        message_id=msg.message_id,
        body=body,
        properties=msg.application_properties,
        delivery_count=msg.delivery_count,
    )


@app.service_bus_queue_trigger(
    arg_name="msg",
    queue_name="%SESSION_QUEUE%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
    auto_complete_messages=False,
)
def on_session(msg: ServiceBusReceivedMessage, message_actions: ServiceBusMessageActions) -> None:
    body = json.loads(b"".join(msg.body))
    record("session_start", session=msg.session_id, seq=body["seq"])
    if body.get("sleep"):
        # Longer than the queue's lock: the session lock must be kept by the host.
        time.sleep(body["sleep"])
    locked_until = message_actions.renew_session_lock(msg.session_id)
    message_actions.set_session_state(msg.session_id, f"last={body['seq']}".encode())
    if body.get("deadletter"):
        message_actions.deadletter(
            msg, deadletter_reason="Refused", deadletter_error_description="asked to"
        )
    else:
        message_actions.complete(msg)
    if body.get("release"):
        message_actions.release_session(msg.session_id)
    record(
        "session",
        session=msg.session_id,
        seq=body["seq"],
        renewed=type(locked_until).__name__,
        renewed_seconds=locked_until.seconds,
    )


@app.service_bus_queue_trigger(
    arg_name="msgs",
    queue_name="%BATCH_QUEUE%",
    connection="ServiceBusConnection",
    cardinality=func.Cardinality.MANY,
)
# typing.List, as the library's samples write it: its converter accepts typing.List[...]
# and refuses the builtin list[...] (the worker then refuses the function at load).
def on_batch(msgs: typing.List[func.ServiceBusMessage]) -> None:  # noqa: UP006
    bodies = [json.loads(m.get_body()) for m in msgs]
    record(
        "batch",
        size=len(msgs),
        message_ids=[m.message_id for m in msgs],
        delivery_counts=[m.delivery_count for m in msgs],
    )
    if any(b.get("fail") for b in bodies):
        raise RuntimeError("a message of the batch asked to fail")


@app.service_bus_topic_trigger(
    arg_name="msgs",
    topic_name="%TOPIC_NAME%",
    subscription_name="%BATCH_SUBSCRIPTION%",
    connection="ServiceBusConnection",
    cardinality="many",
)
def on_topic_batch(
    msgs: list[ServiceBusReceivedMessage], message_actions: ServiceBusMessageActions
) -> None:
    kept = []
    for m in msgs:
        body = json.loads(b"".join(m.body))
        if body.get("poison"):
            message_actions.deadletter(
                m, deadletter_reason="Poison", deadletter_error_description="in a batch"
            )
        else:
            kept.append(m.message_id)
    record("topic_batch", size=len(msgs), kept=kept)
