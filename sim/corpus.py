"""`python -m sim.corpus`: replay the regression corpus, every seed in
sim/regressions.json whose defect is fixed (or whose schedule no longer
reaches it, `moved`), each in the world it was recorded in. Prints
`VIOLATION seed S: check: detail` for each schedule that breaks a check and
ends `simulate: N schedules, M violations`, as `python -m sim` does, so the
mutation run (sim/mutate.py) reads both the same way; `--first` stops at the
first violation. Exit status 1 when a schedule broke a check.

tests/sim/test_simulation.py runs the same entries through `replay`, the
open ones as strict xfails."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import surface
from .system import Result, run_schedule

REGRESSIONS = Path(__file__).with_name("regressions.json")


def load(path: Path = REGRESSIONS) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))


def plain(entry: dict[str, Any]) -> bool:
    """A case that must run clean: its defect is fixed, or a change elsewhere
    moved the schedule off it (while other seeds show it)."""
    return bool(entry.get("fixed") or entry.get("moved"))


def world_of(entry: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `run_schedule` that rebuild the entry's world.
    Each key an entry lacks was recorded before that part of the world
    existed, and replays without it. An entry's "version" (the workflow
    version its run started attempts on, when several were registered) is
    ignored: every attempt runs the live version."""
    return {
        "hostile": entry.get("hostile", 0),  # before the hostile sender
        "apps": entry.get("apps", 1),  # before the second application
        # before the Durable client's faults, odd provider answers, foreign documents
        "wider": entry.get("wider", False),
        "hosts": entry.get("hosts", 0),  # before several host processes
        "fallible": entry.get("fallible", False),  # before the fallible world
        # before the 2.4 mutation run's world (progress statuses, lost leases)
        "mutation_world": entry.get("mutation_world", False),
        "bus_outages": entry.get("bus_outages", False),  # before the Service Bus outages
        "link_drops": entry.get("link_drops", False),  # before the dropped links
        "entity_full": entry.get("entity_full", False),  # before the full queues
        # before issue 43's worlds (overload, rate limits, a reply queue refusing for hours)
        "slow_world": entry.get("slow_world", False),
        # before the faults of calls no seed failed (a lost 404, a paired start's lag)
        "rare_faults": entry.get("rare_faults", False),
        # before MAX_PROCESSING was lowered until it binds (the admission world)
        "admission_world": entry.get("admission_world", False),
        # before the senders the app must refuse (a stolen reply queue, lax
        # JSON types, an agent key's tokenless replies)
        "foreign_senders": entry.get("foreign_senders", False),
        # before the long refusals (the alerts queue for minutes, a provider
        # throttling the tenant, the agents' reply queue full while a worker runs)
        "long_refusals": entry.get("long_refusals", False),
    }


class TargetMissed(Exception):
    """The entry's forced fault was never reached: the schedule moved."""


def replay(entry: dict[str, Any]) -> Result:
    """Run the entry's schedule in its world; with `target` (found by the
    fault surface's targeted pass), that fault forced again. Raises
    TargetMissed when the target is no longer reached."""
    target = entry.get("target")
    recorder = None
    if target:
        recorder = surface.install()
        recorder.seed = entry["seed"]
        recorder.target = surface.parse_target(target, surface.scan())
    try:
        result = run_schedule(entry["seed"], entry["orders"], **world_of(entry))
    finally:
        if recorder is not None:
            surface.uninstall()
    if recorder is not None and not (recorder.target is not None and recorder.target.done):
        raise TargetMissed(f"seed {entry['seed']}: the target {target} is no longer reached")
    return result


def plain_entries(entries: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    yield from (e for e in (load() if entries is None else entries) if plain(e))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.corpus", description=__doc__)
    p.add_argument("--first", action="store_true", help="stop at the first violation")
    args = p.parse_args(argv)
    started = time.perf_counter()
    n = violations = 0
    for entry in plain_entries():
        n += 1
        try:
            found = replay(entry).violations
        except TargetMissed as exc:
            found = [("the recorded target is reached", str(exc))]
        if not found:
            continue
        violations += 1
        check, detail = found[0]
        print(f"VIOLATION seed {entry['seed']}: {check}: {detail[:400]}", flush=True)
        print(f"  entry: {json.dumps({k: v for k, v in entry.items() if k != 'note'})}")
        if args.first:
            break
    elapsed = time.perf_counter() - started
    print(f"{n / elapsed:.1f} schedules/s ({n} in {elapsed:.1f} s)")
    print(f"simulate: {n} schedules, {violations} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
