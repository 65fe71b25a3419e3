"""bench/probe/sitecustomize.py: a process started as the pipeline bench
starts its hosts counts every Cosmos request the product records by caller
and kind, with nothing of it in the product."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.pipeline_bench import caller_counts, caller_probe

SCRIPT = """
from adapters.cosmos_client import RequestCharges

def read_order():
    RequestCharges().record("read", {"x-ms-request-charge": "2"})

read_order()
"""


def test_a_host_started_with_the_probe_counts_its_requests_by_caller(tmp_path: Path):
    calls = tmp_path / "calls"
    subprocess.run([sys.executable, "-c", SCRIPT], env=caller_probe(calls), check=True, timeout=60)
    assert caller_counts(calls) == {"__main__.read_order < __main__.<module> [read]": 1}


def test_without_the_probe_nothing_is_counted(tmp_path: Path):
    calls = tmp_path / "calls"
    env = {**caller_probe(calls), "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, timeout=60)
    assert not calls.exists()
    assert json.dumps(caller_counts(tmp_path)) == "{}"
