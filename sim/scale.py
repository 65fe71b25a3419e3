"""`python -m sim.scale --run K:START:COUNT ...`: the simulation at scale (issue 21's
100,000 short schedules and 1,000 of 50 orders), on one commit, in chunks.

Each `--run` is a range of seeds of K orders; it is cut into chunks (`--chunk`
schedules, or `chunk_size`), the runs' chunks interleaved, and `--jobs` chunks
run at a time, each as `python -m sim --seeds N --start S --orders K
--no-shrink` under `nice` in a process group of its own (so stopping the run
stops its own simulations and no one else's). Every finished chunk appends one JSON line to the ledger
(`.sim-scale/<commit>.jsonl` unless `--ledger`): commit, orders, seeds, exit
status, seconds, schedules, violations and the failing seeds, each chunk's log
beside it. A run started again with the same plan skips the chunks its ledger
already holds, so a stopped run resumes where it was; `--report` only prints
the ledger's summary (of HEAD's commit; with `--ledger`, of every commit that
ledger holds, whatever HEAD is now). The tree must be clean (tracked files as
committed), or the figures would not be of that commit; `--allow-dirty`
records the commit with `-dirty`. Exit status: 0 when every chunk ran clean, 1 when one found a
violation or died without its summary line, 2 when the plan or the tree was
refused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from .mutate import SUMMARY, VIOLATION

ROOT = Path(__file__).resolve().parent.parent


class Refused(Exception):
    """The plan or the tree cannot be run as asked."""


@dataclass(frozen=True)
class Run:
    """Seeds `start`..`start + count - 1`, each a schedule of `orders` orders."""

    orders: int
    start: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Run:
        try:
            orders, start, count = (int(part) for part in text.split(":"))
        except ValueError:
            raise Refused(f"--run {text!r}: expected ORDERS:START:COUNT, three integers") from None
        if orders < 1 or start < 0 or count < 1:
            raise Refused(f"--run {text!r}: orders and count at least 1, start at least 0")
        return cls(orders, start, count)


@dataclass(frozen=True)
class Chunk:
    orders: int
    start: int
    count: int

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.orders, self.start, self.count)

    @property
    def name(self) -> str:
        return f"o{self.orders}-{self.start}"

    def label(self) -> str:
        last = self.start + self.count - 1
        return f"{self.orders}-order seeds {self.start}-{last}"


@dataclass
class Result:
    """One ledger line: a chunk as it ran."""

    commit: str
    orders: int
    start: int
    count: int
    rc: int
    seconds: float
    schedules: int
    violations: int
    seeds: list[int]
    finished: str

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.orders, self.start, self.count)

    @property
    def clean(self) -> bool:
        return self.schedules == self.count and self.violations == 0 and not self.seeds


def chunk_size(orders: int) -> int:
    """Schedules per chunk unless `--chunk` says: 2,500 short schedules (5 to
    10 minutes of a core), fewer of more orders (150 of 50: about as long)."""
    return 2500 if orders <= 3 else max(10, 7500 // orders)


def plan(runs: Sequence[Run], chunk: int | None = None) -> list[Chunk]:
    """Every run cut into chunks of at most `chunk` schedules (by default
    `chunk_size`), the runs' chunks taken in turn (so a stopped plan has some
    of each), refused when two runs share a seed of the same order count."""
    if chunk is not None and chunk < 1:
        raise Refused("--chunk must be at least 1")
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a.orders == b.orders and a.start < b.start + b.count and b.start < a.start + a.count:
                raise Refused(f"runs {a} and {b} overlap: a seed would run twice")
    queues = []
    for r in runs:
        size = chunk or chunk_size(r.orders)
        end = r.start + r.count
        queues.append([Chunk(r.orders, s, min(size, end - s)) for s in range(r.start, end, size)])
    out: list[Chunk] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def read_ledger(path: Path) -> list[Result]:
    if not path.exists():
        return []
    results = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            results.append(Result(**json.loads(line)))
        except (TypeError, ValueError) as exc:
            raise Refused(f"{path}:{number}: not a ledger line ({exc})") from None
    return results


def remaining(chunks: Iterable[Chunk], done: Iterable[Result], commit: str) -> list[Chunk]:
    """The chunks the ledger does not hold a finished run of on `commit`
    (a chunk that died without its summary line runs again)."""
    have = {r.key for r in done if r.commit == commit and r.schedules == r.count}
    return [c for c in chunks if c.key not in have]


def parse_output(lines: Iterable[str]) -> tuple[int, int, list[int]]:
    """(schedules, violations, failing seeds) from a `python -m sim` output;
    schedules -1 when its summary line never came."""
    schedules, violations, seeds = -1, 0, []
    for line in lines:
        hit = VIOLATION.match(line)
        if hit:
            seeds.append(int(hit.group(1)))
        summary = SUMMARY.match(line)
        if summary:
            schedules, violations = int(summary.group(1)), int(summary.group(2))
    return schedules, violations, seeds


def _ranges(starts: Iterable[tuple[int, int]]) -> str:
    spans: list[list[int]] = []
    for start, count in sorted(starts):
        if spans and spans[-1][1] + 1 == start:
            spans[-1][1] = start + count - 1
        else:
            spans.append([start, start + count - 1])
    return ", ".join(f"{a}-{b}" for a, b in spans)


def latest(results: Iterable[Result], commit: str) -> list[Result]:
    """Each chunk's last run on `commit` (a chunk that died and ran again
    counts as it ran the second time)."""
    last: dict[tuple[int, int, int], Result] = {}
    for r in results:
        if r.commit == commit:
            last[r.key] = r
    return list(last.values())


def summary(results: Sequence[Result], commit: str) -> list[str]:
    """One line per order count (schedules, seed ranges, violations and their
    seeds, the chunks' time and rate), then the total: each chunk as it last ran."""
    results = latest(results, commit)
    mine = [r for r in results if r.schedules >= 0]
    lines = []
    total = sum(r.schedules for r in mine)
    bad = sum(r.violations for r in mine)
    for orders in sorted({r.orders for r in mine}):
        rs = [r for r in mine if r.orders == orders]
        n = sum(r.schedules for r in rs)
        seconds = sum(r.seconds for r in rs)
        seeds = sorted({s for r in rs for s in r.seeds})
        lines.append(
            f"{orders:>3} orders: {n:,} schedules (seeds {_ranges((r.start, r.count) for r in rs)}), "
            f"{sum(r.violations for r in rs)} violations"
            + (f" (seeds {', '.join(map(str, seeds))})" if seeds else "")
            + f"; {len(rs)} chunks, {seconds / 3600:.2f} chunk-hours, {n / seconds:.1f} schedules/s per chunk"
        )
    died = [r for r in results if r.schedules < 0]
    for r in died:
        lines.append(
            f"died without a summary: {Chunk(r.orders, r.start, r.count).label()} (exit {r.rc})"
        )
    wall = ""
    if mine:
        ends = [datetime.fromisoformat(r.finished) for r in mine]
        first = min(e.timestamp() - r.seconds for e, r in zip(ends, mine, strict=True))
        wall = f", {(max(ends).timestamp() - first) / 60:.0f} min from the first chunk's start to the last's end"
    lines.append(f"scale at {commit}: {total:,} schedules, {bad} violations{wall}")
    return lines


def _commit(tree: Path, allow_dirty: bool) -> str:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise Refused(f"git {' '.join(args)} failed in {tree}: {out.stderr.strip()}")
        return out.stdout.strip()

    commit = git("rev-parse", "--short=12", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no"):
        if not allow_dirty:
            raise Refused(
                "tracked files differ from HEAD: the figures would not be of one commit "
                "(commit, or run in a worktree of the commit: git worktree add --detach DIR COMMIT; "
                "--allow-dirty records the commit as <commit>-dirty)"
            )
        commit += "-dirty"
    return commit


def _report_ledger(ledger: Path) -> int:
    """`--report --ledger F`: the summary of each commit the ledger holds, in
    the order it first ran, whatever HEAD is now (a ledger of an older commit
    is read after HEAD has moved on, or from another worktree)."""
    if not ledger.exists():
        raise Refused(f"{ledger}: no such ledger")
    done = read_ledger(ledger)
    commits = list(dict.fromkeys(r.commit for r in done))
    if not commits:
        raise Refused(f"{ledger}: the ledger holds no chunk")
    return _report(done, commits)


def _report(done: Sequence[Result], commits: Iterable[str]) -> int:
    """Prints each commit's summary; 0 when every chunk of them ran clean."""
    clean = True
    for commit in commits:
        print("\n".join(summary(done, commit)))
        clean = clean and all(r.clean for r in latest(done, commit))
    return 0 if clean else 1


class Runner:
    """Runs chunks as subprocesses of its own, each in its own process group."""

    def __init__(self, tree: Path, ledger: Path, commit: str, nice: int, python: str) -> None:
        self.tree, self.ledger, self.commit, self.nice, self.python = (
            tree,
            ledger,
            commit,
            nice,
            python,
        )
        self.logs = ledger.with_suffix("")
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self.stopping = threading.Event()

    def run(self, chunk: Chunk) -> Result | None:
        if self.stopping.is_set():
            return None
        cmd = [self.python, "-m", "sim", "--seeds", str(chunk.count), "--start", str(chunk.start)]
        cmd += ["--orders", str(chunk.orders), "--no-shrink"]
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{chunk.name}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTHONPATH", None)
        began = time.monotonic()
        if self.nice:  # coreutils' nice execs the simulation: same pid, same group
            cmd = ["nice", "-n", str(self.nice), *cmd]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=self.tree,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            with self._lock:
                self._procs.add(proc)
            try:
                rc = proc.wait()
            finally:
                with self._lock:
                    self._procs.discard(proc)
        if self.stopping.is_set():
            return None
        schedules, violations, seeds = parse_output(
            log.read_text(encoding="utf-8", errors="replace").splitlines()
        )
        result = Result(
            self.commit,
            chunk.orders,
            chunk.start,
            chunk.count,
            rc,
            round(time.monotonic() - began, 1),
            schedules,
            violations,
            seeds,
            datetime.now(UTC).isoformat(timespec="seconds"),
        )
        with self._lock, self.ledger.open("a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(result)) + "\n")
        return result

    def stop(self) -> None:
        """Stop this run's own simulations (their process groups), nobody else's."""
        self.stopping.set()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _line(result: Result) -> str:
    chunk = Chunk(result.orders, result.start, result.count)
    if result.schedules < 0:
        verdict = f"died without a summary (exit {result.rc})"
    else:
        verdict = f"{result.violations} violations"
        if result.seeds:
            verdict += f" (seeds {', '.join(map(str, result.seeds))})"
    return f"{chunk.label()}: {verdict} in {result.seconds:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sim.scale",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    parser.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="ORDERS:START:COUNT",
        help="COUNT schedules of ORDERS orders from seed START (repeatable)",
    )
    parser.add_argument(
        "--chunk", type=int, help="schedules per chunk (default 2,500, or 7,500 orders' worth)"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="chunks at a time")
    parser.add_argument(
        "--nice", type=int, default=19, help="niceness of the simulations (0: none)"
    )
    parser.add_argument(
        "--ledger", type=Path, help="the ledger file (default .sim-scale/<commit>.jsonl)"
    )
    parser.add_argument(
        "--report", action="store_true", help="print the ledger's summary, run nothing"
    )
    parser.add_argument("--allow-dirty", action="store_true", help="run on uncommitted changes")
    args = parser.parse_args(argv)
    try:
        if args.report and args.ledger:
            return _report_ledger(args.ledger)
        commit = _commit(ROOT, args.allow_dirty)
        ledger = args.ledger or ROOT / ".sim-scale" / f"{commit}.jsonl"
        ledger.parent.mkdir(parents=True, exist_ok=True)
        done = read_ledger(ledger)
        if args.report:
            return _report(done, [commit])
        if not args.run:
            raise Refused("nothing to run: give --run ORDERS:START:COUNT (or --report)")
        if args.jobs < 1:
            raise Refused("--jobs must be at least 1")
        chunks = plan([Run.parse(r) for r in args.run], args.chunk)
    except Refused as exc:
        print(f"sim.scale: {exc}", file=sys.stderr)
        return 2
    todo = remaining(chunks, done, commit)
    print(
        f"scale at {commit}: {len(chunks)} chunks, {len(chunks) - len(todo)} already in {ledger}, "
        f"{len(todo)} to run, {args.jobs} at a time",
        flush=True,
    )
    runner = Runner(ROOT, ledger, commit, args.nice, sys.executable)
    began = time.monotonic()
    finished = 0
    pool = ThreadPoolExecutor(max_workers=args.jobs)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for future in as_completed([pool.submit(runner.run, chunk) for chunk in todo]):
            result = future.result()
            if result is None:
                continue
            finished += 1
            print(f"[{finished}/{len(todo)}] {_line(result)}", flush=True)
    except KeyboardInterrupt:
        runner.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        print("stopped: its own simulations terminated; run again to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    pool.shutdown()
    wall = time.monotonic() - began
    results = read_ledger(ledger)
    print("\n".join(summary(results, commit)))
    print(f"this run: {finished} chunks in {wall / 60:.1f} min of wall time")
    return 0 if all(r.clean for r in latest(results, commit)) else 1


if __name__ == "__main__":
    sys.exit(main())
