"""No hot partition (issue 23 item 3, docs/adr/019b-sharded-recovery-index.md):
writes per recovery-index partition key per simulated second, with the real
adapter on the simulation's Cosmos fake (sim/partitions.py), as the order
rate grows tenfold. The simulation's schedules (three orders) are too small
for that load; `drive_index` claims the orders at a fixed rate instead."""

from __future__ import annotations

import pytest

from sim.partitions import drive_index

RATE = 20  # orders per simulated second, then ten times as many
SECONDS = 30


@pytest.fixture(scope="module")
def loads():
    return {
        (rate, shards): drive_index(rate, shards, seconds=SECONDS).summary
        for rate, shards in ((RATE, 1), (10 * RATE, 1), (RATE, 4), (10 * RATE, 40), (10 * RATE, 16))
    }


def test_unsharded_the_one_key_takes_ten_times_the_writes(loads):
    low, high = loads[(RATE, 1)], loads[(10 * RATE, 1)]
    assert low["keys"] == high["keys"] == 1  # every deadline of the run in one minute
    assert high["mean_per_key_second"] >= 8 * low["mean_per_key_second"]


def test_with_the_shards_sized_for_the_rate_writes_per_key_stay_flat(loads):
    """Ten times the orders over ten times the shards: the same writes per
    key and second (mean and peak), the rate spread over ten times the keys."""
    low, high = loads[(RATE, 4)], loads[(10 * RATE, 40)]
    assert high["writes_per_second"] >= 8 * low["writes_per_second"]
    assert high["keys"] == 10 * low["keys"]
    assert 0.8 <= high["mean_per_key_second"] / low["mean_per_key_second"] <= 1.25
    # The peak is a discard batch (up to 25 deletes of one partition in one
    # request) plus the adds of that second: bounded by the batch, not the rate.
    assert high["peak_per_key_second"] <= 1.5 * low["peak_per_key_second"]


def test_a_fixed_count_divides_the_load_of_the_one_key(loads):
    """The default 16 shards at the higher rate: each key takes about a
    sixteenth of what the unsharded key took, so the index's hot-partition
    ceiling is 16 times one partition's (bench/capacity.py)."""
    one, sixteen = loads[(10 * RATE, 1)], loads[(10 * RATE, 16)]
    assert sixteen["keys"] == 16
    ratio = sixteen["mean_per_key_second"] / one["mean_per_key_second"]
    assert 1 / 16 / 1.25 <= ratio <= 1 / 16 * 1.25


def test_a_schedule_reports_its_index_partition_peak():
    """`python -m sim --scan index` runs every schedule with the index
    Supervisor; each reports the most writes one index key took in one
    simulated second (printed per run by `python -m sim`)."""
    from sim.system import options_for, run_schedule

    seed = next(s for s in range(1, 50) if options_for(s, 1).scan == "query")
    result = run_schedule(seed, 1, scan="index")
    assert result.options.scan == "index"
    assert not result.violations
    assert result.counters["index partition-second peak"] >= 1
