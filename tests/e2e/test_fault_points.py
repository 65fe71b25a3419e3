"""Fault tests through the local host: a process killed at each step boundary,
a timer pending across a host kill, a side effect whose answer is lost, and a
late reply from a timed-out attempt. Each checks the invariants of DESIGN.md §7."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from azure.servicebus import ServiceBusMessage

from domain.codec import encode
from domain.ids import order_key, reply_event_name
from domain.models import AgentReply, AgentRequest, ProcessState, ReplyOutcome, StepStatus
from domain.signing import reply_token, sign_reply
from tests.e2e.conftest import E2E, E2E_SETTINGS

pytestmark = [pytest.mark.timeout(300)]


async def test_happy_path_through_both_agent_paths(stack):
    async with E2E(stack) as e2e:
        orders = e2e.orders(3)
        await e2e.post(orders)
        ids = {o.OrderID for o in orders}
        records = await e2e.wait_terminal(ids)
        assert {r.ProcessState for r in records.values()} == {ProcessState.PROCESSED}
        assert await e2e.check(ids) == []
        # Workflow 2.0: webshop has not opted in to progress statuses
        # (docs/adr/004-lean-workflow.md), so it gets Received and Processed only.
        assert {tuple(v) for v in (e2e.observed.replies[i] for i in ids)} == {
            ("Received", "Processed")
        }


async def test_starter_killed_between_claim_and_start(stack):
    async with E2E(stack) as e2e:
        e2e.host_with_crash_points("starter.after_claim")
        orders = e2e.orders(2)
        await e2e.post(orders)
        ids = {o.OrderID for o in orders}
        records = await e2e.wait_terminal(ids, timeout=150)
        assert e2e.crashed("starter.after_claim")
        # the claimed-but-never-started attempt was recovered by the Supervisor
        assert max(r.Attempt for r in records.values()) >= 2
        assert {r.ProcessState for r in records.values()} == {ProcessState.PROCESSED}
        assert await e2e.check(ids) == []


async def test_starter_killed_between_the_start_and_the_first_request(stack):
    """ADR 021l: the attempt started, but the request of its first step, the
    Starter's to send, never left. The attempt waits out its deadline and the
    Supervisor retries it."""
    async with E2E(stack) as e2e:
        e2e.host_with_crash_points("starter.after_start")
        orders = e2e.orders(2)
        await e2e.post(orders)
        ids = {o.OrderID for o in orders}
        records = await e2e.wait_terminal(ids, timeout=150)
        assert e2e.crashed("starter.after_start")
        assert max(r.Attempt for r in records.values()) >= 2
        assert {r.ProcessState for r in records.values()} == {ProcessState.PROCESSED}
        assert await e2e.check(ids) == []


async def test_host_killed_after_sending_an_agent_request(stack):
    async with E2E(stack) as e2e:
        e2e.host_with_crash_points("workflow.after_send")
        orders = e2e.orders(2)
        await e2e.post(orders)
        ids = {o.OrderID for o in orders}
        records = await e2e.wait_terminal(ids, timeout=150)
        assert e2e.crashed("workflow.after_send")
        assert {r.ProcessState for r in records.values()} == {ProcessState.PROCESSED}
        assert await e2e.check(ids) == []


async def test_agent_loses_the_answer_after_the_side_effect(stack):
    async with E2E(stack) as e2e:
        orders = e2e.orders(1)
        oid = orders[0].OrderID
        await e2e.fault(
            kind="crash",
            service="inventory",
            operation="reserve",
            order_id=oid,
            count=1,
            mode="drop",
        )
        await e2e.post(orders)
        records = await e2e.wait_terminal({oid})
        assert records[oid].ProcessState is ProcessState.PROCESSED
        assert await e2e.check({oid}) == []
        effects = [
            r
            for r in e2e.observed.side_effects["effects"]
            if r["order_id"] == order_key("webshop", oid)
        ]
        assert {(r["step"], r["count"]) for r in effects} == {
            ("reserve-inventory", 1),
            ("charge-payment", 1),
            ("arrange-shipment", 1),
        }


async def test_reply_bridge_killed_after_raising_the_event(stack):
    async with E2E(stack) as e2e:
        e2e.host_with_crash_points("bridge.after_raise")
        orders = e2e.orders(1)
        oid = orders[0].OrderID
        await e2e.post(orders)
        records = await e2e.wait_terminal({oid}, timeout=150)
        assert e2e.crashed("bridge.after_raise")
        assert records[oid].ProcessState is ProcessState.PROCESSED
        assert await e2e.check({oid}) == []


async def test_host_killed_while_a_step_timer_is_pending(stack):
    async with E2E(stack) as e2e:
        e2e.host_with_crash_points()
        orders = e2e.orders(1)
        oid = orders[0].OrderID
        # payment is down longer than a step deadline: the timer will win
        await e2e.fault(kind="outage", service="payment", operation="charge", seconds=20)
        await e2e.post(orders)
        await e2e.wait_for(
            lambda rs: oid in rs and rs[oid].Steps["charge-payment"].Status is StepStatus.RUNNING,
            what="charge-payment running",
        )
        e2e.stack.servers["host"].kill()
        e2e.host_with_crash_points()
        records = await e2e.wait_terminal({oid}, timeout=200)
        assert records[oid].ProcessState is ProcessState.PROCESSED
        assert records[oid].FailureCount >= 1  # the timed-out attempt was counted
        assert await e2e.check({oid}) == []


def token_of(keys, reply: AgentReply) -> str:
    """The token the Scheduler gave the request `reply` answers."""
    request = AgentRequest(
        InstanceId=reply.InstanceId,
        OrderID=reply.OrderID,
        Step=reply.Step,
        Action=reply.Action,
        Attempt=reply.Attempt,
        AppId=reply.AppId,
        IdempotencyKey=f"{reply.OrderID}/{reply.Step}",
        FencingToken=reply.Attempt,
        Deadline=datetime.now(UTC),
        ReplyEvent=reply.EventName,
    )
    return reply_token(keys.tokens, request)


async def test_late_reply_from_attempt_one_changes_nothing(stack):
    async with E2E(stack) as e2e:
        e2e.host_with_crash_points()
        orders = e2e.orders(1)
        oid = orders[0].OrderID
        # attempt 1 cannot reserve before its deadline (its one deadline: a step
        # timeout per step, ADR 021a); the Supervisor starts attempt 2, whose
        # deadline outlasts the outage
        steps, step_timeout = 3, int(E2E_SETTINGS["STEP_TIMEOUT_SECONDS"])
        outage = steps * step_timeout + 12
        await e2e.fault(kind="outage", service="inventory", operation="reserve", seconds=outage)
        await e2e.post(orders)
        await e2e.wait_for(
            lambda rs: oid in rs and rs[oid].Attempt >= 2, timeout=90, what="attempt 2"
        )
        # now attempt 1's reply turns up, claiming success: a genuine one,
        # with its request's token and an agent's signature (ADR 017e)
        keys = e2e.settings.scheduler_keys()
        key = order_key("webshop", oid)
        late = AgentReply(
            InstanceId=f"{key}:1",
            OrderID=key,
            Step="reserve-inventory",
            Attempt=1,
            AppId="webshop",
            EventName=reply_event_name("reserve-inventory", 1),
            EventId=f"{key}:1/late",
            Outcome=ReplyOutcome.OK,
            Result={"Reference": "from-attempt-1"},
        )
        token = token_of(keys, late)
        late = sign_reply(keys.agents, late.model_copy(update={"ReplyToken": token}))
        async with e2e.bus.get_queue_sender("agent-responses") as sender:
            await sender.send_messages(ServiceBusMessage(encode(late), message_id=f"{key}:1/late"))
        records = await e2e.wait_terminal({oid}, timeout=200)
        record = records[oid]
        assert record.ProcessState is ProcessState.PROCESSED
        assert record.Attempt >= 2
        assert record.Steps["reserve-inventory"].Reference != "from-attempt-1"
        assert await e2e.check({oid}) == []
        assert f"late reply for {key}:1" in e2e.host_log()
        effects = [
            r
            for r in e2e.observed.side_effects["effects"]
            if r["order_id"] == order_key("webshop", oid)
        ]
        assert ("reserve-inventory", 1) in {(r["step"], r["count"]) for r in effects}
