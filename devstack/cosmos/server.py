"""Start and stop the patched local Cosmos DB server (launcher.js)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from devstack.process import Child

LAUNCHER = Path(__file__).with_name("launcher.js")
REPO_ROOT = Path(__file__).resolve().parents[2]
# The server accepts any key; use the emulator's well-known (public) one so that
# the same connection string works against the official emulator.
LOCAL_KEY = (
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="
)
_READY = re.compile(r"cosmosdb-server ready at (https://\S+/)")


class ServerStartError(RuntimeError):
    """The server did not print its ready line; the message carries its output."""


def launcher_command(
    port: int = 0,
    host: str = "127.0.0.1",
    faults: str | None = None,
    data_file: str | Path | None = None,
) -> list[str]:
    node = shutil.which("node")
    if node is None:
        raise ServerStartError("node is not on PATH; the local Cosmos DB server needs Node.js 18+")
    command = [node, str(LAUNCHER), "--port", str(port), "--host", host]
    if faults:
        command += ["--faults", faults]
    if data_file:
        command += ["--data-file", str(Path(data_file).resolve())]
    return command


@dataclass
class CosmosServer:
    """A running server. `endpoint` ends with '/'; TLS is self-signed (and
    expired), so clients connect with verify_tls=False."""

    endpoint: str
    child: Child
    key: str = LOCAL_KEY
    output: deque[str] = field(default_factory=lambda: deque(maxlen=200))

    @property
    def connection_string(self) -> str:
        return f"AccountEndpoint={self.endpoint};AccountKey={self.key};"

    @property
    def port(self) -> int:
        return int(self.endpoint.rstrip("/").rsplit(":", 1)[1])

    @property
    def process(self) -> subprocess.Popen[str]:
        return self.child.process

    def stop(self, timeout: float = 10) -> None:
        self.child.stop(timeout)

    def __enter__(self) -> CosmosServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_server(
    port: int = 0,
    host: str = "127.0.0.1",
    timeout: float = 30,
    faults: str | None = None,
    data_file: str | Path | None = None,
) -> CosmosServer:
    """Start the launcher and wait for its ready line. Port 0 lets the OS pick a
    free port (no race between choosing a port and binding it). With `data_file`
    the server loads its data from there and keeps it there (see launcher.js)."""
    launcher_command(port, host, faults, data_file)  # fail early and clearly without node
    command = [sys.executable, "-m", "devstack.cosmos", "--port", str(port), "--host", host]
    if faults:
        command += ["--faults", faults]
    if data_file:
        command += ["--data-file", str(Path(data_file).resolve())]
    child = Child.start(
        "cosmos",
        command,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "NODE_NO_WARNINGS": "1"},
    )
    process = child.process
    output: deque[str] = deque(maxlen=200)
    ready = threading.Event()
    found: list[str] = []

    def pump() -> None:
        # Keep reading after the ready line so the pipe never fills up and
        # blocks the server; the tail is kept for error reports.
        assert process.stdout is not None
        try:
            for line in process.stdout:
                output.append(line.rstrip())
                match = _READY.search(line)
                if match and not found:
                    found.append(match.group(1))
                    ready.set()
        except (OSError, ValueError):
            pass  # the pipe was closed by stop()
        ready.set()

    threading.Thread(target=pump, name="cosmosdb-server-output", daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.05):
        if time.monotonic() > deadline:
            break
    if not found:
        child.kill()
        tail = "\n".join(output) or "(no output)"
        raise ServerStartError(f"the local Cosmos DB server did not start:\n{tail}")
    return CosmosServer(endpoint=found[0], child=child, output=output)
