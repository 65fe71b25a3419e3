"""Start the remote service as a real process (for test fixtures and demos)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from devstack.remote_service.__main__ import READY_PREFIX

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RemoteServiceProcess:
    """A running `python -m devstack.remote_service`.

    Attributes:
        url: base URL, e.g. http://127.0.0.1:40123.
        port: the port it listens on (reuse it to restart at the same URL).
    """

    process: subprocess.Popen[str]
    url: str
    port: int
    log_path: Path
    state_file: Path | None = None
    _log_file: TextIO | None = field(default=None, repr=False)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it does not stop in time; returns the exit
        code. The log is removed when we stopped it; one that ended on its own
        keeps its log for whoever wants to know why."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
            self._close_files()
            self.log_path.unlink(missing_ok=True)
        self._close_files()
        return self.process.returncode

    def kill(self) -> None:
        """Die at once, like a crashed host."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._close_files()

    def _close_files(self) -> None:
        if self.process.stdout and not self.process.stdout.closed:
            self.process.stdout.close()
        if self._log_file is not None and not self._log_file.closed:
            self._log_file.close()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text()[-chars:]
        except OSError:
            return ""


def start_remote_service(
    port: int = 0,
    state_file: Path | None = None,
    seed: int | None = None,
    ready_timeout: float = 20.0,
    log_level: str = "INFO",
) -> RemoteServiceProcess:
    """Start the service on 127.0.0.1 (`port` 0: a free one) and wait for its
    ready line; raise RuntimeError with its log if it does not come."""
    args = [sys.executable, "-m", "devstack.remote_service", "--port", str(port)]
    args += ["--log-level", log_level]
    if state_file is not None:
        args += ["--state-file", str(state_file)]
    if seed is not None:
        args += ["--seed", str(seed)]
    fd, log_name = tempfile.mkstemp(prefix="remote-service-", suffix=".log")
    log_file = os.fdopen(fd, "w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=log_file, text=True, env=env
    )
    deadline = time.monotonic() + ready_timeout
    assert process.stdout is not None
    line = ""
    while time.monotonic() < deadline and process.poll() is None:
        ready, _, _ = select.select([process.stdout], [], [], 0.1)
        if ready:
            line = process.stdout.readline()
            break
    if not line.startswith(READY_PREFIX):
        process.kill()
        process.wait(10)
        log_file.close()
        raise RuntimeError(
            f"remote service did not start (exit {process.returncode}, said {line!r}):\n"
            + Path(log_name).read_text()[-2000:]
        )
    url = line[len(READY_PREFIX) :].strip()
    return RemoteServiceProcess(
        process=process,
        url=url,
        port=int(url.rsplit(":", 1)[1]),
        log_path=Path(log_name),
        state_file=state_file,
        _log_file=log_file,
    )
