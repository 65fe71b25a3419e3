"""One schedule of the simulation, as its users (`python -m sim`, the
regression corpus, the tests, bench/) take it: the names below, from the
modules that make it up.

- world: sim.world (the clock, the scheduler of actors, the fault plan and
  `SimClock`), sim.options (`Options`, drawn from the seed by
  `options_for`, and the bounds that follow from them), sim.remote (the
  remote services), sim.bus, sim.cosmos and sim.durable (the simulated
  Service Bus, Cosmos DB and task hub), sim.faults (the faults set up over
  the schedule's stores and queues);
- drive: sim.drive (`Simulation`: the product built as production builds
  it, its clients, operators, timers, hosts and deliveries; `run_schedule`);
- checks: sim.path_checks (on the way), sim.checks and sim.message_checks
  (at the end), over what sim.observed names."""

from __future__ import annotations

from .drive import Result, Simulation, catalog, run_schedule, simulate
from .options import (
    CHANGED_TOTAL,
    INGRESS_OF,
    REGISTRY,
    ROWS,
    Options,
    liveness_bound,
    options_for,
    refusals,
)

__all__ = [
    "CHANGED_TOTAL",
    "INGRESS_OF",
    "REGISTRY",
    "ROWS",
    "Options",
    "Result",
    "Simulation",
    "catalog",
    "liveness_bound",
    "options_for",
    "refusals",
    "run_schedule",
    "simulate",
]
