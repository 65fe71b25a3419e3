"""Run devstack.host as a real subprocess on the sample app, and talk to it.

`HostProcess` starts `python -m devstack.host`, waits for its ready line, and can be
killed with SIGKILL and started again on the same data dir. The tests read the
instance state through the real `DurableOrchestrationClient`, built from the same
client binding the host gives functions.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import azure.durable_functions as df
import pytest
from azure.durable_functions.models.utils import http_utils

from devstack.host.http_api import client_binding
from devstack.process import Child

ROOT = Path(__file__).resolve().parents[3]
SAMPLE_APP = Path(__file__).resolve().parent / "sample_app"
OFFICIAL_APP = Path(__file__).resolve().parent / "official_app"
READY = re.compile(
    r"devstack\.host ready: .* durable=(?P<base>http://127\.0\.0\.1:\d+)/durabletask/"
)
STARTUP_TIMEOUT_S = 30


class HostProcess:
    """One `python -m devstack.host` process on the sample app."""

    def __init__(
        self,
        data_dir: Path,
        out_dir: Path,
        env: dict[str, str | None],
        clock: str,
        log_path: Path,
        args: list[str] | None = None,
        app_dir: Path = SAMPLE_APP,
        hub: str = "SampleHub",
        app: str = "function_app:app",
    ) -> None:
        self.app = app
        self.args = args or []
        self.app_dir = app_dir
        self.hub = hub
        self.data_dir = data_dir
        self.out_dir = out_dir
        self.env = env
        self.clock = clock
        self.log_path = log_path
        self.base = ""
        self.child: Child | None = None
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> HostProcess:
        cmd = [
            sys.executable,
            "-m",
            "devstack.host",
            "--app",
            self.app,
            "--app-dir",
            str(self.app_dir),
            "--data-dir",
            str(self.data_dir),
            "--clock",
            self.clock,
            "--lease-seconds",
            "2",
            *self.args,
        ]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "SAMPLE_OUT_DIR": str(self.out_dir),
        }
        for key, value in self.env.items():  # None removes a variable
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        with open(self.log_path, "a", encoding="utf-8") as log:  # the child keeps its own copy
            self.child = Child.start(
                "host", cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True
            )
        self.proc = self.child.process
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"devstack.host exited ({self.proc.wait()}): {self.log_tail()}")
            m = READY.search(line)
            if m:
                self.base = m.group("base")
                return self
        self.kill()
        raise RuntimeError(f"devstack.host not ready in {STARTUP_TIMEOUT_S}s: {self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.child is not None:
            self.child.kill()

    def stop(self) -> None:
        """Ctrl-C once, as a developer stops it, and wait for the drain to end. A second
        signal while the host drains means "exit now" (as a second Ctrl-C does), so the
        SIGTERM of `Child.stop` only follows once the drain has had its time."""
        if self.child is not None and self.child.alive():
            self.child.signal(signal.SIGINT)
            self.child.wait(15)
            self.child.stop(5)

    @property
    def client(self) -> df.DurableOrchestrationClient:
        return df.DurableOrchestrationClient(json.dumps(client_binding(self.base, self.hub)))

    def now(self) -> datetime:
        with urllib.request.urlopen(f"{self.base}/admin/clock", timeout=10) as r:
            return datetime.fromisoformat(json.loads(r.read())["now"])

    def timers(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.base}/admin/timers", timeout=10) as r:
            return json.loads(r.read())

    def advance(self, seconds: float) -> None:
        """Move the host's controllable clock (a blocking call: usable from sync and async tests)."""
        req = urllib.request.Request(
            f"{self.base}/admin/clock/advance",
            data=json.dumps({"seconds": seconds}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """POST JSON to one of the host's admin endpoints (a blocking call)."""
        req = urllib.request.Request(
            f"{self.base}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def events(self, kind: str | None = None, **match: Any) -> list[dict[str, Any]]:
        path = self.out_dir / "events.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if (kind is None or e["kind"] == kind) and all(e.get(k) == v for k, v in match.items()):
                out.append(e)
        return out


@pytest.fixture(autouse=True)
async def fresh_client_session() -> Any:
    """The SDK keeps one aiohttp session per process (a worker has one loop); tests have one loop each."""
    http_utils._client_session = None
    http_utils._session_lock = asyncio.Lock()
    yield
    if http_utils._client_session is not None:
        await http_utils._client_session.close()
        http_utils._client_session = None


async def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float = 30,
    interval: float = 0.1,
    what: str = "condition",
) -> Any:
    """Poll an (async or sync) predicate until it is truthy or the deadline passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


async def wait_status(
    client: df.DurableOrchestrationClient, iid: str, *statuses: str, timeout: float = 30
) -> Any:
    async def check() -> Any:
        s = await client.get_status(iid, show_history=True)
        return s if s and s.runtime_status and s.runtime_status.value in statuses else None

    return await wait_for(check, timeout=timeout, what=f"{iid} in {statuses}")


@pytest.fixture
def host_factory(tmp_path: Path) -> Iterator[Callable[..., HostProcess]]:
    """Start hosts on the sample app; all share one data dir and events file unless told otherwise."""
    started: list[HostProcess] = []
    out = tmp_path / "out"
    out.mkdir()

    def make(
        *,
        env: dict[str, str | None] | None = None,
        clock: str = "real",
        data_dir: Path | None = None,
        args: list[str] | None = None,
        app_dir: Path = SAMPLE_APP,
        hub: str = "SampleHub",
        app: str = "function_app:app",
    ) -> HostProcess:
        h = HostProcess(
            data_dir or tmp_path / "hub",
            out,
            env or {},
            clock,
            tmp_path / f"host{len(started)}.log",
            args,
            app_dir=app_dir,
            hub=hub,
            app=app,
        )
        started.append(h)
        return h.start()

    yield make
    for h in started:
        h.stop()
