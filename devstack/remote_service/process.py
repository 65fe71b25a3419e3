"""Start the remote service as a real process (for test fixtures and demos)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from devstack.process import Child, read_line
from devstack.remote_service.__main__ import READY_PREFIX

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RemoteServiceProcess:
    """A running `python -m devstack.remote_service`.

    Attributes:
        url: base URL, e.g. http://127.0.0.1:40123.
        port: the port it listens on (reuse it to restart at the same URL).
    """

    child: Child
    url: str
    port: int
    log_path: Path
    state_file: Path | None = None
    _log_file: TextIO | None = field(default=None, repr=False)

    @property
    def process(self) -> subprocess.Popen[str]:
        return self.child.process

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it does not stop in time; returns the exit
        code. The log is removed when we stopped it; one that ended on its own
        keeps its log for whoever wants to know why."""
        ran = self.child.alive()
        code = self.child.stop(timeout)
        self._close_files()
        if ran:
            self.log_path.unlink(missing_ok=True)
        return code

    def kill(self) -> None:
        """Die at once, like a crashed host."""
        self.child.kill()
        self._close_files()

    def _close_files(self) -> None:
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
    catalog: Path | None = None,
) -> RemoteServiceProcess:
    """Start the service on 127.0.0.1 (`port` 0: a free one) and wait for its
    ready line; raise RuntimeError with its log if it does not come.
    `catalog`: the step catalog file whose operations it serves."""
    args = [sys.executable, "-m", "devstack.remote_service", "--port", str(port)]
    args += ["--log-level", log_level]
    if state_file is not None:
        args += ["--state-file", str(state_file)]
    if seed is not None:
        args += ["--seed", str(seed)]
    if catalog is not None:
        args += ["--catalog", str(catalog)]
    fd, log_name = tempfile.mkstemp(prefix="remote-service-", suffix=".log")
    log_file = os.fdopen(fd, "w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = Child.start(
        "remote-service",
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log_file,
        text=True,
    )
    assert child.process.stdout is not None
    line = read_line(child.process.stdout, ready_timeout)
    if not line.startswith(READY_PREFIX):
        child.kill()
        log_file.close()
        raise RuntimeError(
            f"remote service did not start (exit {child.returncode}, said {line!r}):\n"
            + Path(log_name).read_text()[-2000:]
        )
    url = line[len(READY_PREFIX) :].strip()
    return RemoteServiceProcess(
        child=child,
        url=url,
        port=int(url.rsplit(":", 1)[1]),
        log_path=Path(log_name),
        state_file=state_file,
        _log_file=log_file,
    )
