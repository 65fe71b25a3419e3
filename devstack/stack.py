"""The whole local stack as child processes: Azurite, the Cosmos DB server,
the Service Bus emulator, the remote service that plays the downstream systems,
and the local Functions host running function_app.py.

Used by `python -m devstack up`, `make demo` and the end-to-end tests. Each
server gets a port (fixed for `up`, free ones for tests), its output goes to a
log file in the run directory, and it counts as ready when its port accepts a
connection. `Stack.settings` is the environment the app and the tools need to
reach them, with the same names as local.settings.json.

Processes are started through devstack.process, so they die with the process
that started the stack however it ends; a running stack keeps a state file
(stack.json) in its run directory, which `python -m devstack status` and
`down` read to find and stop a stack left by an earlier run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from devstack.cosmos.server import LOCAL_KEY as COSMOS_LOCAL_KEY
from devstack.process import (
    STOP_TIMEOUT,
    TAG_ENV,
    Child,
    ChildStartError,
    describe,
    free_ports,
    port_open,
    port_owner,
    processes_with,
    reaper_pid,
    shutting_down,
    terminate,
    wait_listening,
)

REPO = Path(__file__).resolve().parent.parent
SERVICEBUS_CONFIG = REPO / "devstack" / "servicebus" / "Config.json"
TEMPLATE = REPO / "local.settings.template.json"


class StackError(RuntimeError):
    """A server could not start; the message names it and its log file."""


# The state file a running stack keeps in its run directory, for `down` and `status`.
STATE_FILE = "stack.json"
# The settings a running stack hands over: local.settings.json's shape, for its ports.
SETTINGS_FILE = "local.settings.json"
# Marks a local.settings.json that the stack wrote (and may rewrite); one without it is
# the user's own and is never touched.
WRITTEN_BY = "devstack"
# Where the Cosmos server keeps its data, in the run directory.
COSMOS_DATA = Path("cosmos") / "data.json"
# The internal queues' keys of one stack (ADR 017e): generated on first use,
# kept (mode 0600) in its run directory so a restart keeps them, never in the repo.
KEYS_FILE = "queue-keys.json"


def stack_keys(run_dir: Path) -> dict[str, str]:
    """AGENT_SIGNING_KEYS and REPLY_TOKEN_KEYS of the stack in `run_dir`:
    read, or generated and written the first time."""
    from adapters.settings import AGENT_SIGNING_KEYS, REPLY_TOKEN_KEYS
    from domain.signing import new_key

    path = run_dir / KEYS_FILE
    if path.exists():
        return json.loads(path.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    keys = {AGENT_SIGNING_KEYS: new_key(), REPLY_TOKEN_KEYS: new_key()}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(keys, out)
    return keys


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
        return cls(*free_ports(7))

    def named(self) -> dict[str, int]:
        """What each port is for, e.g. {'azurite blob': 10000, ...}."""
        return {
            ("azurite " + k if k in ("blob", "queue", "table") else k): v
            for k, v in asdict(self).items()
        }

    def taken(self) -> dict[str, str]:
        """Ports something already listens on: {'cosmos 8081': 'pid 12 (node ...)'}."""
        return {
            f"{name} {port}": port_owner(port)
            for name, port in self.named().items()
            if port_open(port)
        }


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    log: Path
    env: dict[str, str] | None = None
    tag: str | None = None
    child: Child | None = None

    @property
    def process(self) -> subprocess.Popen | None:
        return self.child.process if self.child else None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:  # the child keeps its own copy of the descriptor
            self.child = Child.start(
                self.name,
                self.argv,
                env=self.env,
                tag=self.tag,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float) -> None:
        if self.child is None:
            raise StackError(f"{self.name} was never started")
        try:
            wait_listening(self.child, self.port, timeout, self.log)
        except ChildStartError as exc:
            raise StackError(str(exc)) from None

    def alive(self) -> bool:
        return self.child is not None and self.child.alive()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        if self.child is not None:
            self.child.stop(timeout)

    def kill(self) -> None:
        """kill -9: the crash the fault tests and the demo inject."""
        if self.child is not None:
            self.child.kill()


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
            "CosmosDbConnection": f"AccountEndpoint=https://127.0.0.1:{ports.cosmos}/;AccountKey={COSMOS_LOCAL_KEY}",
            "COSMOS_VERIFY_TLS": "false",
            "COSMOS_CREATE_CONTAINERS": "true",
            "REMOTE_SERVICE_URL": f"http://127.0.0.1:{ports.remote}",
            "CONSOLE_LOCAL_MODE": "true",  # the local host listens on 127.0.0.1 only
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
    # Keep the Cosmos data in the run directory (<run>/cosmos/data.json) across restarts
    # (`up` does; tests and benches start from empty run directories and need not write it).
    keep_cosmos: bool = False
    _keys: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def settings(self) -> dict[str, str]:
        """The app's settings for this stack: the template's, its ports, its
        generated keys (stack_keys), then the overrides."""
        if not self._keys:
            self._keys = stack_keys(self.run_dir)
        return app_settings(self.ports, {**self._keys, **self.overrides})

    @property
    def tag(self) -> str:
        """What every server of this stack carries in DEVSTACK_TAG: the run directory."""
        return str(self.run_dir.resolve())

    @property
    def cosmos_data(self) -> Path:
        return self.run_dir / COSMOS_DATA

    @property
    def settings_file(self) -> Path:
        return self.run_dir / SETTINGS_FILE

    def write_settings(self, path: Path | None = None) -> Path:
        """Write the settings for this stack's ports in local.settings.json's shape (to the
        run directory unless told otherwise), marked as written by the stack."""
        path = path or self.settings_file
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "IsEncrypted": False,
            "Values": self.settings,
            WRITTEN_BY: {
                "run_dir": str(self.run_dir.resolve()),
                "note": "written by `python -m devstack up` for the ports it chose; "
                "rewritten by the next `up`. Remove this key to keep the file as your own.",
            },
        }
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)
        return path

    # What else keeps state in the run directory: queues, Durable history, blobs/queues/
    # tables, the remote service's idempotency records.
    OTHER_DATA = ("servicebus", "host", "azurite", "remote-state.json")

    def reconcile_data(self) -> str | None:
        """Make the stores agree before a start that keeps data: a run directory with queues
        and history but no Cosmos data file (a stack from before the data file, or a removed
        file) is reset whole, so that no alert or history names an order Cosmos lacks.
        Returns what was done (for the caller to say loudly), or None."""
        if not self.keep_cosmos or self.cosmos_data.exists():
            return None
        present = [n for n in self.OTHER_DATA if (self.run_dir / n).exists()]
        if not present:
            return None
        for name in present:
            path = self.run_dir / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        return (
            f"{self.run_dir} had {', '.join(present)} but no Cosmos data ({COSMOS_DATA}): "
            "state was RESET (queues, dead letters, alerts, Durable history and storage cleared) "
            "so that the stores agree; from now on Cosmos data is kept there too"
        )

    def cosmos_data_line(self) -> str:
        """What the Cosmos server said about its data when it started (its ready line)."""
        try:
            lines = (self.run_dir / "logs" / "cosmos.log").read_text().splitlines()
        except OSError:
            return ""
        ready = [line for line in lines if "cosmosdb-server ready at" in line]
        if not ready or "; data: " not in ready[-1]:
            return ""
        said = ready[-1].rsplit("; data: ", 1)[1].rstrip()
        return said[:-1] if said.endswith(")") else said

    def _env(self) -> dict[str, str]:
        return {**os.environ, **self.settings, "PYTHONUNBUFFERED": "1"}

    def _servers(self) -> list[Server]:
        py, logs, p = sys.executable, self.run_dir / "logs", self.ports
        azurite = REPO / "node_modules" / ".bin" / "azurite"
        if not azurite.exists():
            raise StackError("node_modules/.bin/azurite is missing: run `make install` (npm ci)")
        servers = [
            Server(
                "azurite",
                [
                    str(azurite),
                    "--silent",
                    "--skipApiVersionCheck",
                    "--disableTelemetry",
                    "--location",
                    str(self.run_dir / "azurite"),
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    str(p.blob),
                    "--queueHost",
                    "127.0.0.1",
                    "--queuePort",
                    str(p.queue),
                    "--tableHost",
                    "127.0.0.1",
                    "--tablePort",
                    str(p.table),
                ],
                p.table,
                logs / "azurite.log",
            ),
            Server(
                "cosmos",
                [py, "-m", "devstack.cosmos", "--port", str(p.cosmos)]
                + (["--data-file", str(self.cosmos_data)] if self.keep_cosmos else []),
                p.cosmos,
                logs / "cosmos.log",
            ),
            Server(
                "servicebus",
                [
                    py,
                    "-m",
                    "devstack.servicebus",
                    "--port",
                    str(p.servicebus),
                    "--config",
                    str(self.servicebus_config),
                    "--data-dir",
                    str(self.run_dir / "servicebus"),
                ],
                p.servicebus,
                logs / "servicebus.log",
            ),
            Server(
                "remote",
                [
                    py,
                    "-m",
                    "devstack.remote_service",
                    "--port",
                    str(p.remote),
                    "--state-file",
                    str(self.run_dir / "remote-state.json"),
                ],
                p.remote,
                logs / "remote.log",
            ),
        ]
        if self.with_host:
            servers.append(self.host_server())
        return servers

    def host_server(self, name: str = "host", port: int | None = None) -> Server:
        port = port or self.ports.host
        return Server(
            name,
            [
                sys.executable,
                "-m",
                "devstack.host",
                "--app",
                "function_app:app",
                "--data-dir",
                str(self.run_dir / "host"),
                "--port",
                str(port),
                *self.host_args,
            ],
            port,
            self.run_dir / "logs" / f"{name}.log",
            env=self._env(),
        )

    def _launch(self, server: Server) -> None:
        server.tag = self.tag
        if server.env is None:
            server.env = self._env()
        server.start()
        self.servers[server.name] = server
        self._write_state()

    def start(self, timeout: float = 60) -> Stack:
        """Start every server and wait until each answers. If one fails (or a
        stop signal comes) those already started are stopped before raising."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            # The servers start together; the host only once they all answer,
            # because it refuses to start against an unreachable dependency.
            servers = self._servers()
            for server in servers:
                if server.name != "host":
                    if shutting_down():
                        raise StackError("start abandoned, stopping")
                    self._launch(server)
            for server in list(self.servers.values()):
                server.wait_ready(timeout)
            self.create_containers(timeout)
            for server in servers:
                if server.name == "host":
                    self._launch(server)
                    server.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def create_containers(self, timeout: float = 60) -> None:
        """With COSMOS_CREATE_CONTAINERS (the local stack's setting), create the app's Cosmos
        databases and containers before the host starts, with the app's own code, so that
        the first query after `up` finds them (the app would create them only at its
        first invocation). They survive a restart with the Cosmos data file."""
        values = self.settings
        if values.get("COSMOS_CREATE_CONTAINERS", "").lower() != "true":
            return
        import asyncio

        from adapters.cosmos_client import (
            build_client,
            ensure_orders_container,
            ensure_state_container,
        )
        from adapters.recovery_index import ensure_index_container
        from adapters.settings import load_settings

        cfg = load_settings(values)

        async def create() -> None:
            state = build_client(cfg.state_account)
            try:
                await ensure_state_container(state, cfg.state_database, cfg.state_container)
                if cfg.supervisor_scan == "index":
                    await ensure_index_container(
                        state, cfg.state_database, cfg.recovery_index_container
                    )
                if cfg.orders_account == cfg.state_account:
                    await ensure_orders_container(state, cfg.orders_database, cfg.orders_container)
                    return
                orders = build_client(cfg.orders_account)
                try:
                    await ensure_orders_container(orders, cfg.orders_database, cfg.orders_container)
                finally:
                    await orders.close()
            finally:
                await state.close()

        try:
            asyncio.run(asyncio.wait_for(create(), timeout))
        except Exception as exc:
            raise StackError(
                f"cannot create the Cosmos containers ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); see {self.run_dir / 'logs' / 'cosmos.log'}"
            ) from None

    def restart(self, name: str, timeout: float = 60) -> None:
        server = self.servers[name]
        server.stop()
        server.start()
        self._write_state()
        server.wait_ready(timeout)

    def replace_host(self, extra_env: dict[str, str] | None = None, timeout: float = 60) -> Server:
        """Stop the host (if running) and start a new one with `extra_env` on
        top of the stack's settings (fault tests pass crash points this way)."""
        old = self.servers.get("host")
        if old is not None:
            old.stop()
        server = self.host_server()
        server.env = {**self._env(), **(extra_env or {})}
        self._launch(server)
        server.wait_ready(timeout)
        return server

    def dead(self) -> list[str]:
        return [name for name, s in self.servers.items() if not s.alive()]

    def stop(self) -> None:
        """The host first (it drains its in-flight work against live
        dependencies), then the other servers together."""
        host = self.servers.get("host")
        if host is not None:
            host.stop()
        others = [
            s.child
            for name, s in reversed(self.servers.items())
            if name != "host" and s.child is not None
        ]
        for child in others:
            child.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT
        for child in others:
            child.stop(max(0.1, deadline - time.monotonic()))
        if not any(s.alive() for s in self.servers.values()):
            (self.run_dir / STATE_FILE).unlink(missing_ok=True)

    def _write_state(self) -> None:
        """Who runs this stack, for `python -m devstack down` after a crash."""
        import psutil

        state = {
            "owner": os.getpid(),
            "owner_started": psutil.Process().create_time(),
            "reaper": reaper_pid(),
            "tag": self.tag,
            "settings": str(self.settings_file.resolve()),
            "servers": {
                name: {"pid": s.child.pid if s.child else None, "port": s.port, "log": str(s.log)}
                for name, s in self.servers.items()
            },
        }
        path = self.run_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(path)

    def clean(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- stacks left behind: `python -m devstack status` and `down` ---------------------------


@dataclass
class LeftStack:
    """A run directory with a state file: what `status` shows and `down` stops."""

    run_dir: Path
    state: dict
    owner_alive: bool
    processes: list  # psutil.Process of every live process tagged with the run dir

    @property
    def running(self) -> bool:
        return self.owner_alive or bool(self.processes)


def _owner_alive(state: dict) -> bool:
    import psutil

    try:
        p = psutil.Process(state["owner"])
        # pids are reused: only the process that wrote the file counts
        return (
            abs(p.create_time() - state.get("owner_started", 0)) < 1
            and p.status() != psutil.STATUS_ZOMBIE
        )
    except (psutil.Error, KeyError, TypeError):
        return False


def running_stack_settings(runs: Path) -> tuple[Path, Path] | None:
    """(run dir, settings file) of the most recently started stack under `runs` whose
    owner is alive and that wrote its settings; None if there is none. Cheap: reads the
    state files and checks one pid each (for the CLI, which looks before every command)."""
    best: tuple[float, Path, Path] | None = None
    for run_dir in sorted(p for p in runs.glob("*") if p.is_dir()) if runs.is_dir() else []:
        try:
            state = json.loads((run_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            continue
        settings = Path(state.get("settings") or run_dir / SETTINGS_FILE)
        if not settings.exists() or not _owner_alive(state):
            continue
        started = float(state.get("owner_started") or 0)
        if best is None or started > best[0]:
            best = (started, run_dir, settings)
    return (best[1], best[2]) if best else None


def find_stacks(run_dirs: list[Path]) -> list[LeftStack]:
    found = []
    for run_dir in run_dirs:
        path = run_dir / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        tag = state.get("tag") or str(run_dir.resolve())
        found.append(LeftStack(run_dir, state, _owner_alive(state), processes_with(TAG_ENV, tag)))
    return found


def stack_status(left: LeftStack) -> list[str]:
    state = left.state
    lines = [
        f"{left.run_dir}: {'running' if left.running else 'stopped'}; owner pid {state.get('owner')} "
        f"{'alive' if left.owner_alive else 'gone'}"
    ]
    for name, s in state.get("servers", {}).items():
        listening = port_open(s["port"])
        who = port_owner(s["port"]) if listening else "nothing"
        lines.append(
            f"  {name:<10} port {s['port']:<5} {'listening: ' + who if listening else 'free'}"
        )
    for p in left.processes:
        lines.append(f"  process    {describe(p.pid)}")
    if state.get("settings"):
        lines.append(f"  settings   {state['settings']}")
    return lines


def stop_left_stack(left: LeftStack, timeout: float = 20) -> list[str]:
    """Stop a stack found in a run directory: its owner first (it stops its
    servers in order), then every process still tagged with the run dir."""
    import psutil

    said = []
    if left.owner_alive:
        owner = psutil.Process(left.state["owner"])
        said.append(f"stopping owner {describe(owner.pid)}")
        terminate([owner], timeout=timeout)
    leftovers = processes_with(TAG_ENV, left.state.get("tag") or str(left.run_dir.resolve()))
    if leftovers:
        said.append("stopping " + ", ".join(describe(p.pid) for p in leftovers))
        terminate(leftovers)
    (left.run_dir / STATE_FILE).unlink(missing_ok=True)
    return said
