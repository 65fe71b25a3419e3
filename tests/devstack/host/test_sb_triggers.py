"""Topic-subscription, session and batch Service Bus triggers on the local host, against our
emulator through the real SDK. The app (`triggers_app/`) is written as the library's samples
are; the host runs it unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from .conftest import HostProcess, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

APP = Path(__file__).resolve().parent / "triggers_app"


@pytest.fixture(scope="module")
def broker(servicebus_emulator: Any) -> Iterator[Any]:
    emulator = servicebus_emulator.start(APP / "Config.json")
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def host(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    base = tmp_path_factory.mktemp("triggers")
    (base / "out").mkdir()
    h = HostProcess(
        base / "hub",
        base / "out",
        {
            "ServiceBusConnection": broker.connection_string,
            "TRIGGERS_OUT": str(base / "out"),
            "TOPIC_NAME": "events",
            "SUBSCRIPTION_NAME": "eu",
            "BATCH_SUBSCRIPTION": "all-batched",
            "SESSION_QUEUE": "sessions",
            "BATCH_QUEUE": "batches",
        },
        "real",
        base / "host.log",
        app_dir=APP,
        hub="TriggersHub",
    )
    h.start()
    yield h
    h.stop()


def message(body: dict[str, Any], **kwargs: Any) -> ServiceBusMessage:
    return ServiceBusMessage(
        json.dumps(body), message_id=kwargs.pop("message_id", None) or uuid.uuid4().hex, **kwargs
    )


async def send(
    broker: Any,
    *,
    queue: str | None = None,
    topic: str | None = None,
    messages: list[ServiceBusMessage],
) -> None:
    async with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        sender = client.get_topic_sender(topic) if topic else client.get_queue_sender(queue)
        async with sender:
            await sender.send_messages(messages)


async def dead_letters(
    broker: Any,
    *,
    queue: str | None = None,
    topic: str | None = None,
    subscription: str | None = None,
) -> list[Any]:
    async with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        receiver = (
            client.get_subscription_receiver(
                topic, subscription, sub_queue=ServiceBusSubQueue.DEAD_LETTER
            )
            if topic
            else client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        )
        async with receiver:
            return list(await receiver.peek_messages(max_message_count=100))


def events(host: HostProcess, kind: str) -> list[dict[str, Any]]:
    return host.events(kind)


async def test_a_topic_trigger_gets_what_its_subscription_filters_in(
    broker: Any, host: HostProcess
) -> None:
    eu, us = uuid.uuid4().hex, uuid.uuid4().hex
    await send(
        broker,
        topic="events",
        messages=[
            message({"n": 1}, message_id=eu, application_properties={"region": "eu"}),
            message({"n": 2}, message_id=us, application_properties={"region": "us"}),
        ],
    )
    got = await wait_for(
        lambda: [e for e in events(host, "topic") if e["message_id"] == eu], what="the eu message"
    )
    assert got[0]["body"] == {"n": 1}
    assert got[0]["properties"] == {"region": "eu"}
    # The other subscription (all-batched) takes both; the eu one never sees the us message.
    await wait_for(
        lambda: {eu, us} <= {m for e in events(host, "topic_batch") for m in e["kept"]},
        what="both messages on the batched subscription",
    )
    assert not [e for e in events(host, "topic") if e["message_id"] == us]


async def test_a_failing_topic_function_is_retried_then_dead_lettered_on_its_subscription(
    broker: Any, host: HostProcess
) -> None:
    mid = uuid.uuid4().hex
    await send(
        broker,
        topic="events",
        messages=[message({"fail": True}, message_id=mid, application_properties={"region": "eu"})],
    )
    dead = await wait_for(
        lambda: _dead_ids(broker, topic="events", subscription="eu"),
        what="the dead letter",
        timeout=40,
    )
    assert mid in dead
    tries = [e["delivery_count"] for e in events(host, "topic_failed") if e["message_id"] == mid]
    # MaxDeliveryCount 2 on the subscription: two deliveries, counted from 1 as the
    # Functions host counts them
    assert tries == [1, 2]


async def _dead_ids(broker: Any, **entity: str) -> set[str]:
    return {m.message_id for m in await dead_letters(broker, **entity)}


async def test_sessions_run_in_order_one_message_at_a_time_and_keep_their_state(
    broker: Any, host: HostProcess
) -> None:
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    msgs = []
    for seq in range(1, 5):
        msgs.append(message({"seq": seq}, session_id=a))
        msgs.append(message({"seq": seq}, session_id=b))
    await send(broker, queue="sessions", messages=msgs)

    def done() -> bool:
        seen = events(host, "session")
        return all(len([e for e in seen if e["session"] == s]) == 4 for s in (a, b))

    await wait_for(done, what="both sessions' messages", timeout=40)
    for sid in (a, b):
        starts = [e for e in events(host, "session_start") if e["session"] == sid]
        ends = [e for e in events(host, "session") if e["session"] == sid]
        assert [e["seq"] for e in starts] == [1, 2, 3, 4]  # in order, each once
        # one at a time: each message starts after the previous one's function returned
        for prev_end, nxt in zip(ends, starts[1:], strict=False):
            assert nxt["t"] >= prev_end["t"]
        assert {e["renewed"] for e in ends} == {"Timestamp"}  # renew_session_lock's answer
        assert all(e["renewed_seconds"] > 0 for e in ends)

    # The state the function set is the session's: read it back once the host let go.
    async with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        for sid in (a, b):
            async with client.get_queue_receiver("sessions", session_id=sid, max_wait_time=15) as r:
                assert r.session is not None
                assert await r.session.get_state() == b"last=4"


async def test_a_session_outlives_its_lock_and_release_and_deadletter_work(
    broker: Any, host: HostProcess
) -> None:
    sid = f"slow-{uuid.uuid4().hex[:6]}"
    await send(
        broker,
        queue="sessions",
        messages=[
            message({"seq": 1, "sleep": 5}, session_id=sid),  # the queue's lock is 2 s
            message({"seq": 2, "release": True}, session_id=sid),
            message({"seq": 3, "deadletter": True}, session_id=sid),
            message({"seq": 4}, session_id=sid),
        ],
    )
    await wait_for(
        lambda: len([e for e in events(host, "session") if e["session"] == sid]) == 4,
        what="the slow session's messages",
        timeout=60,
    )
    starts = [e["seq"] for e in events(host, "session_start") if e["session"] == sid]
    assert starts == [1, 2, 3, 4]  # the slow one was not redelivered: its lock was kept
    dead = await dead_letters(broker, queue="sessions")
    mine = [m for m in dead if m.session_id == sid]
    assert [json.loads(b"".join(m.body))["seq"] for m in mine] == [3]
    assert mine[0].dead_letter_reason == "Refused"


async def test_a_batch_trigger_gets_the_messages_together(broker: Any, host: HostProcess) -> None:
    ids = [uuid.uuid4().hex for _ in range(7)]
    await send(
        broker,
        queue="batches",
        messages=[message({"i": i}, message_id=m) for i, m in enumerate(ids)],
    )
    await wait_for(
        lambda: set(ids) <= {m for e in events(host, "batch") for m in e["message_ids"]},
        what="the batch",
        timeout=40,
    )
    batches = [e for e in events(host, "batch") if set(e["message_ids"]) & set(ids)]
    assert sum(e["size"] for e in batches) == 7
    assert batches[0]["size"] >= 5  # host.json minMessageBatchSize 5: it waited for them

    few = [uuid.uuid4().hex for _ in range(2)]
    await send(
        broker,
        queue="batches",
        messages=[message({"i": i}, message_id=m) for i, m in enumerate(few)],
    )
    got = await wait_for(
        lambda: [e for e in events(host, "batch") if set(e["message_ids"]) & set(few)],
        what="the short batch",
        timeout=40,
    )
    # fewer than minMessageBatchSize: delivered together once maxBatchWaitTime passed
    assert sorted(got[0]["message_ids"]) == sorted(few)


async def test_a_failing_batch_is_abandoned_whole_then_dead_lettered(
    broker: Any, host: HostProcess
) -> None:
    ids = [uuid.uuid4().hex for _ in range(3)]
    bodies = [{"i": 0}, {"i": 1, "fail": True}, {"i": 2}]
    await send(
        broker,
        queue="batches",
        messages=[message(b, message_id=m) for b, m in zip(bodies, ids, strict=True)],
    )
    dead = await wait_for(
        lambda: _dead_ids(broker, queue="batches"), what="the dead letters", timeout=60
    )
    await wait_for(lambda: set(ids) <= dead if dead else False, what="all three dead-lettered")
    dead = await _dead_ids(broker, queue="batches")
    assert set(ids) <= dead
    counts = sorted(
        c
        for e in events(host, "batch")
        for m, c in zip(e["message_ids"], e["delivery_counts"], strict=True)
        if m in ids
    )
    # each delivered MaxDeliveryCount (2) times, as one batch each time
    assert len(counts) == 6
    assert counts == [1, 1, 1, 2, 2, 2]


async def test_a_batch_of_sdk_messages_settles_one_through_the_message_actions(
    broker: Any, host: HostProcess
) -> None:
    ids = [uuid.uuid4().hex for _ in range(3)]
    bodies = [{"i": 0}, {"i": 1, "poison": True}, {"i": 2}]
    await send(
        broker,
        topic="events",
        messages=[message(b, message_id=m) for b, m in zip(bodies, ids, strict=True)],
    )
    await wait_for(
        lambda: {ids[0], ids[2]} <= {m for e in events(host, "topic_batch") for m in e["kept"]},
        what="the kept messages",
        timeout=40,
    )
    dead = await dead_letters(broker, topic="events", subscription="all-batched")
    assert [m.message_id for m in dead if m.message_id in ids] == [ids[1]]
    assert [m.dead_letter_reason for m in dead if m.message_id in ids] == ["Poison"]


@pytest.mark.parametrize(
    ("queue", "sessions"),
    [("batches", True), ("sessions", False)],
    ids=["sessions-on-a-plain-queue", "plain-on-a-session-queue"],
)
def test_a_session_setting_the_queue_does_not_have_is_one_line_at_start(
    broker: Any, tmp_path: Path, queue: str, sessions: bool
) -> None:
    (tmp_path / "function_app.py").write_text(
        "import azure.functions as func\n"
        "app = func.FunctionApp()\n"
        f"@app.service_bus_queue_trigger(arg_name='msg', queue_name='{queue}',"
        f" connection='ServiceBusConnection', is_sessions_enabled={sessions})\n"
        "def f(msg: func.ServiceBusMessage) -> None:\n"
        "    pass\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devstack.host",
            "--app-dir",
            str(tmp_path),
            "--data-dir",
            str(tmp_path / "hub"),
        ],
        cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "ServiceBusConnection": broker.connection_string},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("devstack.host:")]
    assert len(errors) == 1, result.stderr
    assert f"function f: cannot open Service Bus queue '{queue}'" in errors[0]
    assert "Traceback" not in result.stderr
