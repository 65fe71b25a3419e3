"""The mutation runner's own logic (sim/mutate.py): a mutant that does not
apply is refused, a mutant changes exactly one place, each of the runner's
verdicts (killed, crashed, timeout, clean) comes from what the simulation
printed, the worktree is never touched, and one real mutant is killed by the
real simulation."""

from __future__ import annotations

import difflib
import json
import sys
import textwrap
from pathlib import Path

import pytest

from sim import mutate
from sim.mutate import Mutant, Refused

ROOT = Path(__file__).resolve().parents[2]


def _mutant(**kw) -> Mutant:
    fields = {
        "name": "m",
        "file": "x.py",
        "original": "a < b",
        "replacement": "a <= b",
        "why": "test",
    }
    return Mutant(**{**fields, **kw})


def test_a_mutant_whose_text_is_not_found_is_refused():
    with pytest.raises(Refused, match=r"not found in x\.py"):
        mutate.mutated("if a > b:\n    pass\n", _mutant())


def test_a_mutant_whose_text_occurs_twice_is_refused():
    with pytest.raises(Refused, match="found 2 times"):
        mutate.mutated("if a < b:\n    x = a < b\n", _mutant())


def test_a_mutant_that_changes_nothing_is_refused():
    with pytest.raises(Refused, match="replacement is its original"):
        mutate.mutated("a < b", _mutant(replacement="a < b"))


def test_check_all_names_every_mutant_that_does_not_apply(tmp_path):
    (tmp_path / "x.py").write_text("if a < b:\n    pass\n")
    good = _mutant(name="good")
    gone = _mutant(name="gone", original="c < d")
    missing = _mutant(name="missing", file="nowhere.py")
    mutate.check_all(tmp_path, [good])
    with pytest.raises(Refused) as exc:
        mutate.check_all(tmp_path, [good, gone, missing])
    assert "gone" in str(exc.value)
    assert "missing" in str(exc.value)
    assert "good" not in str(exc.value)


def test_load_refuses_a_name_used_twice(tmp_path):
    entry = {"name": "twice", "file": "x.py", "original": "a", "replacement": "b", "why": "w"}
    path = tmp_path / "mutants.json"
    path.write_text(json.dumps([entry, entry]))
    with pytest.raises(Refused, match="twice"):
        mutate.load_mutants(path)


def test_every_mutant_in_the_list_applies_to_the_tree_and_changes_one_place():
    """Each mutant's original text is in its file exactly once (the code
    has not moved away from it) and the mutant changes one contiguous place
    of at most a few lines; names are distinct and each says why."""
    mutants = mutate.load_mutants()
    assert 20 <= len(mutants) <= 90  # each costs one simulation run per mutation run
    for m in mutants:
        text = (ROOT / m.file).read_text(encoding="utf-8")
        changed = mutate.mutated(text, m)
        before, after = text.splitlines(), changed.splitlines()
        blocks = [
            op
            for op in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes()
            if op[0] != "equal"
        ]
        assert len(blocks) == 1, m.name
        _, i1, i2, j1, j2 = blocks[0]
        assert max(i2 - i1, j2 - j1) <= 3, m.name
        assert m.why.strip(), m.name
        compile(changed, m.file, "exec")  # a slip, not a syntax error


def _fake_sim(tree: Path, body: str) -> Path:
    """A tree whose `python -m sim` is `body` (the runner's verdicts come
    only from what the simulation prints and its exit status)."""
    (tree / "sim").mkdir(parents=True)
    (tree / "sim" / "__init__.py").write_text("")
    (tree / "sim" / "__main__.py").write_text(textwrap.dedent(body))
    return tree


def test_a_violation_line_kills_and_stops_the_run(tmp_path):
    tree = _fake_sim(
        tmp_path,
        """
        import time
        print("workflow version: 2.1")
        print("VIOLATION seed 7: 2 side effect applied once: twice")
        time.sleep(60)
        print("simulate: 9 schedules, 1 violations")
        """,
    )
    outcome = mutate.run_sim(tree, 9, 1, 1, timeout=50)
    assert (outcome.kind, outcome.detail) == ("killed", "2 side effect applied once (seed 7)")
    assert outcome.seconds < 40  # stopped at the line, not after the sleep


def test_a_clean_summary_is_clean_and_a_traceback_is_a_crash(tmp_path):
    clean = _fake_sim(tmp_path / "clean", 'print("simulate: 9 schedules, 0 violations")\n')
    assert mutate.run_sim(clean, 9, 1, 1, timeout=50).kind == "clean"
    crash = _fake_sim(tmp_path / "crash", 'raise RuntimeError("boom in the product")\n')
    outcome = mutate.run_sim(crash, 9, 1, 1, timeout=50)
    assert outcome.kind == "crashed"
    assert "boom in the product" in outcome.detail
    assert outcome.killed


def test_a_run_that_hangs_silently_is_a_timeout(tmp_path):
    tree = _fake_sim(tmp_path, "import time\ntime.sleep(60)\n")
    outcome = mutate.run_sim(tree, 9, 1, 1, timeout=1)
    assert outcome.kind == "timeout"
    assert outcome.killed
    assert outcome.seconds < 30


def test_a_mutant_runs_on_the_copy_and_is_undone_after(tmp_path):
    """The mutated file is what the simulation sees, and the copy is itself
    again afterwards."""
    tree = _fake_sim(
        tmp_path,
        """
        from pathlib import Path
        if "a <= b" in Path("x.py").read_text():
            print("VIOLATION seed 3: mutated: seen")
        else:
            print("simulate: 1 schedules, 0 violations")
        """,
    )
    (tree / "x.py").write_text("if a < b:\n    pass\n")
    outcome = mutate.run_mutant(tree, _mutant(), 1, 1, 1, timeout=50)
    assert (outcome.kind, outcome.detail) == ("killed", "mutated (seed 3)")
    assert (tree / "x.py").read_text() == "if a < b:\n    pass\n"
    with pytest.raises(Refused):
        mutate.run_mutant(tree, _mutant(original="a > b", replacement="a >= b"), 1, 1, 1, 50)
    assert (tree / "x.py").read_text() == "if a < b:\n    pass\n"


def test_a_mutant_the_fresh_seeds_miss_meets_the_corpus_and_its_kill_is_marked(tmp_path):
    """Fresh seeds first; only a survivor replays the regression corpus, and
    a kill there is shown as the corpus's, not the fresh seeds'."""
    tree = _fake_sim(
        tmp_path,
        """
        from pathlib import Path
        Path("fresh-ran").write_text("")
        print("simulate: 1 schedules, 0 violations")
        """,
    )
    (tree / "sim" / "corpus.py").write_text(
        textwrap.dedent(
            """
            from pathlib import Path
            if "a <= b" in Path("x.py").read_text():
                print("VIOLATION seed 5000216: rejected order not kept: ORD-1")
            else:
                print("simulate: 1 schedules, 0 violations")
            """
        )
    )
    (tree / "x.py").write_text("if a < b:\n    pass\n")
    corpus = mutate.Stage("corpus", 50, corpus=True)
    outcome = mutate.run_mutant(tree, _mutant(), 1, 1, 1, timeout=50, later=(corpus,))
    assert (tree / "fresh-ran").exists()
    assert (outcome.kind, outcome.stage) == ("killed", "corpus")
    assert mutate.verdict(outcome) == "killed by the corpus: rejected order not kept (seed 5000216)"
    # Without the corpus stage the same mutant survives.
    alone = mutate.run_mutant(tree, _mutant(), 1, 1, 1, timeout=50)
    assert (alone.kind, alone.stage) == ("survived", "fresh")
    assert mutate.run_corpus(tree, timeout=50).kind == "clean"  # the file is restored


@pytest.mark.slow
def test_a_real_mutant_is_killed_by_the_real_simulation_and_the_worktree_is_untouched(tmp_path):
    """The reply bridge raising events under the step's name (not the
    step-and-attempt name the workflow waits for): no reply reaches its
    attempt, so every order ends Error after its retries; the path check
    that every reply event names its instance and attempt sees the first
    such raise (before it, only the fault-free schedules' check saw it)."""
    before = {p: p.read_bytes() for p in (ROOT / "orchestrators").glob("*.py")}
    tree = mutate.copy_tree(ROOT, tmp_path / "tree")
    assert not (tree / ".git").exists()
    assert not (tree / ".venv").exists()
    (mutant,) = [m for m in mutate.load_mutants() if m.name == "bridge-event-named-by-step"]
    outcome = mutate.run_mutant(tree, mutant, 2, 1, 35, timeout=240)
    assert outcome.kind == "killed", outcome
    assert "every reply event an instance takes names that instance and attempt" in outcome.detail
    assert {p: p.read_bytes() for p in (ROOT / "orchestrators").glob("*.py")} == before
    clean = mutate.run_sim(tree, 2, 1, 35, timeout=240, python=sys.executable)
    assert clean.kind == "clean", clean


def _simulate(seed: int, options):
    from sim.system import Simulation, simulate

    sim = simulate(Simulation(seed, options.orders, options=options))
    sim.check()
    return sim


@pytest.mark.slow
def test_compensations_that_keep_dying_spend_the_restarts_then_wait_and_the_budget_is_checked():
    """The world feature that kills `sm-restart-budget-off-by-one`: every
    order is declined, and each compensation's first five executions die.
    The Starter restarts each up to MAX_COMPENSATION_RESTARTS times, then
    gives it a long retry, and every order still ends; the per-write check
    sees a restart past the budget (planted by hand below)."""
    import asyncio

    from domain.state_machine import MAX_COMPENSATION_RESTARTS
    from sim.system import Options
    from sim.world import FaultConfig

    options = Options(orders=2, compensation_deaths=5, faults=FaultConfig(decline=1.0))
    sim = _simulate(11, options)
    assert sim.violations == []
    assert sim.world.counters["compensation_died"] >= MAX_COMPENSATION_RESTARTS + 1
    # More deaths than restarts: the long retry took over, and was counted.
    assert sim.rows["8a"] > MAX_COMPENSATION_RESTARTS
    assert any((d.get("CompensationLongRetries") or 0) >= 1 for d in sim.state_c.docs.values())
    old = {"id": "o", "ProcessState": "Compensating", "CompensationRestarts": 3}

    async def planted() -> None:  # as the Starter's write would land
        sim._on_state_write(old, {**old, "CompensationRestarts": MAX_COMPENSATION_RESTARTS + 1})

    asyncio.new_event_loop().run_until_complete(planted())
    assert [c for c, _ in sim.violations] == ["compensation restarts bounded"]


def test_the_direct_tests_stage_reads_pytest_verdicts(tmp_path):
    """A mutant's own tests (`tests` in sim/mutants.json): a failing test
    kills it, passing tests leave it clean, nothing collected is a crash."""
    (tmp_path / "test_x.py").write_text(
        "def test_ok():\n    assert True\n\ndef test_bad():\n    assert 1 == 2\n"
    )
    killed = mutate.run_tests(tmp_path, ("test_x.py::test_bad",), 120)
    assert killed.kind == "killed"
    assert "test_bad" in killed.detail
    assert mutate.run_tests(tmp_path, ("test_x.py::test_ok",), 120).kind == "clean"
    assert mutate.run_tests(tmp_path, ("test_x.py::test_none",), 120).kind == "crashed"


def test_a_mutant_names_its_direct_tests_by_existing_files():
    for m in mutate.load_mutants():
        for node in m.tests:
            assert (ROOT / node.partition("::")[0]).is_file(), (m.name, node)
