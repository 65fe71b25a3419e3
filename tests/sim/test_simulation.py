"""The seeded simulation (sim/): determinism, the happy path, the regression
seeds of every schedule that ever failed, and a bulk run of 1,000 schedules.

Regression seeds whose defect is fixed (`"fixed": true` in sim/regressions.json)
run as plain cases and must stay clean; the others are strict xfails naming
the defect they show, so its fix turns them into an unexpected pass (then set
`"fixed": true`). Every entry runs the live workflow version (host.json's
defaultVersion): one that names the frozen version it was recorded on
replays on the live one, which must run it clean (sim.corpus.plain)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim import corpus
from sim.system import Options, Simulation, run_schedule, simulate
from sim.world import FaultConfig

REGRESSIONS = corpus.load()

# The check each defect of issue 11 breaks first (sim/checks.py, EndChecks.check).
DEFECT_OF_CHECK = {
    "index entry outlived its attempt unseen": "defect 1: recovery-index cursor passes entries at a minute rollover",
    "7 side effects undone by compensation": "defect 2: compensation skips Running/Failed steps",
    "permanent failure not retried": "defect 3: a long provider message fails the Failed write",
    "rejected order not kept": "defect 4: a rejected order is written to the orders DB",
    "dead-lettered silently": "defect 5: a throttling storm dead-letters orders silently",
    "terminal status reaches the reply queue": "defect 4/6: a terminal status is lost when its send fails",
    "7 side effect named on the record with an alert": "defect 6: a failed alert send is only logged",
    "4 bad submission alerted": "defect 6: a failed alert send is only logged",
    "one deadline travels everywhere": "defect 7: CompleteBy differs from the timer and agent deadline",
    "no false CompensationFailed": "defect 8 (restarted compensation reused message ids), and N3 on 2.0: "
    "an undo applied remotely whose every answer is lost (agent crashes, redeliveries past "
    "the try's deadline answered without a call, an outage); reduced on 2.1 (ADR 005), "
    "closed on 2.2 (an unconfirmed undo waits for a long retry, ADR 019a); kept on 2.0 and "
    "2.1 for their histories (seeds 4390, 4621 on 2.0; 6789 and the undo blackout seeds on 2.1)",
    "a restarted orchestration's requests are delivered": "defect 8: a restarted compensation reuses its message ids",
    "4 bad submission dead-lettered with a reason": "defect 10: an AMQP value body raises instead of being dead-lettered",
    "index entry of a live attempt kept": "new: the index source discards a live entry after a lagging read",
    "liveness": "defects 1/5/6 and a lagging read in the index source: an order never reaches a terminal state",
    "forged message alerted once": "issue 22: while a forgery's alert cannot be queued, the agents "
    "abandon it at once (every delivery spent, no alert: seeds 5113, 5166), or the gate's delayed "
    "copy and a redelivery of the original alert under two ids (seeds 56, 58)",
    "forged message refused": "issue 22: the agents abandon a forged request at once while its "
    "alert cannot be queued, so Service Bus dead-letters it MaxDeliveryCountExceeded",
}


def _run(seed: int, orders: int, options: Options | None = None) -> Simulation:
    return simulate(Simulation(seed, orders, options=options))


def test_same_seed_same_trace_byte_for_byte():
    # A seed with crashes, duplicates, delays and lock expiries in it.
    first = run_schedule(7, 2)
    second = run_schedule(7, 2)
    assert len(first.faults) > 0
    assert "\n".join(first.trace).encode() == "\n".join(second.trace).encode()
    assert [f.line() for f in first.faults] == [f.line() for f in second.faults]
    assert first.violations == second.violations
    assert "\n".join(run_schedule(8, 2).trace) != "\n".join(first.trace)


def test_same_seed_same_output_across_processes():
    """Byte for byte, in fresh processes with different hash seeds (set and
    dict orders, uuids and wall-clock time must not leak into a schedule)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    outputs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        done = subprocess.run(
            [sys.executable, "-m", "sim", "--seed", "42", "--orders", "3"],
            cwd=root,
            env=env,
            capture_output=True,
            timeout=300,
        )
        # The one line that is a measurement of this machine, not of the schedule.
        outputs.append(
            b"\n".join(line for line in done.stdout.splitlines() if b"schedules/s" not in line)
        )
    assert (
        b"bus alerts +alert/" in outputs[0]
    )  # random ids of the product are drawn from the seed too
    assert outputs[0] == outputs[1]


def test_dropping_a_fault_keeps_the_schedule_before_it():
    """Shrinking relies on this: leaving a fault out changes nothing before it."""
    full = run_schedule(7, 2)
    middle = full.faults[len(full.faults) // 2]
    dropped = run_schedule(7, 2, frozenset({middle.index}))
    assert middle.index not in {f.index for f in dropped.faults}
    before = [f.line() for f in full.faults if f.index < middle.index]
    assert [f.line() for f in dropped.faults if f.index < middle.index] == before
    # Everything traced before the fault's moment is the same (not every fault kind
    # writes a trace line of its own at that moment).
    at = _seconds(middle.at)
    cut = next(
        (i for i, line in enumerate(full.trace) if _seconds(line.split(" ", 1)[0]) >= at),
        len(full.trace),
    )
    assert cut > 0
    assert dropped.trace[:cut] == full.trace[:cut]


def _seconds(stamp: str) -> float:
    """'t+99.586' -> 99.586: the simulated clock's stamp on faults and trace lines."""
    assert stamp.startswith("t+"), stamp
    return float(stamp[2:])


def test_happy_path_processes_every_order_and_reports_it():
    sim = _run(1, 3, Options(orders=3, faults=FaultConfig()))
    states = {oid: sim.state_c.docs[(oid, oid)]["ProcessState"] for oid in sim.order_ids}
    assert set(states.values()) == {"Processed"}
    statuses = sim._statuses()
    for oid in sim.order_ids:
        assert "Processed" in [s["Status"] for s in statuses[oid]]
    assert sim.rows["1"] == 3
    assert sim.rows["2"] == 3
    assert sim.rows["4"] == 3
    # Every step applied once on the remote service, none undone.
    assert sum(sim.remote.ledger.effects.values()) == 3 * 3
    assert sim.violations == []


def test_happy_path_one_deadline():
    from sim.durable import default_version

    sim = _run(1, 3, Options(orders=3, faults=FaultConfig()))
    assert {i.version for i in sim.durable.instances.values()} == {default_version()}
    assert sim.violations == []


def test_new_attempts_run_host_json_default_version_with_the_starters_input():
    from sim.durable import default_version

    sim = _run(1, 1, Options(orders=1, faults=FaultConfig()))
    (instance,) = sim.durable.instances.values()
    assert instance.version == default_version() == "1.0"
    given = json.loads(instance.input)
    # Not its record: the plan and the attempt's one deadline
    # (docs/adr/021a-claim-marks-the-attempt.md), without what the instance
    # id says (the order, the attempt).
    assert "Record" not in given
    assert "Etag" not in given
    assert given["Plan"]["Steps"]
    assert "OrderID" not in given["Plan"]
    assert "Attempt" not in given["Plan"]
    assert given["Deadline"]
    # The happy path: the Starter sent the first step's request (ADR 021l),
    # the attempt a send per later step, then the one write.
    from devstack.host.durable import TASK_SCHEDULED

    assert given["Sent"] == given["Plan"]["Steps"][0]["Name"]
    scheduled = [e["Name"] for e in instance.history if e["EventType"] == TASK_SCHEDULED]
    assert scheduled == ["send_step", "send_step", "finish_attempt"]


def test_checks_can_fail():
    """A check that cannot fail is no check: break the world and see it fire."""
    sim = _run(1, 1, Options(orders=1, faults=FaultConfig()))
    doc = sim.state_c.docs[(sim.order_ids[0], sim.order_ids[0])]
    doc["ProcessState"] = "Processing"
    sim.deadline_mismatch.clear()  # defect 7 shows on every schedule until it is fixed
    sim.violations.clear()
    sim.check()
    # A fault-free schedule (FaultConfig()) must also end every order Processed.
    assert [c for c, _ in sim.violations] == [
        "liveness",
        "a fault-free schedule processes every order",
    ]
    sim.remote.ledger.effects[f"{sim.order_ids[0]}|charge-payment|payment/charge"] += 1
    doc["ProcessState"] = "Processed"
    sim.violations.clear()
    sim.check()
    assert "2 side effect applied once" in [c for c, _ in sim.violations]


def test_a_bad_submission_taken_as_valid_and_a_restart_past_the_budget_are_caught():
    """Two holes the mutation run showed: a malformed submission completed as if
    valid passed every check, and so did a compensation restarted once too often."""
    from sim.system import INGRESS_OF

    for seed in range(1, 40):  # the first schedule whose bad messages include a malformed one
        sim = _run(seed, 2, Options(orders=2, faults=FaultConfig(bad_messages=1.0)))
        bad = [m for m, k in sorted(sim.bad.items()) if k != "conflict"]
        if bad:
            break
    assert sim.violations == []
    mid = bad[0]
    ingress = sim.bus.queue(INGRESS_OF[sim.orders[mid.split("/")[0]][0]])
    ingress.dead[:] = [m for m in ingress.dead if m.message_id != mid]  # as if completed
    sim.check()
    assert [c for c, _ in sim.violations] == ["4 bad submission dead-lettered"]
    sim.violations.clear()
    key = sim.order_ids[0]
    sim.state_c.docs[(key, key)]["CompensationRestarts"] = 4
    sim.check()
    assert "compensation restarts bounded" in [c for c, _ in sim.violations]


def _regression_params():
    for entry in REGRESSIONS:
        checks = entry.get("checks_now") or entry["checks"]  # what still breaks on this branch
        reason = "; ".join(sorted({DEFECT_OF_CHECK.get(c, c) for c in checks}))
        marks = [] if corpus.plain(entry) else [pytest.mark.xfail(strict=True, reason=reason)]
        version = entry.get("version")  # recorded on a frozen version, replayed on the live one
        tag = f"-v{version}" if version else ""
        apps = entry.get("apps", 1)  # recorded before the world had two applications
        tag += "" if apps == 1 else f"-{apps}apps"
        yield pytest.param(entry, id=f"seed{entry['seed']}{tag}-{entry['check'][:30]}", marks=marks)


@pytest.mark.parametrize("entry", list(_regression_params()))
def test_regression_seed(entry):
    """Each entry in the world it was recorded in (sim.corpus.world_of)."""
    assert corpus.replay(entry).violations == []


def _open_seeds(orders: int) -> set[int]:
    """Seeds of this kind recorded as open defects: each is a strict xfail in
    test_regression_seed, which fails as soon as it passes; the bulk runs
    leave them to it, so any other broken schedule still fails them."""
    return {e["seed"] for e in REGRESSIONS if not corpus.plain(e) and e["orders"] == orders}


def _bulk(seeds, orders: int):
    import time
    from collections import Counter

    seeds = [s for s in seeds if s not in _open_seeds(orders)]

    started = time.perf_counter()
    broken: Counter[str] = Counter()
    first: dict[str, int] = {}
    for seed in seeds:
        violations = run_schedule(seed, orders).violations
        for check in {c for c, _ in violations}:
            broken[check] += 1
            first.setdefault(check, seed)
    elapsed = time.perf_counter() - started
    n = len(seeds)
    print(f"{n} schedules in {elapsed:.1f} s ({n / elapsed:.1f} schedules/s)")
    assert broken == {}, "broken checks (check: schedules, first seed): " + "; ".join(
        f"{c}: {k}, seed {first[c]} --orders {orders}" for c, k in broken.most_common()
    )


# Long by design (about 225 s alone, more beside another test process): the
# project's 300 s timeout would interrupt it inside a schedule.
@pytest.mark.timeout(1200)
def test_thousand_schedules():
    """1,000 seeded one-order schedules on the default version (host.json): no check may break."""
    _bulk(range(100_001, 101_001), 1)


def test_application_checks_can_fail():
    """Two applications, one OrderID: break what keeps them apart and see the
    checks fire (an order, a status and a conflict crossing applications)."""
    sim = _run(1, 2, Options(orders=2, faults=FaultConfig()))
    first, second = sim.order_ids
    assert [sim.orders[k][1] for k in (first, second)] == ["ORD-1-0", "ORD-1-0"]
    assert sim.orders[first][0] != sim.orders[second][0]
    assert sim.violations == []
    doc = sim.state_c.docs[(first, first)]
    doc["AppId"] = sim.orders[second][0]
    sim.check()
    assert "order crossed applications" in [c for c, _ in sim.violations]
    doc["AppId"] = sim.orders[first][0]

    from sim.system import INGRESS_OF, REGISTRY

    sim.violations.clear()
    failed = {"OrderID": "ORD-1-0", "Status": "Failed", "Timestamp": "2026-11-30T08:00:00Z"}
    sim.bus.send(REGISTRY[sim.orders[first][0]], json.dumps(failed).encode(), "x/status")
    sim.check()
    assert "status crossed applications" in [c for c, _ in sim.violations]

    sim.violations.clear()
    sim.bus.queue(REGISTRY[sim.orders[first][0]]).sent.pop()
    queue = INGRESS_OF[sim.orders[second][0]]
    sim.bus.send(queue, sim._order_body(second), "refused")
    refused = sim.bus.queue(queue).messages.pop()
    refused.dead_letter_reason = "OrderConflict"
    sim.bus.queue(queue).dead.append(refused)
    sim.check()
    assert "conflict crossed applications" in [c for c, _ in sim.violations]


def test_several_hosts_each_keep_their_own_state_and_lose_it_on_restart():
    """Issue 21: deliveries spread over the hosts, each host's Submit handler
    and Starter are its own objects, and a restart replaces them (the
    in-memory state of the process is gone) and moves the timers' lock."""
    sim = _run(
        4,
        6,
        Options(orders=6, hosts=3, faults=FaultConfig(host_restarts=2, duplicate=0.2)),
    )
    assert sim.violations == []
    assert len(sim.hosts) == 3
    assert set(sim.host_deliveries) == {0, 1, 2}, sim.host_deliveries
    assert len({id(h.submit) for h in sim.hosts}) == 3
    assert len({id(h.starter) for h in sim.hosts}) == 3
    restarted = [line for line in sim.world.trace if "restarted" in line]
    # (a restart drawn after the schedule went idle never happens)
    assert 1 <= len(restarted) <= 2, restarted
    assert sum(h.generation for h in sim.hosts) == len(restarted)
    assert sim.singleton != 0 or "timers on host 0" in restarted[-1]


def test_the_one_host_world_is_the_world_before_hosts():
    """Regression entries without "hosts" replay with 0: one host, no
    restarts, whatever the seed draws."""
    assert run_schedule(2, 3, hosts=0).options.hosts == 1
    assert run_schedule(2, 3, hosts=0).options.faults.host_restarts == 0
