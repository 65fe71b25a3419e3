"""`python -m sim.mutate [--seeds N] [--orders K] [--only NAME,...]`: the
simulation's mutation run (issue 21).

Each mutant in sim/mutants.json is a one-line (or one-snippet) slip in the
protocol code: `file`, the exact `original` text (found exactly once, or the
mutant is refused: the code moved), its `replacement`, and `why` it is a
plausible mistake. The run copies the tree once into a temporary directory
(never touching the files it was started from), checks that the unmutated
copy runs clean for the same seeds, then applies each mutant in turn to the
copy, runs `python -m sim --seeds N --orders K --no-shrink` there in a
subprocess, and restores the file. A mutant is killed when the simulation
reports a violation (the run stops at the first one), crashed when the
simulation dies without its summary line, timed out when it runs far longer
than the clean run did, and survived otherwise. A mutant the fresh seeds
leave alive then meets a few large schedules (`--large` of `--large-orders`
orders: paging limits, many hosts' races; `--large 0` skips them), then the
regression corpus (`python -m sim.corpus`: every fixed seed of
sim/regressions.json in its recorded world, as tests/sim/test_simulation.py
replays them; `--no-corpus` skips it), then, for a mutant that names them
(`tests`: pytest node ids of direct tests that need no server), its own
tests; a kill there is shown as that stage's (one by the tests only is a
slip the simulation missed), and the score says how many each stage killed.

Prints one line per mutant, then a table and the score `killed/total`
(crashes and timeouts count as killed but are shown as such). A mutant
marked `equivalent` (with the reason it cannot change behaviour: another
guard makes the same check) is checked to apply but not run, unless
`--all` or `--only` names it; the score counts the mutants run. Exit status: 0
when every mutant is killed, 1 when one survived, 2 when the run was refused
(a mutant's text not found exactly once, or the clean copy not clean)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = Path(__file__).with_name("mutants.json")
IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    "node_modules",
    "__pycache__",
    ".devstack",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "*.pyc",
)
VIOLATION = re.compile(r"^VIOLATION seed (\d+): ([^:]+):")
SUMMARY = re.compile(r"^simulate: (\d+) schedules, (\d+) violations")


class Refused(Exception):
    """The run cannot start: a mutant does not apply, or the clean copy is not clean."""


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    original: str
    replacement: str
    why: str
    # Why this mutant cannot change what the system does (another guard makes
    # the same check, or the condition is implied): not run unless --all.
    equivalent: str = ""
    # The direct tests that pin this slip (pytest node ids of tests that need
    # no server): the last stage, for a survivor of every simulated one.
    tests: tuple[str, ...] = ()
    # What the runs showed of it (why the seeds rarely reach it, which stage kills it).
    note: str = ""


@dataclass
class Outcome:
    kind: str  # "killed", "crashed", "timeout", "survived", "clean"
    detail: str
    seconds: float
    # the stage that killed it: "fresh" (the N seeds), "large" (the 50-order
    # schedules, for a survivor of the fresh ones), "corpus" (the regression
    # seeds), "tests" (the mutant's own direct tests, which the simulation missed)
    stage: str = "fresh"

    @property
    def killed(self) -> bool:
        return self.kind in ("killed", "crashed", "timeout")


def load_mutants(path: Path = MUTANTS) -> list[Mutant]:
    entries = json.loads(path.read_text(encoding="utf-8"))
    mutants = [Mutant(**{**e, "tests": tuple(e.get("tests", ()))}) for e in entries]
    names = [m.name for m in mutants]
    doubles = sorted({n for n in names if names.count(n) > 1})
    if doubles:
        raise Refused(f"{path.name}: mutant names used twice: {', '.join(doubles)}")
    return mutants


def mutated(text: str, mutant: Mutant) -> str:
    """`text` with the mutant's one change; Refused unless its original text
    occurs exactly once (otherwise the code moved and the mutant means
    nothing, or it would change more than one place)."""
    if mutant.original == mutant.replacement:
        raise Refused(f"mutant {mutant.name}: its replacement is its original")
    found = text.count(mutant.original)
    if found != 1:
        where = "not found" if found == 0 else f"found {found} times"
        raise Refused(
            f"mutant {mutant.name}: its original text is {where} in {mutant.file} "
            f"(the code moved? update sim/mutants.json): {mutant.original!r}"
        )
    return text.replace(mutant.original, mutant.replacement, 1)


def copy_tree(source: Path, dest: Path) -> Path:
    """The tree as it is on disk (uncommitted changes included), without
    VCS, environments or caches."""
    shutil.copytree(source, dest, ignore=IGNORED, symlinks=False)
    return dest


def check_all(tree: Path, mutants: list[Mutant]) -> None:
    """Refuse before running anything when one mutant does not apply."""
    problems = []
    for mutant in mutants:
        path = tree / mutant.file
        if not path.is_file():
            problems.append(f"mutant {mutant.name}: no file {mutant.file}")
            continue
        try:
            mutated(path.read_text(encoding="utf-8"), mutant)
        except Refused as exc:
            problems.append(str(exc))
    if problems:
        raise Refused("\n".join(problems))


def run_sim(
    tree: Path,
    seeds: int,
    orders: int,
    start: int,
    timeout: float | None,
    python: str = sys.executable,
    extra: list[str] | None = None,
) -> Outcome:
    """`python -m sim` in `tree`, stopped at its first violation."""
    cmd = [python, "-m", "sim", "--seeds", str(seeds), "--orders", str(orders)]
    return _run(tree, [*cmd, "--start", str(start), "--no-shrink", *(extra or [])], timeout)


def run_corpus(tree: Path, timeout: float | None, python: str = sys.executable) -> Outcome:
    """`python -m sim.corpus` in `tree`: the regression seeds, each in its
    recorded world, stopped at its first violation."""
    return _run(tree, [python, "-m", "sim.corpus", "--first"], timeout)


def run_tests(
    tree: Path, tests: tuple[str, ...], timeout: float | None, python: str = sys.executable
) -> Outcome:
    """pytest on `tests` in `tree`: killed when a test fails, clean when all
    pass, crashed otherwise (none collected, an error before running)."""
    cmd = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    began = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Outcome("timeout", f"no verdict after {timeout:.0f} s", time.monotonic() - began)
    seconds = time.monotonic() - began
    lines = [t.strip() for t in proc.stdout.splitlines() if t.strip()]
    failed = next((t for t in lines if t.startswith("FAILED ")), None)
    if proc.returncode == 1:
        detail = failed or (lines[-1] if lines else "a test failed")
        return Outcome("killed", detail[:160], seconds)
    if proc.returncode == 0:
        return Outcome("clean", f"{len(tests)} direct tests passed", seconds)
    last = lines[-1] if lines else "(no output)"
    return Outcome("crashed", f"pytest exit {proc.returncode}: {last[:160]}", seconds)


def _run(tree: Path, cmd: list[str], timeout: float | None) -> Outcome:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    began = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    tail: list[str] = []
    outcome: Outcome | None = None
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        proc.terminate()

    watchdog = threading.Timer(timeout, stop) if timeout is not None else None
    if watchdog is not None:
        watchdog.daemon = True
        watchdog.start()
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail = [*tail[-19:], line]
            hit = VIOLATION.match(line)
            if hit:
                outcome = Outcome("killed", f"{hit.group(2)} (seed {hit.group(1)})", 0.0)
                break
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()
    seconds = time.monotonic() - began
    if outcome is None and timed_out.is_set():
        outcome = Outcome("timeout", f"no verdict after {timeout:.0f} s", 0.0)
    if outcome is not None:
        outcome.seconds = seconds
        return outcome
    summary = next((SUMMARY.match(t) for t in reversed(tail) if SUMMARY.match(t)), None)
    if proc.returncode == 0 and summary and summary.group(2) == "0":
        return Outcome("clean", f"{summary.group(1)} schedules, 0 violations", seconds)
    last = next((t.strip() for t in reversed(tail) if t.strip()), "(no output)")
    return Outcome("crashed", f"exit {proc.returncode}: {last[:160]}", seconds)


@dataclass(frozen=True)
class Stage:
    """A run a survivor of the stages before meets: `name`, and either
    schedules (`seeds`, `orders`, `start`) or the corpus; its timeout."""

    name: str
    timeout: float | None
    seeds: int = 0
    orders: int = 0
    start: int = 1
    corpus: bool = False
    tests: tuple[str, ...] = ()

    def run(self, tree: Path) -> Outcome:
        if self.tests:
            return run_tests(tree, self.tests, self.timeout)
        if self.corpus:
            return run_corpus(tree, self.timeout)
        return run_sim(tree, self.seeds, self.orders, self.start, self.timeout)


def run_mutant(
    tree: Path,
    mutant: Mutant,
    seeds: int,
    orders: int,
    start: int,
    timeout: float | None,
    later: tuple[Stage, ...] = (),
) -> Outcome:
    """The fresh seeds first; a mutant they do not kill then meets each of
    the `later` stages in turn (a few large schedules, the regression
    corpus), and a kill there is marked as that stage's."""
    path = tree / mutant.file
    original = path.read_text(encoding="utf-8")
    path.write_text(mutated(original, mutant), encoding="utf-8")
    if mutant.tests:
        later = (*later, Stage("tests", timeout, tests=mutant.tests))
    try:
        outcome = run_sim(tree, seeds, orders, start, timeout)
        for stage in later:
            if outcome.kind != "clean":
                break
            spent = outcome.seconds
            outcome = stage.run(tree)
            outcome.seconds += spent
            outcome.stage = stage.name
    finally:
        path.write_text(original, encoding="utf-8")
    if outcome.kind == "clean":
        outcome.kind = "survived"
    return outcome


def verdict(outcome: Outcome) -> str:
    if outcome.kind == "killed":
        by = {
            "fresh": "",
            "large": " by a large schedule",
            "corpus": " by the corpus",
            "tests": " only by its direct tests",
        }
        return f"killed{by[outcome.stage]}: {outcome.detail}"
    if outcome.kind == "survived":
        return "SURVIVED"
    return f"{outcome.kind.upper()}: {outcome.detail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.mutate", description=__doc__)
    p.add_argument("--seeds", type=int, default=60, help="schedules per mutant")
    p.add_argument("--orders", type=int, default=3, help="orders per schedule")
    p.add_argument("--start", type=int, default=1, help="first seed")
    p.add_argument("--only", default="", help="comma-separated mutant names to run")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--all", action="store_true", help="also run the mutants marked equivalent")
    p.add_argument(
        "--large",
        type=int,
        # 40: sm-expiry-no-slack survived the fresh seeds and the first 20 at
        # 1,000 seeds; 50-order seed 900039 kills it.
        default=40,
        help="schedules of --large-orders orders a survivor of the fresh seeds then meets "
        "(0: none)",
    )
    p.add_argument("--large-orders", type=int, default=50)
    p.add_argument("--large-start", type=int, default=900001)
    p.add_argument(
        "--no-corpus",
        action="store_true",
        help="do not replay the regression corpus (python -m sim.corpus) against a mutant "
        "the fresh seeds leave alive",
    )
    p.add_argument(
        "--timeout-factor",
        type=float,
        default=4.0,
        help="a mutant's run stops as TIMEOUT after this many times the clean run's time",
    )
    args = p.parse_args(argv)

    try:
        mutants = load_mutants()
        if args.only:
            wanted = [n.strip() for n in args.only.split(",") if n.strip()]
            unknown = sorted(set(wanted) - {m.name for m in mutants})
            if unknown:
                raise Refused(f"no mutant named {', '.join(unknown)} (see --list)")
            mutants = [m for m in mutants if m.name in wanted]
        if args.list:
            for m in mutants:
                mark = f" [equivalent: {m.equivalent}]" if m.equivalent else ""
                print(f"{m.name:<38} {m.file:<36} {m.why}{mark}")
            return 0
        equivalent = [] if args.all or args.only else [m for m in mutants if m.equivalent]
        mutants = [m for m in mutants if m not in equivalent]
        with tempfile.TemporaryDirectory(prefix="sim-mutate-") as tmp:
            tree = copy_tree(ROOT, Path(tmp) / "tree")
            check_all(tree, mutants + equivalent)
            print(
                f"mutation run: {len(mutants)} mutants, seeds {args.start}.."
                f"{args.start + args.seeds - 1}, {args.orders} orders each; copy in {tree}"
            )
            clean = run_sim(tree, args.seeds, args.orders, args.start, None)
            if clean.kind != "clean":
                raise Refused(
                    f"the unmutated copy is not clean for these seeds ({verdict(clean)}): "
                    "fix that first, or choose other seeds (--start)"
                )
            print(f"clean run: {clean.detail} in {clean.seconds:.1f} s", flush=True)
            timeout = max(60.0, clean.seconds * args.timeout_factor)
            planned = []
            if args.large:
                planned.append(
                    Stage("large", None, args.large, args.large_orders, args.large_start)
                )
            if not args.no_corpus:
                planned.append(Stage("corpus", None, corpus=True))
            later = []
            for stage in planned:
                baseline = stage.run(tree)
                if baseline.kind != "clean":
                    raise Refused(
                        f"the unmutated copy is not clean in the {stage.name} stage "
                        f"({verdict(baseline)})"
                    )
                print(f"clean {stage.name}: {baseline.detail} in {baseline.seconds:.1f} s")
                timeout_of = max(60.0, baseline.seconds * args.timeout_factor)
                later.append(dataclasses.replace(stage, timeout=timeout_of))
            # Each mutant's direct tests pass on the unmutated copy, or a kill
            # by them would mean nothing.
            direct = tuple(sorted({t for m in mutants for t in m.tests}))
            if direct:
                baseline = run_tests(tree, direct, None)
                if baseline.kind != "clean":
                    raise Refused(
                        f"the unmutated copy fails the mutants' direct tests ({verdict(baseline)})"
                    )
                print(f"clean direct tests: {baseline.detail} in {baseline.seconds:.1f} s")
            results: list[tuple[Mutant, Outcome]] = []
            for i, mutant in enumerate(mutants, 1):
                outcome = run_mutant(
                    tree, mutant, args.seeds, args.orders, args.start, timeout, tuple(later)
                )
                results.append((mutant, outcome))
                print(
                    f"[{i}/{len(mutants)}] {mutant.name}: {verdict(outcome)} "
                    f"({outcome.seconds:.1f} s)",
                    flush=True,
                )
    except Refused as exc:
        print(f"mutate: refused: {exc}", file=sys.stderr)
        return 2

    width = max(len(m.name) for m, _ in results) if results else 6
    print()
    print(f"{'mutant':<{width}}  {'seconds':>7}  result")
    for mutant, outcome in results:
        print(f"{mutant.name:<{width}}  {outcome.seconds:>7.1f}  {verdict(outcome)}")
    survivors = [m for m, o in results if not o.killed]
    if survivors:
        print("\nsurvivors (a gap in the checks, or an equivalent mutant):")
        for m in survivors:
            print(f"  {m.name}: {m.file}: {m.why}")
    if equivalent:
        print(f"\nmarked equivalent, not run (--all runs them): {len(equivalent)}")
        for m in equivalent:
            print(f"  {m.name}: {m.equivalent}")
    killed = sum(o.killed for _, o in results)
    by_stage = {
        stage: sum(o.killed and o.stage == stage for _, o in results)
        for stage in ("fresh", "large", "corpus", "tests")
    }
    print(
        f"\nmutate: {killed}/{len(results)} killed "
        f"(seeds {args.seeds} from {args.start}, {args.orders} orders: {by_stage['fresh']}; "
        f"then {args.large} of {args.large_orders} orders: {by_stage['large']}; "
        f"then the regression corpus: {by_stage['corpus']}; "
        f"then only their direct tests: {by_stage['tests']})"
    )
    return 0 if not survivors else 1


if __name__ == "__main__":
    sys.exit(main())
