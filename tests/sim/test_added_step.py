"""A fourth step added by data alone (tests/added_step.py) through the seeded
simulation: every check holds with it, Processed orders carry its effect,
compensation undoes it, and its faults (refusal, outage of its service) are
drawn from the catalog like the others'. The shipped catalog's schedules are
unchanged by the catalog (`python -m sim` output, compared in the ADR)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from sim.system import Simulation, options_for, refusals, run_schedule, simulate
from tests.added_step import with_warehouse_step

pytestmark = pytest.mark.filterwarnings("ignore:Potential duplicate Task completion")

SEEDS = range(1, 9)
STEP = "reserve-warehouse-slot"


def _run(seed: int) -> Simulation:
    return simulate(
        Simulation(seed, 3, options=replace(options_for(seed, 3), steps=with_warehouse_step()))
    )


def test_the_added_step_runs_through_the_simulation_with_every_check_holding():
    seen: Counter[str] = Counter()
    for seed in SEEDS:
        sim = _run(seed)
        assert sim.violations == [], f"seed {seed}: {sim.violations[:3]}"
        docs = {k: d for (k, _), d in sim.state_c.docs.items() if isinstance(d, dict)}
        for key, count in sim.remote.ledger.effects.items():
            order, step, op = key.split("|")
            if step == STEP:
                seen[op] += count
        for order, doc in docs.items():
            if doc.get("ProcessState") == "Processed":
                assert STEP in doc["Steps"], f"seed {seed}: {order} has no {STEP} on its record"
                assert sim.remote.ledger.effects[f"{order}|{STEP}|warehouse/reserve"] == 1
                seen["processed"] += 1
    # It ran, in both directions, over these seeds.
    assert seen["warehouse/reserve"] > 0
    assert seen["processed"] > 0


def test_its_faults_come_from_the_catalog():
    steps = with_warehouse_step()
    table = refusals(steps)
    assert ("warehouse/reserve",) in table
    assert table[-1] == ("warehouse/reserve", "payment/refund")  # the last step, then the refund
    assert "warehouse" in steps.services  # an outage may hit it
    result = run_schedule(3, 3, steps=steps)
    assert result.options.steps == steps
    assert result.violations == []
