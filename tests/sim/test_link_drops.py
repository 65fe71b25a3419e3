"""Dropped links (sim/world.py FaultConfig.link_drops): a send accepted with
its answer lost is, a few times per schedule, the start of a dropped
connection, so the retries of that very send fail too. Drawn from a stream
of its own, absent from the worlds older regression seeds replay."""

from __future__ import annotations

from dataclasses import replace

from sim.system import Simulation, options_for, simulate


def test_link_drops_are_drawn_from_their_own_stream_and_only_for_new_seeds():
    drawn = [options_for(seed, 3) for seed in range(1, 201)]
    counts = [o.faults.link_drops for o in drawn]
    assert set(counts) <= {0, 1, 2, 4}
    assert 40 <= sum(1 for c in counts if c) <= 110  # one fallible schedule in two
    for seed, o in zip(range(1, 201), drawn, strict=True):
        without = options_for(seed, 3, link_drops=False)
        assert without.faults.link_drops == 0
        # Every other draw of the seed is what it was.
        assert replace(o, faults=replace(o.faults, link_drops=0)) == without


def test_a_lost_send_answer_drops_the_link_a_bounded_number_of_times():
    def run(drops: int):
        options = options_for(5, 3)
        # No other Service Bus outage: every bus call found down is in a dropped link's window.
        faults = replace(options.faults, send_lost=0.5, link_drops=drops, bus_blips=0)
        return simulate(Simulation(5, 3, options=replace(options, faults=faults))).world

    world = run(2)
    drops = [line for line in world.trace if "bus link dropped after" in line]
    assert 1 <= len(drops) <= 2, drops
    # The bus calls in those windows failed as in an outage; without drops none did.
    assert world.counters["bus_outage"] > 0
    assert run(0).counters["bus_outage"] == 0
