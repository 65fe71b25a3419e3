"""Two shards, locally (docs/adr/020e-task-hub-shards.md): two whole stacks,
each a local host on its own task hub (TASKHUB_NAME OrderProcessingS0 and
OrderProcessingS1) with its own Service Bus emulator and Cosmos server, both
calling one remote service as every shard in Azure calls the same remote
services. Orders go to the shard `domain.shards.shard_of` names; each runs in
its own shard's hub only and ends Processed; one sent to the wrong shard is
dead-lettered there (WrongShard, nothing written) and its dead letter's body,
sent to its shard, is processed; a genuine reply of shard 0 that arrives at
shard 1's reply bridge changes nothing there (shard 1 holds other keys) and
shard 0's order still ends Processed."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode

from devstack.invariants import INGRESS_QUEUE
from devstack.stack import Stack
from domain.ids import agent_reply_message_id, order_key, reply_event_name
from domain.models import AgentReply, ProcessState
from domain.shards import shard_of
from domain.signing import (
    REPLY_TOKEN,
    SchedulerKeys,
    _identity,
    check_scheduler_reply,
    parse_keys,
    sign_reply,
)
from tests.e2e.conftest import E2E, E2E_SETTINGS

pytestmark = [pytest.mark.timeout(600)]

SHARDS = 2


def shard_settings(index: int) -> dict[str, str]:
    return {
        **E2E_SETTINGS,
        "SHARD_COUNT": str(SHARDS),
        "SHARD_INDEX": str(index),
        "TASKHUB_NAME": f"OrderProcessingS{index}",
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Stack]:
    with ExitStack() as stacks:
        first = stacks.enter_context(
            Stack(Path(tmp_path_factory.mktemp("shard0")), overrides=shard_settings(0))
        )
        remote = first.settings["REMOTE_SERVICE_URL"]
        second = stacks.enter_context(
            Stack(
                Path(tmp_path_factory.mktemp("shard1")),
                overrides={**shard_settings(1), "REMOTE_SERVICE_URL": remote},
            )
        )
        yield [first, second]


def hub_instances(stack: Stack) -> dict[str, str]:
    """instance id -> runtime status, from the shard's own task hub."""
    hub = stack.settings["TASKHUB_NAME"]
    with sqlite3.connect(stack.run_dir / "host" / f"{hub}.sqlite") as db:
        return dict(db.execute("SELECT instance_id, status FROM instances").fetchall())


async def receive_all(e2e: E2E, queue: str, want: int, timeout: float = 60) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    async with e2e.bus.get_queue_receiver(
        queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        while len(out) < want and time.monotonic() < deadline:
            out.extend(await receiver.receive_messages(max_message_count=50, max_wait_time=1))
    return out


async def test_each_order_runs_in_its_own_shards_hub_and_ends_processed(shards):
    async with E2E(shards[0]) as one, E2E(shards[1]) as two:
        e2e = [one, two]
        two.prefix = one.prefix  # one order set, split by shard
        # Five orders of each shard, from a generated set: ten orders alone fall on
        # one shard in one run in 512 (CI on f594793 met it).
        shard = lambda o: shard_of(o.AppId, o.OrderID, SHARDS)  # noqa: E731
        candidates = one.orders(60)
        orders = [o for o in candidates if shard(o) == 0][:5]
        orders += [o for o in candidates if shard(o) == 1][:5]
        owner = {o.OrderID: shard(o) for o in orders}
        assert sorted(owner.values()) == [0] * 5 + [1] * 5, "five orders of each shard"
        # One order of shard 1 is sent to shard 0 first: refused there.
        stray = next(o for o in orders if owner[o.OrderID] == 1)
        await one.post([stray])
        dead = await receive_all(one, f"{INGRESS_QUEUE}/$deadletterqueue", 1)
        assert [m.dead_letter_reason for m in dead] == ["WrongShard"]
        assert "belongs to shard 1 of 2" in dead[0].dead_letter_error_description
        assert await one.store.count_in_state("Pending") == 0
        # Its dead letter's body, unchanged, to the shard it names; the others to theirs.
        async with two.bus.get_queue_sender(INGRESS_QUEUE) as sender:
            await sender.send_messages(ServiceBusMessage(b"".join(dead[0].body)))
        for index in (0, 1):
            await e2e[index].post(
                [o for o in orders if owner[o.OrderID] == index and o is not stray]
            )

        ids = [{oid for oid, s in owner.items() if s == index} for index in (0, 1)]
        records = await asyncio.gather(*(e2e[i].wait_terminal(ids[i], 180) for i in (0, 1)))
        for index in (0, 1):
            # every order of this shard Processed here, and no other order has a record here
            assert set(records[index]) == ids[index]
            assert {r.ProcessState for r in records[index].values()} == {ProcessState.PROCESSED}
            instances = hub_instances(shards[index])
            for oid in owner:
                ran_here = [i for i in instances if i.startswith(order_key("webshop", oid) + ":")]
                if owner[oid] == index:
                    assert ran_here, f"{oid} has no instance in shard {index}'s hub"
                    assert {instances[i] for i in ran_here} == {"Completed"}
                else:
                    assert ran_here == [], f"{oid} of another shard ran in shard {index}'s hub"
            assert await e2e[index].check(ids[index]) == []


async def test_a_reply_at_the_other_shards_bridge_changes_nothing_there(shards):
    """Shard 0's own Scheduler and agents answer a step; a copy of that genuine
    reply (signed with shard 0's keys) is sent to shard 1's `agent-responses`:
    shard 1 dead-letters it ForgedReply, raises nothing, and shard 0's order
    ends Processed."""
    async with E2E(shards[0]) as one, E2E(shards[1]) as two:
        two.prefix = one.prefix
        order = next(o for o in one.orders(20) if shard_of(o.AppId, o.OrderID, SHARDS) == 0)
        await one.post([order])
        records = await one.wait_terminal({order.OrderID}, 120)
        assert records[order.OrderID].ProcessState is ProcessState.PROCESSED
        record = records[order.OrderID]
        # A reply shard 0's agent sent and shard 0's bridge raised: the
        # EventRaised (type 15) in shard 0's hub holds its answer, without its
        # seal or identity (orchestrators.contracts.event_payload, ADR 021h):
        # the instance and the event's name say those.
        key = order_key("webshop", order.OrderID)
        instance = f"{key}:{record.Attempt}"
        history = one.stack.run_dir / "host" / f"{one.stack.settings['TASKHUB_NAME']}.sqlite"
        with sqlite3.connect(history) as db:
            raised = [
                json.loads(row[0])
                for row in db.execute(
                    "SELECT event FROM history WHERE instance_id = ? "
                    "AND json_extract(event, '$.EventType') = 15",
                    (instance,),
                )
            ]
        assert raised, "shard 0's hub shows no raised reply for its order"
        answer = raised[0]["Input"]  # the event's data: JSON text, as the bridge raised it
        while isinstance(answer, str):
            answer = json.loads(answer)
        (step,) = [
            s for s in record.Steps if reply_event_name(s, record.Attempt) == raised[0]["Name"]
        ]
        assert "InstanceId" not in answer
        assert answer["Outcome"] == "ok"
        # The reply shard 0's agent sent, sealed again as it sealed it (shard
        # 0's token and agent keys): a reply genuine in shard 0, as its bridge checks.
        reply = AgentReply(
            InstanceId=instance,
            OrderID=key,
            Step=step,
            Attempt=record.Attempt,
            AppId="webshop",
            EventName=raised[0]["Name"],
            EventId=agent_reply_message_id(instance, raised[0]["Name"]),
            **answer,
        )
        genuine = _sealed_in(one.stack, reply)
        keys = _keys_of(one.stack)
        assert check_scheduler_reply(keys, genuine) is None
        assert check_scheduler_reply(_keys_of(two.stack), genuine) is not None
        body = genuine.model_dump_json(exclude_none=True)
        async with two.bus.get_queue_sender("agent-responses") as sender:
            await sender.send_messages(ServiceBusMessage(body, message_id=f"{key}/copied"))
        dead = await receive_all(two, "agent-responses/$deadletterqueue", 1)
        assert [m.dead_letter_reason for m in dead] == ["ForgedReply"], [
            m.dead_letter_error_description for m in dead
        ]
        assert not [i for i in hub_instances(two.stack) if i.startswith(key + ":")]
        assert await two.store.count_in_state("Processing") == 0
        assert await one.check({order.OrderID}) == []


def _keys_of(stack: Stack) -> SchedulerKeys:
    return SchedulerKeys(
        tokens=parse_keys(stack.settings["REPLY_TOKEN_KEYS"]),
        agents=parse_keys(stack.settings["AGENT_SIGNING_KEYS"]),
    )


def _sealed_in(stack: Stack, reply: AgentReply) -> AgentReply:
    """`reply` with the token shard `stack`'s Scheduler gives the request it
    answers and the signature its agents put on it."""
    keys = _keys_of(stack)
    token = keys.tokens.prove(
        REPLY_TOKEN,
        _identity(
            reply.AppId,
            reply.InstanceId,
            reply.OrderID,
            reply.Step,
            reply.Action,
            reply.Attempt,
            reply.EventName,
        ),
    )
    return sign_reply(keys.agents, reply.model_copy(update={"ReplyToken": token}))
