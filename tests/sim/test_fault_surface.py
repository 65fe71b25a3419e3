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
    assert len(replace) == 1
    assert replace[0].function == "CosmosStateStore.replace"
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
    import asyncio
    import logging

    from sim.system import Simulation

    logging.disable(logging.CRITICAL)
    sim = Simulation(seed, options.orders, options=options)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(sim.run())
    finally:
        loop.close()
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
