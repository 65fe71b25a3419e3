"""The fault surface (`python -m sim --fault-surface`, sim/surface.py): the
static scan of the product's SDK call sites, the attribution of injected
faults to them during a run, and the gaps."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sim import surface, world
from sim.__main__ import main
from sim.system import run_schedule


@pytest.fixture
def recorder():
    rec = surface.install()
    try:
        yield rec
    finally:
        surface.uninstall()


def test_scan_finds_the_state_stores_replace_and_no_simulator_or_test_code() -> None:
    sites = surface.scan()
    replace = [
        s for s in sites if s.path == "adapters/state_store.py" and s.method == "replace_item"
    ]
    # The record's replace and the admission document's (domain.admission).
    assert {s.function for s in replace} == {
        "CosmosStateStore.replace",
        "CosmosStateStore.write_admission",
    }
    replace = [s for s in replace if s.function == "CosmosStateStore.replace"]
    assert replace[0].service == "cosmos write"
    assert "throttle_429" in replace[0].applicable
    services = {s.service for s in sites}
    assert {"cosmos write", "cosmos read", "servicebus send", "durable", "http"} <= services
    tops = {s.path.split("/", 1)[0] for s in sites}
    assert not tops & {"sim", "tests", "devstack", "bench", "console"}


def _plant(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_a_planted_call_site_never_exercised_is_all_gaps(tmp_path: Path) -> None:
    _plant(
        tmp_path,
        "adapters/planted.py",
        """\
        class Planted:
            async def write(self, doc, settings):
                settings.get("x")  # a dict, not an HTTP session
                await self._container.replace_item(doc["id"], doc)
                async with self._session.get("https://example.invalid") as answer:
                    return answer
        """,
    )
    _plant(tmp_path, "sim/fake.py", "async def f(c):\n    await c.replace_item('a', {})\n")
    _plant(tmp_path, "tests/t.py", "async def f(c):\n    await c.upsert_item({})\n")
    sites = surface.scan(tmp_path)
    assert [(s.path, s.line, s.function, s.method) for s in sites] == [
        ("adapters/planted.py", 4, "Planted.write", "replace_item"),
        ("adapters/planted.py", 5, "Planted.write", "get"),
    ]
    lines, gaps = surface.report(sites, surface.Recorder(root=tmp_path))
    assert gaps == len(surface.APPLICABLE["cosmos write"]) + len(surface.APPLICABLE["http"])
    assert lines[-1] == f"fault surface: 2 call sites, {gaps} gaps"
    assert (
        "      missing: throttle_429 crash crash_after cosmos_503 cosmos_outage "
        "cosmos_timeout_after" in lines
    )


def test_a_short_run_attributes_faults_to_real_product_call_sites(recorder) -> None:
    for seed in (1, 2, 3):
        run_schedule(seed, 3)
    sites = surface.scan()
    by_site, _ = surface.resolve(sites, recorder)
    hit = {s: kinds for s, kinds in by_site.items() if kinds}
    assert hit, "no fault was attributed to any SDK call site"
    for site, kinds in hit.items():
        # a kind only lands where it can happen (a Durable failure never on a Cosmos call)
        assert set(kinds) <= set(site.applicable), (site.label(), kinds)
        assert (surface.ROOT / site.path).is_file()
    assert any(s.service.startswith("cosmos") for s in hit)
    assert any(s.service == "durable" for s in hit)


def test_attribution_leaves_the_schedule_unchanged() -> None:
    plain = run_schedule(2, 3)
    surface.install()
    try:
        watched = run_schedule(2, 3)
    finally:
        surface.uninstall()
    assert world.SURFACE is None
    assert watched.trace == plain.trace
    assert [f.line() for f in watched.faults] == [f.line() for f in plain.faults]


def test_no_seeds_every_call_site_is_a_gap_and_strict_fails(capsys) -> None:
    sites = surface.scan()
    expected = sum(len(s.applicable) for s in sites)
    assert main(["--seeds", "0", "--fault-surface"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"fault surface: {len(sites)} call sites, {expected} gaps"
    assert main(["--seeds", "0", "--fault-surface=strict"]) == 1
    assert world.SURFACE is None


def _simulate(seed: int, options):
    from sim.system import Simulation, simulate

    sim = simulate(Simulation(seed, options.orders, options=options))
    sim.check()
    return sim


def test_the_host_start_records_the_shard_count_and_the_bookkeeping_skips_it() -> None:
    """The host's start runs ensure_shard_count as bootstrap does (index
    mode): its `~config` document lands in the index container, and the
    simulation's index bookkeeping (which reads entries' OrderID) skips it
    instead of failing with a KeyError."""
    from sim.system import Options
    from sim.world import FaultConfig

    # (seed 7: the host starts before the fault-free schedule is over)
    sim = _simulate(7, Options(orders=3, scan="index", faults=FaultConfig(host_start=True)))
    assert sim.violations == []
    doc = sim.index_c.docs[("~config", "shard-count")]
    assert doc["shards"] == sim.index_shards
    assert any("host started" in line for line in sim.world.trace)


def _site(path: str, method: str) -> surface.Site:
    (site,) = [
        s
        for s in surface.scan()
        if s.path == path
        and s.method == method
        # (the admission document's own replace is another site of the same method)
        and s.function != "CosmosStateStore.write_admission"
    ]
    return site


@pytest.mark.parametrize(
    ("path", "method", "kind"),
    [
        ("adapters/state_store.py", "replace_item", "crash"),
        ("adapters/state_store.py", "replace_item", "crash_after"),
        ("adapters/state_store.py", "replace_item", "cosmos_outage"),
        ("adapters/state_store.py", "replace_item", "cosmos_timeout_after"),
        ("adapters/state_store.py", "create_if_absent", "throttle_429"),
    ],
)
def test_a_target_forces_its_kind_at_the_sites_first_call(recorder, path, method, kind) -> None:
    """The targeted pass's forcing: the kind lands at that site (the
    recorder attributes it there), once, and the trace says it was forced."""
    if method == "create_if_absent":
        (site,) = [
            s
            for s in surface.scan()
            if s.path == path and s.function == "CosmosStateStore.create_if_absent"
        ]
    else:
        site = _site(path, method)
    plain = run_schedule(1, 3)
    before, _ = surface.resolve(surface.scan(), recorder)
    recorder.seed = 1
    recorder.target = surface.Target(site, kind)
    forced = run_schedule(1, 3)
    assert recorder.target.done
    after, _ = surface.resolve(surface.scan(), recorder)
    assert after[site][kind] > before[site][kind], (kind, after[site])
    assert any("targeted" in f.detail for f in forced.faults)
    assert [f.line() for f in forced.faults] != [f.line() for f in plain.faults]


def test_a_run_records_which_seeds_reached_each_site(recorder) -> None:
    recorder.seed = 4
    run_schedule(4, 3)
    reached = surface.reached_sites(surface.scan(), recorder)
    assert reached[_site("adapters/state_store.py", "replace_item")] == [4]
    assert all(seeds == [4] for seeds in reached.values())


def test_a_bad_target_is_refused_with_what_would_do() -> None:
    sites = surface.scan()
    site = _site("adapters/state_store.py", "replace_item")
    assert surface.parse_target(f"{site.path}:{site.line}:crash", sites).site == site
    with pytest.raises(ValueError, match="expected path:line:kind"):
        surface.parse_target("adapters/state_store.py:crash", sites)
    with pytest.raises(ValueError, match="no SDK call site"):
        surface.parse_target("adapters/state_store.py:1:crash", sites)
    with pytest.raises(ValueError, match="cannot be forced there"):
        surface.parse_target(f"{site.path}:{site.line}:decline", sites)
    http = _site("agents/remote_client.py", "post")
    # a downstream outage is a window of the world, not one call's fault
    with pytest.raises(ValueError, match=r"applicable: .*odd_answer"):
        surface.parse_target(f"{http.path}:{http.line}:outage", sites)


def test_the_targeted_pass_covers_what_the_seeds_left(capsys) -> None:
    """Three seeds leave most (site, kind) pairs uncovered; the pass replays
    schedules that reached each site with the kind forced, under every
    check, and the listing's gaps fall by what it injected."""
    assert main(["--seeds", "3", "--fault-surface"]) == 0
    out = capsys.readouterr().out.splitlines()
    (line,) = [x for x in out if x.startswith("targeted pass: ")]
    wanted = int(line.split()[2])
    injected = int(line.split(", ")[2].split()[0])
    assert injected > 0
    assert ", 0 violations" in line
    gaps = int(out[-1].split()[-2])
    assert gaps <= sum(len(s.applicable) for s in surface.scan()) - injected
    assert gaps < wanted
    assert world.SURFACE is None


def test_the_replay_command_of_a_targeted_schedule_forces_it_again(capsys) -> None:
    site = _site("adapters/state_store.py", "replace_item")
    assert main(["--seed", "1", "--target", f"{site.path}:{site.line}:crash"]) == 0
    out = capsys.readouterr().out
    assert "\ntarget adapters/state_store.py:" in out
    assert "crash" in out
    assert "(targeted)" in out
    assert world.SURFACE is None
    with pytest.raises(SystemExit):
        main(["--seed", "1", "--target", "nowhere.py:1:crash"])
