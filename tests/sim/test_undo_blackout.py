"""N3's worst case in the simulation (ADR 019a): an undo blackout, an outage
that begins with a schedule's first undo call and outlasts the whole undo
budget, every call in it applied and its answer lost. The workflow (since
2.2) waits for a long retry and ends such compensations Compensated, not
CompensationFailed though the undo happened. And the checks that watch it
can fail."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sim.system import Options, Simulation, options_for, simulate
from sim.world import START, FaultConfig

# Every order declined (so every order compensates) and an undo blackout.
BLACKOUT = FaultConfig(decline=1.0, undo_blackout=True, crash=0.01, duplicate=0.05, delay=0.05)


def _run(seed: int) -> Simulation:
    return simulate(
        Simulation(seed, 3, options=Options(orders=3, faults=BLACKOUT, fault_window=240.0))
    )


def _blackout(sim: Simulation) -> tuple:
    (fault,) = [f for f in sim.world.faults.injected if f.kind == "undo_blackout"]
    assert sim.world.faults.outage is not None
    start, end, service = sim.world.faults.outage
    return fault, (end - start).total_seconds(), service


def test_an_undo_blackout_outlasts_the_undo_budget_and_loses_every_answer():
    sim = _run(2)
    _, length, service = _blackout(sim)
    assert length > 3 * sim.o.step_timeout.total_seconds()  # the whole undo budget
    assert sim.world.faults.outage_lost == 1.0
    # Every undo call to that service in the blackout was answered 504
    # (applied, its answer lost); the first call in it was an undo. (A
    # forward call the seed declines is still answered 402.)
    start, end, _ = sim.world.faults.outage
    inside = []
    for line in sim.world.trace:
        stamp, _, text = line.partition(" ")
        at = START + timedelta(seconds=float(stamp[2:]))
        if text.startswith(f"remote {service}/") and start <= at < end:
            inside.append(text)
    assert inside
    undo = ("release", "refund", "cancel")
    assert inside[0].split()[1].endswith(undo)
    assert {t.rsplit("-> ", 1)[1] for t in inside if t.split()[1].endswith(undo)} == {"504"}
    assert sim.violations == []


def test_the_workflow_waits_for_a_long_retry_and_compensates():
    """Seed 2 with the blackout (one that ended falsely CompensationFailed
    on workflow 2.1, before the long retry of an unconfirmed undo)."""
    sim = _run(2)
    assert sim.violations == []
    assert sim.rows["8d"] >= 1  # a compensation deferred for its long retry
    assert sim.rows["8b"] >= 1
    states = {oid: sim.state_c.docs[(oid, oid)]["ProcessState"] for oid in sim.order_ids}
    assert "CompensationFailed" not in {
        s
        for oid, s in states.items()
        if not any(
            c.get("Outcome") == "Failed"
            for c in sim.state_c.docs[(oid, oid)].get("Compensation") or []
        )
    }


def test_wide_schedules_draw_it_from_a_stream_of_their_own():
    drawn = [s for s in range(1, 401) if options_for(s, 3).faults.undo_blackout]
    assert 20 <= len(drawn) <= 60
    assert not any(options_for(s, 3, wider=False).faults.undo_blackout for s in drawn)
    # The draw moves no other option of the seed.
    a, b = options_for(drawn[0], 3), options_for(drawn[0], 3, wider=False)
    assert (a.faults.outage, a.faults.decline, a.scan) == (
        b.faults.outage,
        b.faults.decline,
        b.scan,
    )


def test_the_long_retry_checks_can_fail():
    sim = _run(2)
    key = sim.order_ids[0]
    doc = dict(sim.state_c.docs[(key, key)])
    waiting = {
        **doc,
        "ProcessState": "Compensating",
        "LockedBy": f"{key}:7",
        "NotBefore": (sim.world.clock.now + timedelta(seconds=60)).isoformat(),
    }
    sim._check_compensation_long_retry(waiting, {**waiting, "LockedBy": f"{key}:8"}, "starter")
    assert [c for c, _ in sim.violations] == ["a compensation's long retry waits for its time"]
    sim.violations.clear()
    bound = sim.settings.retry.undo_long_retries
    sim._check_compensation_long_retry(
        waiting, {**waiting, "CompensationLongRetries": bound + 1}, "activities"
    )
    assert [c for c, _ in sim.violations] == ["compensation long retries bounded"]


@pytest.mark.parametrize("outcome", ["Pending", "Failed"])
def test_a_compensation_failed_whose_open_undo_was_applied_is_caught(outcome):
    """The record says CompensationFailed with an undo open (Failed, or
    Pending: unconfirmed when the long retries ran out) that the remote
    applied, its answer lost or not: a false CompensationFailed."""
    sim = _run(2)
    compensated = [
        oid
        for oid in sim.order_ids
        if sim.state_c.docs[(oid, oid)]["ProcessState"] == "Compensated"
        and any(
            k.startswith(f"{oid}/") and k.split("|")[1].endswith(("release", "refund", "cancel"))
            for k in sim.remote.ledger.results
        )
    ]
    assert compensated
    oid = compensated[0]
    doc = sim.state_c.docs[(oid, oid)]
    undone = next(
        k.split("|")[0].split("/", 1)[1]
        for k in sim.remote.ledger.results
        if k.startswith(f"{oid}/") and k.split("|")[1].endswith(("release", "refund", "cancel"))
    )
    doc["ProcessState"] = "CompensationFailed"
    doc["Compensation"] = [
        {**c, "Outcome": outcome} if c["Step"] == undone else c for c in doc["Compensation"]
    ]
    sim.violations.clear()
    sim.check()
    assert "no false CompensationFailed" in {c for c, _ in sim.violations}
