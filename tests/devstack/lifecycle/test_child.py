"""devstack.process.Child on real processes: stop sweeps the child's group while that
group is provably its own (the leader not yet reaped), and never signals a group id
once the leader is reaped, since the id may belong to another process by then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from devstack import process as proc
from devstack.process import Child, read_line

# A process that ignores SIGTERM, as a server's worker sometimes does; it prints its pid.
STUBBORN = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print(os.getpid(), flush=True)\n"
    "time.sleep(120)\n"
)


def leader(then: str, stranger: bool = False) -> list[str]:
    """A leader that starts STUBBORN in its own group, prints its pid, then runs `then`.
    With `stranger`, STUBBORN also starts a process of the same group whose environment
    lacks the child's token, standing for a process the token does not prove is ours."""
    stubborn = STUBBORN
    if stranger:
        stubborn = (
            "import os, subprocess, sys\n"
            f"env = {{k: v for k, v in os.environ.items() if k != {proc.CHILD_ENV!r}}}\n"
            f"s = subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], env=env, stdout=subprocess.PIPE, text=True)\n"
            "print(s.stdout.readline().strip(), flush=True)\n" + STUBBORN
        )
    code = (
        "import subprocess, sys\n"
        f"g = subprocess.Popen([sys.executable, '-c', {stubborn!r}], stdout=subprocess.PIPE, text=True)\n"
        + ("print(g.stdout.readline().strip(), flush=True)\n" if stranger else "")
        + "print(g.stdout.readline().strip(), flush=True)\n"
        + then
    )
    return [sys.executable, "-c", code]


@pytest.fixture
def killpg_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every os.killpg the helper makes (each still goes through)."""
    calls: list[tuple[int, int]] = []
    real = os.killpg

    def spy(pgid: int, sig: int) -> None:
        calls.append((pgid, sig))
        real(pgid, sig)

    monkeypatch.setattr(proc.os, "killpg", spy)
    return calls


@pytest.fixture
def strays() -> Iterator[list[int]]:
    """Pids a test started outside a Child; killed at the end whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            p = psutil.Process(pid)
            p.kill()
            p.wait(5)
        except psutil.Error:
            pass


def gone(pid: int, timeout: float = 10) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


def test_stop_kills_what_is_left_in_the_group() -> None:
    child = Child.start(
        "leader", leader("import time\ntime.sleep(120)\n"), stdout=subprocess.PIPE, text=True
    )
    assert child.process.stdout is not None
    stubborn = int(read_line(child.process.stdout, 30))
    assert child.stop(timeout=5) == -signal.SIGTERM
    assert gone(stubborn), "the child of the leader that ignored SIGTERM is still alive"


def test_a_stopped_child_is_never_signalled_again(killpg_calls: list[tuple[int, int]]) -> None:
    child = Child.start("leader", [sys.executable, "-c", "import time; time.sleep(120)"])
    assert child.stop(timeout=5) == -signal.SIGTERM
    killpg_calls.clear()
    # Long after the reap, the pid (and group id) may be another process's.
    assert child.stop() == -signal.SIGTERM
    child.kill()
    child.terminate()
    child.signal(signal.SIGTERM)
    assert killpg_calls == []


def test_a_child_reaped_elsewhere_loses_only_its_own_leftovers(
    killpg_calls: list[tuple[int, int]], strays: list[int]
) -> None:
    child = Child.start("leader", leader("", stranger=True), stdout=subprocess.PIPE, text=True)
    assert child.process.stdout is not None
    stranger = int(read_line(child.process.stdout, 30))
    strays.append(stranger)
    stubborn = int(read_line(child.process.stdout, 30))
    strays.append(stubborn)
    assert child.process.wait(30) == 0  # it exited by itself, and someone reaped it
    assert psutil.Process(stubborn).is_running()
    assert os.getpgid(stranger) == os.getpgid(stubborn) == child.pid

    assert child.stop() == 0
    assert gone(stubborn), "a leftover carrying the child's token is still alive"
    assert not gone(stranger, timeout=0), "a process the token does not prove ours was killed"
    assert killpg_calls == [], "a reaped leader's group id was signalled"
