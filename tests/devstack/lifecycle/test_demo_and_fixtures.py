"""The demo stops what it started when interrupted early, its servers die
with it on SIGKILL, a stack that fails half-way through starting stops what
it had started, and the test fixtures' servers die with a killed test run."""

from __future__ import annotations

import json
import signal

import pytest

from devstack.process import TAG_ENV, port_open, processes_with
from devstack.stack import Stack, StackError

from .conftest import ROOT, open_ports, stack_ports, state, wait_until_gone

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_demo_interrupted_while_starting_leaves_nothing(launch, mark, tmp_path, sig):
    run_dir = tmp_path / "demo"
    demo = launch("-m", "devstack.demo", "--orders", "5", "--run-dir", str(run_dir))
    # Early: some servers are running, the host is not up yet.
    demo.wait_for(lambda: len(state(run_dir).get("servers", {})) >= 3, "three servers started")
    ports = stack_ports(run_dir)
    assert "host" not in state(run_dir)["servers"] or not port_open(
        state(run_dir)["servers"]["host"]["port"]
    )

    demo.process.send_signal(sig)
    code = demo.process.wait(30)
    assert code == (128 + sig if sig == signal.SIGTERM else -sig)
    assert wait_until_gone(mark, timeout=25) == []
    assert open_ports(ports) == []
    if sig == signal.SIGTERM:
        assert "demo: stopping the local stack" in demo.output


def test_a_stack_whose_last_server_fails_stops_those_it_started(tmp_path):
    # The host cannot load its app: it fails after the four servers it needs are up.
    stack = Stack(tmp_path / "run", host_args=["--app", "no_such_module:app"])
    with pytest.raises(StackError, match="host exited"):
        stack.start(timeout=90)
    assert sorted(stack.servers) == ["azurite", "cosmos", "host", "remote", "servicebus"]
    assert set(stack.dead()) == set(stack.servers)
    assert processes_with(TAG_ENV, stack.tag) == []
    assert open_ports([s.port for s in stack.servers.values()]) == []


def test_fixture_servers_die_with_a_killed_test_run(launch, mark, tmp_path):
    ports_file = tmp_path / "ports.json"
    run = launch(
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--timeout",
        "200",
        str(ROOT / "tests" / "devstack" / "lifecycle" / "held_servers.py"),
        LIFECYCLE_PORTS_FILE=str(ports_file),
    )
    run.wait_for(ports_file.exists, "the fixtures' ports")
    ports = json.loads(ports_file.read_text())
    assert [p for p in ports if port_open(p)] == ports

    run.process.send_signal(signal.SIGKILL)
    run.process.wait(10)
    assert wait_until_gone(mark, timeout=25) == []
    assert open_ports(ports) == []
