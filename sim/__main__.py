"""`python -m sim --seeds N --orders K [--seed S] [--drop 1,4]`: run schedules and
check them. On a violation: the seed, the first broken check, a shrunk fault
trace and the one command that replays it. Last line:
`simulate: N schedules, M violations`, or with `--fault-surface` the listing of
sim/surface.py after it, ending `fault surface: C call sites, G gaps`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from domain.steps import load_catalog

from . import surface
from .durable import default_version
from .system import ROWS, Result, liveness_bound, options_for, run_schedule

REGRESSIONS = Path(__file__).with_name("regressions.json")


def shrink(
    result: Result,
    orders: int,
    budget: int = 40,
    hostile: int | None = None,
    apps: int = 2,
    wider: bool = True,
    scan: str | None = None,
    hosts: int | None = None,
    fallible: bool = True,
) -> tuple[frozenset[int], Result]:
    """Drop faults one at a time while the same check still fails."""
    check = result.violations[0][0]
    drop: frozenset[int] = frozenset()
    best = result
    for fault in list(result.faults):
        if budget <= 0:
            break
        budget -= 1
        trial = drop | {fault.index}
        again = run_schedule(
            result.seed,
            orders,
            trial,
            hostile,
            apps,
            wider,
            scan,
            hosts,
            fallible,
            steps=result.options.steps,
        )
        if again.violations and again.violations[0][0] == check:
            drop, best = trial, again
    return drop, best


def command(
    seed: int,
    orders: int,
    drop: frozenset[int],
    hostile: int | None = None,
    apps: int = 2,
    scan: str | None = None,
    hosts: int | None = None,
    steps_file: str | None = None,
    fallible: bool = True,
    target: str | None = None,
) -> str:
    extra = f" --drop {','.join(map(str, sorted(drop)))}" if drop else ""
    extra += f" --scan {scan}" if scan else ""
    extra += f" --steps {steps_file}" if steps_file else ""
    extra += "" if fallible else " --infallible"
    extra += f" --hostile {hostile}" if hostile is not None else ""
    extra += f" --apps {apps}" if apps != 2 else ""
    extra += f" --hosts {hosts}" if hosts is not None else ""
    extra += f" --target {target}" if target else ""
    return f"python -m sim --seed {seed} --orders {orders}{extra}"


def record(
    seed: int,
    orders: int,
    violations: list[tuple[str, str]],
    hostile: int = 0,
    apps: int = 2,
    hosts: int | None = None,
    target: str | None = None,
) -> None:
    """Entries carry the schedule's number of forgeries (`hostile`); one
    without it was found before the hostile sender existed (replayed with 0).
    One found by the fault surface's targeted pass carries its `target`.
    Entries name no workflow version: every attempt runs the live one
    (an older entry's "version" is ignored)."""
    entries = json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []
    if any(e["seed"] == seed and e["orders"] == orders and not e.get("version") for e in entries):
        return
    check, detail = violations[0]
    entry = {
        "seed": seed,
        "orders": orders,
        "check": check,
        "detail": detail[:300],
        "checks": sorted({c for c, _ in violations}),
        "hostile": hostile,
    }
    # Entries without "apps" were recorded in the one-application world, and
    # those without "wider" before the Durable client's faults, odd provider
    # answers and foreign documents existed, those without "fallible" before
    # the fallible world (Cosmos 503s, outages and lost answers, failing
    # settlements and sends, slow remote answers).
    entry["apps"] = apps
    entry["wider"] = True
    # Entries without "hosts" were recorded in the one-host world (replayed
    # with 0); null draws the hosts from the seed, as the run that found it did.
    entry["hosts"] = hosts
    entry["fallible"] = True
    # and those without "mutation_world" before the world of the 2.4
    # mutation run (progress statuses, lost leases, more lag)
    entry["mutation_world"] = True
    # and those without "bus_outages" before the Service Bus outages
    entry["bus_outages"] = True
    # and those without "link_drops" before a lost send answer dropped the link
    entry["link_drops"] = True
    # and those without "entity_full" before a queue could be full
    entry["entity_full"] = True
    # and those without "slow_world" before issue 43's worlds (overload, rate
    # limits, a reply queue refusing for hours)
    entry["slow_world"] = True
    # and those without "rare_faults" before a 404 could be lost or a paired
    # host start read before the other's create replicated
    entry["rare_faults"] = True
    # and those without "admission_world" before MAX_PROCESSING could bind
    entry["admission_world"] = True
    # and those without "foreign_senders" before the senders the app must
    # refuse (a stolen reply queue, lax JSON types, an agent key's replies),
    # without "long_refusals" before the long refusals (the alerts queue for
    # minutes, a provider throttling the tenant, the agents' reply queue full)
    entry["foreign_senders"] = True
    entry["long_refusals"] = True
    if target:
        entry["target"] = target
    entries.append(entry)
    REGRESSIONS.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim", description=__doc__)
    p.add_argument(
        "--seeds", type=int, default=100, help="how many schedules (seeds start..start+N-1)"
    )
    p.add_argument("--start", type=int, default=1, help="first seed")
    p.add_argument("--orders", type=int, default=3, help="orders per schedule")
    p.add_argument("--seed", type=int, help="run this one seed (with its trace)")
    p.add_argument("--drop", default="", help="fault indices to leave out (a shrunk replay)")
    p.add_argument(
        "--record", action="store_true", help="add failing seeds to sim/regressions.json"
    )
    p.add_argument("--no-shrink", action="store_true")
    p.add_argument("--trace", action="store_true", help="print every schedule's trace")
    p.add_argument(
        "--hostile",
        type=int,
        default=None,
        help="forged internal-queue messages per schedule (default: drawn from the seed)",
    )
    p.add_argument(
        "--apps",
        type=int,
        choices=(1, 2),
        default=2,
        help="client applications (2: colliding OrderIDs; 1: the world of older regression seeds)",
    )
    p.add_argument(
        "--hosts",
        type=int,
        default=None,
        help="host processes of the app (default: drawn from the seed, with their restarts; "
        "0: the one-host world of older regression seeds)",
    )
    p.add_argument(
        "--narrow",
        action="store_true",
        help="no Durable client faults, odd provider answers or foreign documents "
        "(the world of regression seeds found before them)",
    )
    p.add_argument(
        "--scan",
        choices=("query", "index"),
        default=None,
        help="every schedule with this Supervisor source (default: drawn from the seed, "
        "about half each)",
    )
    p.add_argument(
        "--steps",
        default=None,
        metavar="FILE",
        help="a step catalog to run instead of domain/steps.json (e.g. one with a step added)",
    )
    p.add_argument(
        "--infallible",
        action="store_true",
        help="no Cosmos 503s, outages or lost write answers, failing settlements or sends, "
        "slow remote answers, host starts (the world of regression seeds found before them)",
    )
    p.add_argument(
        "--fault-surface",
        nargs="?",
        const="report",
        choices=("report", "strict"),
        default=None,
        help="after the run, list every SDK call site of the product with the fault kinds "
        "injected there and the applicable ones missing (sim/surface.py); "
        "=strict: exit 1 when there is a gap (otherwise gaps leave the exit status alone)",
    )
    p.add_argument(
        "--target",
        default=None,
        metavar="PATH:LINE:KIND",
        help="force this fault kind at the first call of this SDK call site in each schedule "
        "(the fault surface's targeted pass; its replay commands carry it)",
    )
    args = p.parse_args(argv)
    target = None
    if args.target:
        try:
            target = surface.parse_target(args.target, surface.scan())
        except ValueError as exc:
            p.error(str(exc))
    args.target_spec = target
    recorder = surface.install() if args.fault_surface or target else None
    try:
        return _run(args, recorder)
    finally:
        if recorder is not None:
            surface.uninstall()


def _schedule(args: argparse.Namespace, seed: int, drop: frozenset[int], steps) -> Result:
    return run_schedule(
        seed,
        args.orders,
        drop,
        args.hostile,
        args.apps,
        not args.narrow,
        args.scan,
        args.hosts,
        not (args.narrow or args.infallible),
        steps=steps,
    )


def _violation(
    args: argparse.Namespace,
    result: Result,
    drop: frozenset[int],
    checks: Counter[str],
    first_seed: dict[str, int],
    targeted: surface.Target | None = None,
) -> None:
    """Print one failing schedule: its checks, its (shrunk) fault trace and
    the command that replays it; record it with --record."""
    seed = result.seed
    check, detail = result.violations[0]
    for c, _ in result.violations:
        if c not in checks:
            first_seed[c] = seed
    checks.update({c for c, _ in result.violations})
    print(f"VIOLATION seed {seed}: {check}: {detail[:400]}")
    for other, text in result.violations[1:4]:
        print(f"  also: {other}: {text[:200]}")
    # Shrink the first schedule of each broken check (shrinking re-runs the
    # schedule once per fault); later ones print their replay command only. A
    # targeted schedule is not shrunk: its forced fault is not one of the seed's.
    again = check in first_seed and first_seed[check] != seed
    quick = args.no_shrink or args.seed is not None or again or targeted is not None
    shrunk, best = (
        (drop, result)
        if quick
        else shrink(
            result,
            args.orders,
            hostile=args.hostile,
            apps=args.apps,
            wider=not args.narrow,
            scan=args.scan,
            hosts=args.hosts,
            fallible=not (args.narrow or args.infallible),
        )
    )
    print("  fault trace (shrunk):" if shrunk != drop else "  fault trace:")
    kept = [f for f in best.faults]
    for fault in kept[:30]:
        print(f"    {fault.line()[:160]}")
    if len(kept) > 30:
        print(f"    ... {len(kept) - 30} more")
    hostile = result.options.faults.hostile
    fallible = not (args.narrow or args.infallible)
    replay = command(
        seed,
        args.orders,
        shrunk,
        hostile,
        args.apps,
        args.scan,
        args.hosts,
        args.steps,
        fallible,
        args.target,
    )
    print(f"  replay: {replay}")
    if args.record:
        record(
            seed,
            args.orders,
            result.violations,
            hostile,
            args.apps,
            args.hosts,
            args.target,
        )


def _targeted_pass(
    args: argparse.Namespace,
    recorder: surface.Recorder,
    drop: frozenset[int],
    steps,
    checks: Counter[str],
    first_seed: dict[str, int],
) -> tuple[int, int]:
    """The fault surface's second pass: for each (call site, kind) the seeds
    left uncovered, replay a schedule that reached the site with that kind
    forced at the site's first call (the schedule up to that call is the
    seed's own), under every check. Returns (schedules, violations)."""
    sites = recorder.sites()
    reached = surface.reached_sites(sites, recorder)
    wanted = [(s, k) for s, k in surface.gaps(sites, recorder) if surface.forcible(k)]
    runs = broken = injected = 0
    never: list[str] = []
    for site, kind in wanted:
        seeds = reached.get(site, [])
        if not seeds:
            never.append(f"{site.label()} {kind}")
            continue
        for seed in seeds:
            recorder.seed = seed
            recorder.target = surface.Target(site, kind)
            try:
                result = _schedule(args, seed, drop, steps)
            finally:
                target, recorder.target = recorder.target, None
            runs += 1
            if result.violations:
                broken += 1
                args.target = target.spec()
                try:
                    _violation(args, result, drop, checks, first_seed, targeted=target)
                finally:
                    args.target = None
            if target.done:
                injected += 1
                break
    print(
        f"targeted pass: {len(wanted)} uncovered (site, kind) pairs, {runs} schedules, "
        f"{injected} injected, {broken} violations"
        + (f"; never reached by the seeds: {len(never)}" if never else "")
    )
    for line in never:
        print(f"  never reached: {line}")
    return runs, broken


def _run(args: argparse.Namespace, recorder: surface.Recorder | None) -> int:

    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    steps = load_catalog(args.steps) if args.steps else None
    drop = frozenset(int(x) for x in args.drop.split(",") if x)
    print(
        f"workflow version: {default_version()}; liveness bound after faults stop: "
        f"{liveness_bound(options_for(0, args.orders))} "
        "(from the settings: (max_failures+1) x attempt + long retries + compensation)"
    )
    faults: Counter[str] = Counter()
    forged = spells = 0
    spell_refusals: list[int] = []
    # Writes per recovery-index partition key per simulated second (ADR 019b):
    # the peak of each schedule with the index Supervisor.
    index_peaks: list[int] = []
    rows: Counter[str] = Counter()
    checks: Counter[str] = Counter()
    first_seed: dict[str, int] = {}
    violations = 0
    started = time.perf_counter()
    n = hit_target = 0
    for seed in seeds:
        if recorder is not None:
            recorder.seed = seed
            if args.target_spec is not None:
                recorder.target = surface.Target(args.target_spec.site, args.target_spec.kind)
        result = _schedule(args, seed, drop, steps)
        n += 1
        if args.target_spec is not None and recorder is not None and recorder.target is not None:
            forced = [f.line() for f in result.faults if "targeted" in f.detail]
            hit_target += bool(forced)
            if args.seed is not None:
                print(
                    f"target {args.target}: "
                    + (f"forced: {forced[0]}" if forced else "not reached in this schedule")
                )
        faults.update(f.kind for f in result.faults)
        forged += result.counters["forged"]
        spells += result.counters["refusing spells"]
        spell_refusals.append(result.counters["starter sends refused in refusing spells"])
        if result.options.scan == "index":
            index_peaks.append(result.counters["index partition-second peak"])
        rows.update(result.rows)
        if args.trace or args.seed is not None:
            print("\n".join(result.trace))
        if not result.violations:
            continue
        violations += 1
        _violation(args, result, drop, checks, first_seed, targeted=args.target_spec)
    if recorder is not None and args.fault_surface and args.seed is None and not args.target:
        n_targeted, broken = _targeted_pass(args, recorder, drop, steps, checks, first_seed)
        n += n_targeted
        violations += broken
    elapsed = time.perf_counter() - started
    print(f"{n / elapsed:.1f} schedules/s ({n} in {elapsed:.1f} s)")
    print(
        "faults injected: " + (", ".join(f"{k}={v}" for k, v in sorted(faults.items())) or "none")
    )
    print(f"forged internal-queue messages (sim/hostile.py): {forged}")
    if spells:
        print(
            f"refusing reply queues: {spells} spells; the Starter's sends they refused: "
            f"max {max(spell_refusals)} per schedule, {sum(spell_refusals) / spells:.1f} per spell"
        )
    if index_peaks:
        print(
            f"index Supervisor schedules: {len(index_peaks)}; recovery-index writes per "
            f"partition key per simulated second: peak {max(index_peaks)}, "
            f"mean of the schedules' peaks {sum(index_peaks) / len(index_peaks):.1f}"
        )
    print("transition rows (DESIGN.md section 3):")
    for row, text, by in ROWS:
        print(
            f"  row {row:<3} {text:<46} by {by:<13} {'hit ' + str(rows[row]) if rows[row] else 'NOT HIT'}"
        )
    if checks:
        print("broken checks (schedules; first seed):")
        for k, v in sorted(checks.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {k}: {v}; seed {first_seed[k]}")
    print(f"simulate: {n} schedules, {violations} violations")
    if args.target_spec is not None and args.seed is None:
        print(f"target {args.target}: forced in {hit_target} of {n} schedules")
    if recorder is not None and args.fault_surface:
        lines, gaps = surface.report(recorder.sites(), recorder)
        print("\n".join(lines))
        if args.fault_surface == "strict" and gaps:
            return 1
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
