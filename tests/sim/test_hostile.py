"""The hostile sender in the simulation (sim/hostile.py, ADR 017e): forged
replies and requests on the internal queues change nothing and raise one
alert each, and the checks that say so can fail."""

from __future__ import annotations

import json
from collections import Counter

from sim.hostile import REPLY_KINDS, REQUEST_KINDS
from sim.system import Options, Simulation, simulate
from sim.world import FaultConfig


def _run(seed: int, options: Options) -> Simulation:
    return simulate(Simulation(seed, options.orders, options=options))


def _hostile(seed: int, count: int = 20, **faults) -> Simulation:
    return _run(seed, Options(orders=3, faults=FaultConfig(hostile=count, **faults)))


def test_every_forgery_is_refused_with_one_alert_and_every_order_still_ends_as_it_would():
    kinds: Counter[str] = Counter()
    for seed in range(1, 6):
        sim = _hostile(seed)
        assert sim.violations == [], seed
        assert sim.hostile is not None
        kinds.update(kind for _, kind in sim.hostile.forged.values())
        states = {sim.state_c.docs[(o, o)]["ProcessState"] for o in sim.order_ids}
        assert states == {"Processed"}, seed  # no fault but the forgeries: all Processed
        reasons = Counter(
            m.dead_letter_reason
            for q in ("agent-requests", "agent-responses")
            for m in sim.bus.queue(q).dead
        )
        assert sum(reasons.values()) == len(sim.hostile.forged)
        assert set(reasons) <= {"ForgedRequest", "ForgedReply", "UnknownStep"}
        assert not any(token == 999 for _, _, token, _ in sim.remote.calls)
        # No effect beyond the three real steps of each order.
        assert sum(sim.remote.ledger.effects.values()) == 3 * 3
    assert set(kinds) == set(REPLY_KINDS) | set(REQUEST_KINDS)


def test_forgeries_among_faults_and_declines_change_nothing():
    """The issue's case: a forged ok for an order whose payment is really
    declined; with crashes, duplicates and lock expiries as well."""
    for seed in range(10, 14):
        sim = _hostile(
            seed, 30, decline=1.0, crash=0.01, duplicate=0.2, lock_expiry=0.2, send_fail=0.05
        )
        assert sim.violations == [], (seed, sim.violations)
        for oid in sim.order_ids:
            assert sim.state_c.docs[(oid, oid)]["ProcessState"] != "Processed", oid


def test_the_hostile_checks_can_fail(monkeypatch):
    """Break verification, and the invariant fires; drop an alert, and it fires."""
    import agents.messaging
    import orchestrators.reply_bridge

    monkeypatch.setattr(agents.messaging, "check_request", lambda keys, request: None)
    monkeypatch.setattr(orchestrators.reply_bridge, "check_scheduler_reply", lambda k, r: None)
    broken = _hostile(3, 30)
    checks = {c for c, _ in broken.violations}
    assert "forged message changes nothing" in checks
    assert "forged message refused" in checks

    monkeypatch.undo()
    sim = _hostile(3, 5)
    assert sim.violations == []
    alerts = sim.bus.queue("alerts")
    alerts.sent = [m for m in alerts.sent if "forged/" not in json.loads(m.body)["MessageId"]]
    sim.check()
    assert "forged message alerted once" in {c for c, _ in sim.violations}


def test_a_forgery_no_handler_ever_judged_owes_no_alert_of_its_own():
    """Seed 11001128 (one order, 20 forgeries): forged/10's five deliveries
    to the standalone workers all ended in faults (four receives whose
    answer was lost with the message locked, one lock lost 0.7 s after the
    receive), so Service Bus dead-lettered it MaxDeliveryCountExceeded and
    no handler ever judged it: the platform's dead-letter rule reports it,
    as for any message the broker ends. No alert is owed then, and one (a
    handler that alerted and whose dead-lettering then faulted) is still
    the one; a delivery that ended unfaulted owes the handler's alert."""
    sim = _hostile(3, 5)
    assert sim.violations == []
    assert sim.hostile is not None
    alerts = sim.bus.queue("alerts")
    counted = {
        json.loads(body).get("MessageId") for c in sim.alert_ledger.values() for _, body in c
    }
    mid, (queue, _) = next(
        (mid, where)
        for mid, where in sorted(sim.hostile.forged.items())
        if mid not in counted  # alerted in a message of its own, not in an aggregate
    )
    alerts.sent = [m for m in alerts.sent if json.loads(m.body).get("MessageId") != mid]
    (dead,) = [m for m in sim.bus.queue(queue).dead if m.message_id == mid]
    dead.dead_letter_reason = "MaxDeliveryCountExceeded"
    dead.delivery_count = 5
    sim.bus.faulted[mid] = {1, 2, 3, 4}

    def checks() -> set[str]:
        sim.violations.clear()
        sim.check()
        return {c for c, _ in sim.violations}

    assert "forged message alerted once" in checks()  # one delivery ended unfaulted
    sim.bus.faulted[mid].add(5)
    assert "forged message alerted once" not in checks()
