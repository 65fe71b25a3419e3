"""The checks added for mutants of sim/mutants.json that first survived: an agent's
call outlasting its request's deadline, a call made again after its service
refused it, an agent request completed with no reply naming it, a refusing
reply queue never alerted, and a same-data resend whose amounts are written
another way. Each fires on what it is there for and stays quiet on its
legitimate neighbour."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from types import SimpleNamespace

from agents.ports import RemoteCall
from domain.codec import decode
from domain.models import OrderSubmitted
from orchestrators.starter import STATUS_ALERT_AFTER
from sim.system import INGRESS_OF, Simulation
from tests.sim.test_check_premises import _run as _run_seed

CALL = RemoteCall("payment", "charge", "webshop:ORD-1-0/charge-payment", 1, {})


def _run() -> Simulation:
    return _run_seed(1, 1)


def _in_request(sim: Simulation, limit: datetime, body: Callable[[], None]) -> None:
    """Run `body()` in a task handling an agent request whose calls may start
    until `limit` (as Simulation._agent_request sets it up)."""

    async def run() -> None:
        task = asyncio.current_task()
        sim._request_limit[task] = limit
        try:
            body()
        finally:
            sim._request_limit.pop(task, None)
            sim._refused_here.pop(task, None)

    asyncio.new_event_loop().run_until_complete(run())


def test_a_call_whose_timeout_runs_past_its_requests_deadline_is_caught():
    """Mutant `agent-call-timeout-uncapped`: the call's timeout not capped by
    the time left keeps the agent waiting past its stop time."""
    sim = _run()
    now = sim.world.clock.now
    _in_request(sim, now + timedelta(seconds=10), lambda: sim._on_remote_call(CALL, 8.0))
    assert sim.long_calls == []
    _in_request(sim, now + timedelta(seconds=10), lambda: sim._on_remote_call(CALL, 10.0))
    assert sim.long_calls == []  # ends at the deadline: the margin is the agent's
    _in_request(sim, now + timedelta(seconds=3), lambda: sim._on_remote_call(CALL, 10.0))
    assert len(sim.long_calls) == 1


def test_a_call_made_again_after_its_service_refused_it_is_caught():
    """Mutant `agent-permanent-retried`: a decline (a 4xx) retried within the
    same delivery. A 429 or a 408 is asked again; another delivery starts over."""
    sim = _run()
    limit = sim.world.clock.now + timedelta(seconds=30)

    def paced_then_refused() -> None:
        sim._on_remote_call(CALL, 5.0)
        sim._on_remote_answer(CALL, 429)
        sim._on_remote_call(CALL, 5.0)
        sim._on_remote_answer(CALL, 402)

    _in_request(sim, limit, paced_then_refused)
    assert sim.retried_refusals == []
    _in_request(sim, limit, lambda: sim._on_remote_call(CALL, 5.0))  # a redelivery
    assert sim.retried_refusals == []

    def refused_then_again() -> None:
        sim._on_remote_call(CALL, 5.0)
        sim._on_remote_answer(CALL, 402)
        sim._on_remote_call(CALL, 5.0)

    _in_request(sim, limit, refused_then_again)
    assert len(sim.retried_refusals) == 1


def test_a_request_completed_with_no_reply_naming_it_is_caught():
    """Mutants `agent-reply-unsent-completed` (completed though its reply's
    send failed) and `agent-reply-id-per-step` (its reply dropped as a
    duplicate of another request's, under an id that does not name it)."""
    sim = _run()
    iid = "webshop:ORD-1-0:7"
    request = {"InstanceId": iid, "ReplyEvent": "reply-charge-payment-undo-0-7"}
    delivery = SimpleNamespace(body=json.dumps(request).encode(), message_id="req")
    sim._check_answered(delivery)
    assert len(sim.unanswered) == 1
    sim.unanswered.clear()
    # Another request's reply under the id this one's would have had.
    do_reply = {"InstanceId": iid, "EventName": "reply-charge-payment-7"}
    sim.bus.send("agent-responses", json.dumps(do_reply).encode(), "same-id")
    sim._check_answered(delivery)
    assert len(sim.unanswered) == 1
    sim.unanswered.clear()
    undo_reply = {"InstanceId": iid, "EventName": "reply-charge-payment-undo-0-7"}
    sim.bus.send("agent-responses", json.dumps(undo_reply).encode(), "its-own-id")
    sim._check_answered(delivery)
    assert sim.unanswered == []


def test_a_refusing_reply_queue_with_no_status_undeliverable_alert_is_caught():
    """Mutant `starter-undeliverable-never-counted`: a Starter that refused
    sends for hours and never alerted."""
    sim = _run()
    queue = "replies-webshop"
    start = sim.world.clock.now
    until = start + timedelta(hours=1)
    sim.world.faults.refusing = {queue: (start, until, "disabled")}
    sim.starter_spans = {1: [start, until]}
    below = STATUS_ALERT_AFTER - 1 + len(sim.order_ids)
    sim.starter_refused = {queue: [start] * below}
    sim.violations.clear()
    sim.check_refusing_queue_alerted()
    assert sim.violations == []  # too few refusals to owe an alert
    sim.starter_refused = {queue: [start] * (below + 1)}
    sim.check_refusing_queue_alerted()
    assert [c for c, _ in sim.violations] == ["a refusing reply queue is alerted"]
    sim.violations.clear()
    alert = {"Kind": "StatusUndeliverable", "Queue": queue, "OrderID": None}
    sim.bus.send("alerts", json.dumps(alert).encode(), "status-undeliverable/x")
    sim.check_refusing_queue_alerted()
    assert sim.violations == []


def test_a_same_data_resend_writes_its_amounts_another_way():
    """Mutant `amount-canonical-unformatted`: Submit must take "20.0" for
    "20.00"; the client's same-data resend writes them so."""
    sim = _run()
    key = sim.order_ids[0]
    app, own = sim.orders[key]
    sim._resend(key, changed=False)
    sent = [m for m in sim.bus.queue(INGRESS_OF[app]).sent if m.message_id == f"{own}/resend"]
    body = sent[-1].body
    assert body != sim._order_body(key)
    assert json.loads(body)["Total"] == "20.0"
    original = decode(OrderSubmitted, sim._order_body(key))
    assert decode(OrderSubmitted, body).digest() == original.digest()
