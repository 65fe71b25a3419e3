"""The foreign-senders world (a registered application naming the other's
reply queue, a client writing lax JSON types, an insider holding the agents'
signing key) and the long refusals (the alerts queue for minutes, a provider
throttling the tenant, the agents' reply queue full while a worker runs),
drawn from streams of their own and absent from the worlds older regression
seeds replay; and the checks they feed, each firing on what it guards and
quiet on its legitimate neighbour."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace

from agents.ports import RemoteCall
from sim.corpus import world_of
from sim.message_checks import BAD_ALERT
from sim.system import INGRESS_OF, options_for
from tests.sim.test_check_premises import _run

CALL = RemoteCall("payment", "charge", "webshop:ORD-1-0/charge-payment", 1, {})


def test_the_new_worlds_come_from_streams_of_their_own_and_only_for_new_seeds():
    drawn = {seed: options_for(seed, 3) for seed in range(1, 201)}
    for seed, o in drawn.items():
        without = options_for(seed, 3, foreign_senders=False, long_refusals=False)
        f = replace(
            o.faults,
            refusing_alerts="",
            refusing_alerts_seconds=0.0,
            tenant_throttle=0.0,
            replies_full_in_worker=0.0,
        )
        # Every other draw of the seed is what it was.
        assert replace(o, faults=f, reply_thief=False, lax_client=False, insider_replies=0) == (
            without
        )
    assert 40 <= sum(o.reply_thief for o in drawn.values()) <= 100
    assert 40 <= sum(o.lax_client for o in drawn.values()) <= 100
    assert 50 <= sum(1 for o in drawn.values() if o.insider_replies) <= 120
    assert 20 <= sum(1 for o in drawn.values() if o.faults.refusing_alerts) <= 60
    assert 15 <= sum(1 for o in drawn.values() if o.faults.tenant_throttle) <= 60
    assert 5 <= sum(1 for o in drawn.values() if o.faults.replies_full_in_worker) <= 50
    # A regression entry recorded before them replays without them.
    assert world_of({})["foreign_senders"] is False
    assert world_of({})["long_refusals"] is False
    assert options_for(1, 3, wider=False).insider_replies == 0


def test_the_foreign_senders_messages_are_judged_as_bad_submissions():
    """The reply thief's order (another application's reply queue) and the lax
    client's ("2" for a Quantity) are bad submissions of their own orders,
    each with the alert of its refusal."""
    seed = next(s for s in range(1, 100) if options_for(s, 3).reply_thief)
    o = options_for(seed, 3)
    sim = _run(seed, 3)
    sim.o = replace(sim.o, reply_thief=True, lax_client=True)
    sim.bad.clear()
    sim._foreign_senders()
    kinds = {kind: mid for mid, kind in sim.bad.items()}
    assert set(kinds) == {"reply-queue", "lax-typed"}
    assert BAD_ALERT["reply-queue"] == "ReplyQueueNotAllowed"
    assert BAD_ALERT["lax-typed"] == "InvalidMessage"
    assert o.reply_thief


def _in_task(body):
    async def run():
        return body()

    return asyncio.new_event_loop().run_until_complete(run())


def test_a_failed_call_the_breaker_takes_for_a_success_is_caught():
    """Mutant `agent-timeout-counts-as-pacing`: a call left unanswered for the
    whole call timeout taken for pacing. A call our deadline cut short (a
    shorter timeout) is pacing; a 429 is pacing; a 5xx is a failure."""
    sim = _run(1, 1)

    def verdict(status, timeout, counted) -> None:
        sim._on_remote_outcome(CALL, status, timeout, 0)
        sim._on_breaker("payment", counted)

    _in_task(lambda: verdict(None, 10.0, True))
    _in_task(lambda: verdict(None, 4.0, False))
    _in_task(lambda: verdict(429, 10.0, False))
    assert sim.uncounted_failures == []
    _in_task(lambda: verdict(None, 10.0, False))
    _in_task(lambda: verdict(503, 10.0, False))
    assert len(sim.uncounted_failures) == 2

    def stale() -> None:  # a second verdict in the task (its end): no call of its own
        sim._on_remote_outcome(CALL, None, 10.0, 0)
        sim._on_breaker("payment", True)
        sim._on_breaker("payment", False)

    _in_task(stale)
    assert len(sim.uncounted_failures) == 2


def test_a_request_given_up_right_after_a_429_with_time_left_is_caught():
    """Mutant `agent-stop-counts-pacing`: paced calls counted toward
    max_attempts. Given up right after a 429 whose next wait would pass the
    last start is the deadline's stop, and legitimate."""
    sim = _run(1, 1)
    now = sim.world.clock.now
    reply = json.dumps({"Error": "gave up after 8 calls within the deadline: HTTP 429"}).encode()

    def request(deadline_in: float) -> SimpleNamespace:
        body = {"Deadline": (now + timedelta(seconds=deadline_in)).isoformat()}
        return SimpleNamespace(body=json.dumps(body).encode(), message_id="req")

    def given_up(deadline_in: float, status: int = 429, error: bytes = reply) -> None:
        sim._on_remote_outcome(CALL, status, 10.0, 1)
        sim._check_pacing_not_given_up(request(deadline_in), error)

    _in_task(lambda: given_up(3.5))  # its next wait would pass its last start
    _in_task(lambda: given_up(40.0, status=503))  # a failure may end it
    deadline = json.dumps({"Error": "deadline reached after 3 calls"}).encode()
    _in_task(lambda: given_up(40.0, error=deadline))
    assert sim.paced_given_up == []
    _in_task(lambda: given_up(40.0))
    assert len(sim.paced_given_up) == 1


def test_an_abandon_on_the_last_delivery_is_caught():
    """Mutant `gate-last-delivery-never`: the count taken as 1-based, so the
    standalone worker (whose SDK counts from 0) never knows its last
    delivery and abandons it to the broker."""
    sim = _run(1, 1)
    d = SimpleNamespace(queue="agent-requests", message_id="req")
    sim._check_count_kept(d, 4, "abandon")
    sim._check_count_kept(d, 5, "dead_letter")
    sim._check_count_kept(
        SimpleNamespace(queue=next(iter(INGRESS_OF.values())), message_id="o"), 4, "abandon"
    )
    assert sim.count_run_out == []
    sim._check_count_kept(d, 5, "abandon")
    assert len(sim.count_run_out) == 1
