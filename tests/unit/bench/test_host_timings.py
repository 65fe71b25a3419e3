"""bench/host_timings.py sums what the probe's Timings wrote in each host."""

from __future__ import annotations

import json

import pytest

from bench import host_timings


def test_the_summary_adds_up_every_host_and_names_busy_links(tmp_path):
    calls = tmp_path / "cosmos-calls"
    calls.mkdir()
    for pid, (n, seconds, busy) in {1: (3, 0.3, 1), 2: (1, 0.5, 0)}.items():
        (calls / f"{pid}.timing").write_text(
            json.dumps(
                {
                    "sums": {
                        "send agent-requests n": n,
                        "send agent-requests s": seconds,
                        "send agent-requests found every link busy": busy,
                        "admission take n": 2,
                        "admission slots wanted": 20,
                        "admission slots granted": 10,
                        "admission take refused": 1,
                    },
                    "counts": [
                        {"at": 100.0 + pid, "counted": 5, "limit": 500, "rate": 2.0, "leased": 10}
                    ],
                }
            )
        )
    (calls / "1.json").write_text("{}")  # the caller counts beside them: not read

    lines = host_timings.summary(tmp_path)

    assert lines[0] == "2 host process(es)"
    assert "send agent-requests" in lines[1]
    assert "4  mean   200.0 ms" in lines[1]
    assert lines[1].endswith("found every link busy 25%")
    assert "4 takes, 20 of 40 slots granted, 2 refused" in lines[2]
    assert [line.split(":")[0] for line in lines[3:]] == ["  count +  0.0 s", "  count +  1.0 s"]


def test_a_run_without_timings_says_how_to_get_them(tmp_path):
    (tmp_path / "cosmos-calls").mkdir()
    with pytest.raises(SystemExit, match="HOST_TIMINGS=1"):
        host_timings.summary(tmp_path)
