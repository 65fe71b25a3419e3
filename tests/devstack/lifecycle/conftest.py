"""Helpers for the lifecycle tests: run an entry point in a process of its
own, marked with an environment variable that every process it starts
inherits, and find what is left of it afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from devstack.process import port_open

ROOT = Path(__file__).resolve().parents[3]
MARK = "DEVSTACK_LIFECYCLE_TEST"
# Generous: the machine is shared, and a whole stack starts in these tests.
READY_TIMEOUT = 150


def marked(value: str) -> list[psutil.Process]:
    """Live processes whose environment carries MARK=value (zombies are dead)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARK) == value:
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_until_gone(value: str, timeout: float) -> list[str]:
    """Wait for every marked process to end; describe those still alive."""
    deadline = time.monotonic() + timeout
    while True:
        left = marked(value)
        if not left or time.monotonic() > deadline:
            out = []
            for p in left:
                try:
                    out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                except psutil.Error:
                    continue
            return out
        time.sleep(0.2)


def open_ports(ports: list[int], timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    taken = [p for p in ports if port_open(p)]
    while taken and time.monotonic() < deadline:
        time.sleep(0.2)
        taken = [p for p in taken if port_open(p)]
    return taken


class Launched:
    """An entry point running as `python -m ...`, its output in a file."""

    def __init__(
        self,
        args: list[str],
        workdir: Path,
        value: str,
        extra_env: dict[str, str] | None = None,
        cwd: Path = ROOT,
    ):
        self.out_path = workdir / f"out-{uuid.uuid4().hex[:6]}.txt"
        self.value = value
        env = {**os.environ, MARK: value, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        if cwd != ROOT:  # run from elsewhere (a fresh clone's directory), the code from ROOT
            env["PYTHONPATH"] = str(ROOT)
        with open(self.out_path, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_for(self, predicate, what: str, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.process.poll() is not None:
                raise AssertionError(
                    f"exited with {self.process.returncode} before {what}:\n{self.output[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {timeout}s:\n{self.output[-3000:]}")
            time.sleep(0.2)

    def wait_output(self, text: str, timeout: float = READY_TIMEOUT) -> None:
        self.wait_for(lambda: text in self.output, repr(text), timeout)


def state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "stack.json").read_text())
    except (OSError, ValueError):
        return {}


def stack_ports(run_dir: Path) -> list[int]:
    return [s["port"] for s in state(run_dir).get("servers", {}).values()]


@pytest.fixture
def mark() -> Iterator[str]:
    """A value for MARK; whatever still carries it when the test ends is killed,
    so a failing test does not leave servers behind for the next one."""
    value = uuid.uuid4().hex
    yield value
    left = marked(value)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=10)


@pytest.fixture
def launch(tmp_path: Path, mark: str):
    def start(*args: str, cwd: Path | None = None, **extra_env: str) -> Launched:
        # Not from the repository: `up` writes ./local.settings.json where there is none,
        # and a test must not leave one in the developer's checkout.
        if cwd is None:
            cwd = tmp_path / "cwd"
            cwd.mkdir(exist_ok=True)
        return Launched(list(args), tmp_path, mark, extra_env, cwd=cwd)

    return start
