"""`python -m devstack up` stops every server it started on SIGTERM, its
servers die with it on SIGKILL, it names a taken port and its holder, and
`down` stops a stack left behind by an earlier run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from devstack.process import free_ports

from .conftest import ROOT, marked, open_ports, stack_ports, state, wait_until_gone

pytestmark = pytest.mark.slow

# owner + reaper + azurite, cosmos, servicebus, remote, host
WHOLE_STACK = 7


def start_up(launch, run_dir, *extra: str):
    up = launch("-m", "devstack", "up", "--free-ports", "--run-dir", str(run_dir), *extra)
    up.wait_output("devstack: up")
    return up


def test_sigterm_stops_every_server_and_frees_every_port(launch, mark, tmp_path):
    run_dir = tmp_path / "run"
    up = start_up(launch, run_dir)
    ports = stack_ports(run_dir)
    assert len(ports) == 5
    assert open_ports(ports, timeout=0) == ports
    assert len(marked(mark)) >= WHOLE_STACK

    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(30) == 128 + signal.SIGTERM
    assert wait_until_gone(mark, timeout=15) == []
    assert open_ports(ports) == []
    assert not (run_dir / "stack.json").exists()
    assert "devstack: stopped in" in up.output


def test_sigkill_of_up_takes_its_servers_with_it(launch, mark, tmp_path):
    run_dir = tmp_path / "run"
    up = start_up(launch, run_dir)
    ports = stack_ports(run_dir)
    assert len(marked(mark)) >= WHOLE_STACK

    up.process.send_signal(signal.SIGKILL)
    up.process.wait(10)
    # The reaper stops the orphans (SIGTERM, 8 s grace, SIGKILL), then exits itself.
    assert wait_until_gone(mark, timeout=25) == []
    assert open_ports(ports) == []


def test_down_stops_a_stack_left_by_an_earlier_run(launch, mark, tmp_path):
    run_dir = tmp_path / "run"
    up = start_up(launch, run_dir, "--no-host")
    ports = stack_ports(run_dir)
    # Leave the servers behind: the reaper first, then the owner, both kill -9.
    os.kill(state(run_dir)["reaper"], signal.SIGKILL)
    up.process.send_signal(signal.SIGKILL)
    up.process.wait(10)
    assert wait_until_gone(mark, timeout=3) != [], "the servers should have been left running"
    # (the Cosmos launcher also watches its parent itself, so it may be gone already)
    still_open = open_ports(ports, timeout=0)
    assert len(still_open) >= 2

    status = subprocess.run(
        [sys.executable, "-m", "devstack", "status", "--run-dir", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0
    assert "running; owner pid" in status.stdout
    assert "gone" in status.stdout
    assert status.stdout.count("listening") == len(still_open), status.stdout

    down = subprocess.run(
        [sys.executable, "-m", "devstack", "down", "--run-dir", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert down.returncode == 0, down.stderr
    assert "down" in down.stdout
    assert wait_until_gone(mark, timeout=5) == []
    assert open_ports(ports) == []
    assert not (run_dir / "stack.json").exists()


def test_up_names_a_taken_port_and_its_holder_and_starts_nothing(launch, mark, tmp_path):
    base = consecutive_free_ports(7)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 3))  # the Cosmos server's port
        holder.listen()
        up = launch(
            "-m", "devstack", "up", "--base-port", str(base), "--run-dir", str(tmp_path / "run")
        )
        assert up.process.wait(60) == 1
    assert f"port cosmos {base + 3} is taken by pid {os.getpid()}" in up.output
    assert wait_until_gone(mark, timeout=5) == []


def consecutive_free_ports(n: int) -> int:
    for _ in range(50):
        base = free_ports(1)[0]
        if base + n < 65535 and not open_ports(list(range(base, base + n)), timeout=0):
            try:
                socks = []
                for port in range(base, base + n):
                    s = socket.socket()
                    socks.append(s)
                    s.bind(("127.0.0.1", port))
                return base
            except OSError:
                continue
            finally:
                for s in socks:
                    s.close()
    raise AssertionError("no run of free ports found")
