"""The whole local stack as child processes: Azurite, the Cosmos DB server,
the Service Bus emulator, the remote service that plays the downstream systems,
and the local Functions host running function_app.py.

Used by `python -m devstack up`, `make demo` and the end-to-end tests. Each
server gets a port (fixed for `up`, free ones for tests), its output goes to a
log file in the run directory, and it counts as ready when its port accepts a
connection. `Stack.settings` is the environment the app and the tools need to
reach them, with the same names as local.settings.json."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVICEBUS_CONFIG = REPO / "devstack" / "servicebus" / "Config.json"
TEMPLATE = REPO / "local.settings.template.json"
LOCAL_COSMOS_KEY = (
    "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="
)


class StackError(RuntimeError):
    """A server could not start; the message names it and its log file."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Ports:
    blob: int = 10000
    queue: int = 10001
    table: int = 10002
    cosmos: int = 8081
    servicebus: int = 5672
    remote: int = 7081
    host: int = 7071

    @classmethod
    def free(cls) -> Ports:
        return cls(*(free_port() for _ in range(7)))


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    log: Path
    env: dict[str, str] | None = None
    process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.process = subprocess.Popen(
            self.argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=self.env,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise StackError(f"{self.name} exited with {self.process.returncode}; see {self.log}")
            if port_open(self.port):
                return
            time.sleep(0.1)
        raise StackError(f"{self.name} not ready on port {self.port} after {timeout:.0f}s; see {self.log}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        if not self.alive():
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def kill(self) -> None:
        """kill -9: the crash the fault tests and the demo inject."""
        self.stop(signal.SIGKILL)


def app_settings(ports: Ports, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The template's Values, pointed at this stack's ports."""
    values = json.loads(TEMPLATE.read_text())["Values"]
    values.update(
        {
            "AzureWebJobsStorage": (
                "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
                f"BlobEndpoint=http://127.0.0.1:{ports.blob}/devstoreaccount1;"
                f"QueueEndpoint=http://127.0.0.1:{ports.queue}/devstoreaccount1;"
                f"TableEndpoint=http://127.0.0.1:{ports.table}/devstoreaccount1;"
            ),
            "ServiceBusConnection": (
                f"Endpoint=sb://127.0.0.1:{ports.servicebus};SharedAccessKeyName=RootManageSharedAccessKey;"
                "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
            ),
            "CosmosDbConnection": f"AccountEndpoint=https://127.0.0.1:{ports.cosmos}/;AccountKey={LOCAL_COSMOS_KEY}",
            "COSMOS_VERIFY_TLS": "false",
            "COSMOS_CREATE_CONTAINERS": "true",
            "REMOTE_SERVICE_URL": f"http://127.0.0.1:{ports.remote}",
        }
    )
    values.update(overrides or {})
    return values


@dataclass
class Stack:
    run_dir: Path
    ports: Ports = field(default_factory=Ports.free)
    overrides: dict[str, str] = field(default_factory=dict)
    servicebus_config: Path = SERVICEBUS_CONFIG
    with_host: bool = True
    host_args: list[str] = field(default_factory=list)
    servers: dict[str, Server] = field(default_factory=dict)

    @property
    def settings(self) -> dict[str, str]:
        return app_settings(self.ports, self.overrides)

    def _env(self) -> dict[str, str]:
        return {**os.environ, **self.settings, "PYTHONUNBUFFERED": "1"}

    def _servers(self) -> list[Server]:
        py, logs, p = sys.executable, self.run_dir / "logs", self.ports
        azurite = REPO / "node_modules" / ".bin" / "azurite"
        if not azurite.exists():
            raise StackError("node_modules/.bin/azurite is missing: run `make install` (npm ci)")
        servers = [
            Server("azurite", [str(azurite), "--silent", "--skipApiVersionCheck", "--disableTelemetry",
                               "--location", str(self.run_dir / "azurite"),
                               "--blobHost", "127.0.0.1", "--blobPort", str(p.blob),
                               "--queueHost", "127.0.0.1", "--queuePort", str(p.queue),
                               "--tableHost", "127.0.0.1", "--tablePort", str(p.table)],
                   p.table, logs / "azurite.log"),
            Server("cosmos", [py, "-m", "devstack.cosmos", "--port", str(p.cosmos)], p.cosmos,
                   logs / "cosmos.log"),
            Server("servicebus", [py, "-m", "devstack.servicebus", "--port", str(p.servicebus),
                                  "--config", str(self.servicebus_config),
                                  "--data-dir", str(self.run_dir / "servicebus")],
                   p.servicebus, logs / "servicebus.log"),
            Server("remote", [py, "-m", "devstack.remote_service", "--port", str(p.remote),
                              "--state-file", str(self.run_dir / "remote-state.json")],
                   p.remote, logs / "remote.log"),
        ]
        if self.with_host:
            servers.append(self.host_server())
        return servers

    def host_server(self, name: str = "host", port: int | None = None) -> Server:
        port = port or self.ports.host
        return Server(
            name,
            [sys.executable, "-m", "devstack.host", "--app", "function_app:app",
             "--data-dir", str(self.run_dir / "host"), "--port", str(port), *self.host_args],
            port,
            self.run_dir / "logs" / f"{name}.log",
            env=self._env(),
        )

    def start(self, timeout: float = 60) -> Stack:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            # The servers start together; the host only once they all answer,
            # because it refuses to start against an unreachable dependency.
            servers = self._servers()
            for server in servers:
                if server.env is None:
                    server.env = self._env()
                if server.name != "host":
                    server.start()
                    self.servers[server.name] = server
            for server in self.servers.values():
                server.wait_ready(timeout)
            for server in servers:
                if server.name == "host":
                    server.start()
                    self.servers[server.name] = server
                    server.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, name: str, timeout: float = 60) -> None:
        server = self.servers[name]
        server.stop()
        server.start()
        server.wait_ready(timeout)

    def replace_host(self, extra_env: dict[str, str] | None = None, timeout: float = 60) -> Server:
        """Stop the host (if running) and start a new one with `extra_env` on
        top of the stack's settings (fault tests pass crash points this way)."""
        old = self.servers.get("host")
        if old is not None:
            old.stop()
        server = self.host_server()
        server.env = {**self._env(), **(extra_env or {})}
        server.start()
        self.servers["host"] = server
        server.wait_ready(timeout)
        return server

    def dead(self) -> list[str]:
        return [name for name, s in self.servers.items() if not s.alive()]

    def stop(self) -> None:
        for server in reversed(list(self.servers.values())):
            server.stop()

    def clean(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
