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
