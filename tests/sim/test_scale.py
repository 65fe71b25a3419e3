"""sim/scale.py: the chunked runs at scale (issue 21's 100,000 + 1,000 schedules)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sim import scale
from sim.scale import Chunk, Refused, Result, Run, parse_output, plan, remaining, summary


def _result(orders: int, start: int, count: int, **kw: object) -> Result:
    fields: dict[str, object] = dict(
        commit="abc",
        rc=0,
        seconds=10.0,
        schedules=count,
        violations=0,
        seeds=[],
        finished="2026-12-04T20:00:00+00:00",
    )
    fields.update(kw)
    return Result(orders=orders, start=start, count=count, **fields)  # type: ignore[arg-type]


def test_runs_are_cut_into_chunks_taken_in_turn_so_a_stopped_plan_has_some_of_each() -> None:
    chunks = plan([Run(1, 100, 5), Run(3, 1, 2)], chunk=2)
    assert [c.key for c in chunks] == [(1, 100, 2), (3, 1, 2), (1, 102, 2), (1, 104, 1)]


def test_chunks_of_long_schedules_are_fewer_schedules() -> None:
    chunks = plan([Run(1, 1, 6000), Run(50, 1, 300)])
    assert {c.count for c in chunks if c.orders == 1} == {2500, 1000}
    assert [c.count for c in chunks if c.orders == 50] == [150, 150]


def test_a_seed_planned_twice_for_one_order_count_is_refused() -> None:
    with pytest.raises(Refused, match="overlap"):
        plan([Run(1, 1, 10), Run(1, 10, 5)], chunk=5)
    assert len(plan([Run(1, 1, 10), Run(2, 1, 10)], chunk=5)) == 4  # other order counts


@pytest.mark.parametrize("text", ["1:2", "a:1:2", "0:1:5", "1:1:0", "1:-1:5"])
def test_a_malformed_run_is_one_clear_refusal(text: str) -> None:
    with pytest.raises(Refused, match="--run"):
        Run.parse(text)


def test_the_ledger_skips_finished_chunks_of_this_commit_only_and_reruns_a_dead_one() -> None:
    chunks = plan([Run(1, 1, 6)], chunk=2)
    done = [
        _result(1, 1, 2),
        _result(1, 3, 2, commit="other"),
        _result(1, 5, 2, schedules=-1, rc=-9),
    ]
    assert [c.start for c in remaining(chunks, done, "abc")] == [3, 5]


def test_the_output_gives_schedules_violations_and_every_failing_seed() -> None:
    out = [
        "VIOLATION seed 42: one order one record: detail",
        "  replay: python -m sim --seed 42",
        "VIOLATION seed 57: status reaches the reply queue: x",
        "simulate: 100 schedules, 2 violations",
    ]
    assert parse_output(out) == (100, 2, [42, 57])
    assert parse_output(["Traceback (most recent call last):"]) == (-1, 0, [])


def test_the_summary_merges_seed_ranges_and_names_violations_and_dead_chunks() -> None:
    results = [
        _result(1, 1, 2),
        _result(1, 3, 2, violations=1, seeds=[4]),
        _result(1, 9, 2),
        _result(3, 1, 2, schedules=-1, rc=1),
        _result(2, 1, 2, commit="other"),
    ]
    lines = summary(results, "abc")
    assert lines[0].startswith("  1 orders: 6 schedules (seeds 1-4, 9-10), 1 violations (seeds 4)")
    assert "died without a summary: 3-order seeds 1-2 (exit 1)" in lines
    assert lines[-1].startswith("scale at abc: 6 schedules, 1 violations")
    assert not any("2 orders" in line for line in lines)


def test_a_plan_runs_resumes_and_reports_from_its_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    argv = ["--run", "1:1:3", "--run", "2:1:2", "--chunk", "2", "--jobs", "2"]
    argv += ["--nice", "0", "--allow-dirty", "--ledger", str(ledger)]
    assert scale.main(argv) == 0
    rows = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert sorted((r["orders"], r["start"], r["count"]) for r in rows) == [
        (1, 1, 2),
        (1, 3, 1),
        (2, 1, 2),
    ]
    assert all(r["schedules"] == r["count"] and r["violations"] == 0 for r in rows)
    assert (tmp_path / "ledger" / f"{Chunk(2, 1, 2).name}.log").exists()
    out = capsys.readouterr().out
    assert "3 to run" in out
    assert ": 5 schedules, 0 violations" in out

    assert scale.main(argv) == 0  # again: nothing left to run
    assert len(ledger.read_text().splitlines()) == 3
    assert "0 to run" in capsys.readouterr().out

    ledger.write_text(
        ledger.read_text() + json.dumps({**rows[0], "violations": 1, "seeds": [1]}) + "\n"
    )
    assert scale.main(["--report", "--allow-dirty", "--ledger", str(ledger)]) == 1


def test_a_named_ledger_is_reported_for_its_own_commits_whatever_head_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "old.jsonl"
    rows = [_result(1, 1, 5, commit="0ld0ld0ld0ld"), _result(3, 1, 2, commit="0ld0ld0ld0ld")]
    ledger.write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in rows))
    assert scale.main(["--report", "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "scale at 0ld0ld0ld0ld: 7 schedules, 0 violations" in out

    newer = _result(2, 1, 4, commit="n3wn3wn3wn3w", violations=1, seeds=[3])
    ledger.write_text(ledger.read_text() + json.dumps(dataclasses.asdict(newer)) + "\n")
    assert scale.main(["--report", "--ledger", str(ledger)]) == 1
    out = capsys.readouterr().out
    assert "scale at 0ld0ld0ld0ld: 7 schedules, 0 violations" in out
    assert "scale at n3wn3wn3wn3w: 4 schedules, 1 violations" in out


def test_a_missing_or_empty_named_ledger_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert scale.main(["--report", "--ledger", str(tmp_path / "none.jsonl")]) == 2
    assert "no such ledger" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert scale.main(["--report", "--ledger", str(tmp_path / "empty.jsonl")]) == 2
    assert "holds no chunk" in capsys.readouterr().err


def test_a_chunk_that_died_and_ran_again_counts_as_it_ran_the_second_time() -> None:
    results = [_result(1, 1, 2, schedules=-1, rc=-9), _result(1, 1, 2)]
    assert [r.clean for r in scale.latest(results, "abc")] == [True]
    lines = summary(results, "abc")
    assert not any("died" in line for line in lines)
    assert lines[-1].startswith("scale at abc: 2 schedules, 0 violations")
