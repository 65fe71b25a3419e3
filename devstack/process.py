"""Child processes of the local stack: one way to start, stop and reap a
server, and to pick and inspect loopback ports.

Used by devstack.stack (`make up`, `make demo`, the benches), the Cosmos and
remote-service launchers and the test fixtures. See
docs/adr/stack-process-lifecycle.md for why it works this way:

- every child runs in a process group of its own, so a stop reaches its
  children too (node, a shell wrapper) and a terminal's Ctrl-C reaches only
  the owner, which then stops its servers in order;
- every child carries `DEVSTACK_OWNER=<token of the owner process>` in its
  environment (inherited by its own children), and the first child an owner
  starts also starts a reaper: a small process in its own session that reads
  a pipe from the owner. When the owner is gone, however it went (exit,
  exception, SIGTERM, SIGKILL), the pipe reaches end-of-file and the reaper
  stops every process that carries the owner's token;
- `exit_on_signals()` turns SIGTERM and SIGHUP into SystemExit, so the
  owner's `finally` blocks (and a fixture's teardown) run as they do on Ctrl-C.

    python -m devstack.process reap --owner TOKEN     (started by the helper)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
OWNER_ENV = "DEVSTACK_OWNER"
# Set by whoever wants to find a group of processes later (the stack puts its
# run directory here, so `python -m devstack down` finds a stack by it).
TAG_ENV = "DEVSTACK_TAG"
# A token of one Child, inherited by its own children: once the Child's leader is
# reaped its pid, and so its group id, may be reused, and only this proves that a
# process still in "its" group is ours.
CHILD_ENV = "DEVSTACK_CHILD"
# SIGTERM, then this long for a graceful stop, then SIGKILL. The host's own
# drain budget (devstack.host --drain-seconds, 5 s) fits inside it.
STOP_TIMEOUT = 8.0

_shutdown = threading.Event()


# --- ports ---------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports (all held open until all are chosen)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Something accepts connections on host:port."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def port_owner(port: int) -> str:
    """Who listens on `port`, in words: 'pid 123 (node .../azurite ...)'."""
    import psutil

    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        connections = []
    for c in connections:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            if c.pid is None:
                return "a process of another user"
            return describe(c.pid)
    return "an unknown process (not visible to this user)"


def describe(pid: int) -> str:
    import psutil

    try:
        p = psutil.Process(pid)
        cmd = " ".join(p.cmdline()) or p.name()
    except (psutil.Error, OSError):
        return f"pid {pid}"
    return f"pid {pid} ({cmd[:160]})"


def wait_ports_free(ports: Iterable[int], timeout: float) -> list[int]:
    """Wait until nothing listens on `ports`; return those still taken."""
    deadline = time.monotonic() + timeout
    taken = [p for p in ports if port_open(p)]
    while taken and time.monotonic() < deadline:
        time.sleep(0.1)
        taken = [p for p in taken if port_open(p)]
    return taken


# --- signals ---------------------------------------------------------------------------


def shutting_down() -> bool:
    """A stop signal arrived (see exit_on_signals); loops waiting for a
    server to come up give up instead of waiting out their timeout."""
    return _shutdown.is_set()


def request_shutdown() -> None:
    _shutdown.set()


def exit_on_signals(
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT),
) -> None:
    """Make SIGTERM and SIGHUP end the program like Ctrl-C does, by raising
    SystemExit(128 + signal) in the main thread (KeyboardInterrupt for
    SIGINT), so `finally` blocks and context managers stop what was started.
    A second signal while stopping is ignored: the stop is already under way,
    and the reaper is the backstop."""

    def handler(signum: int, _frame: Any) -> None:
        if _shutdown.is_set():
            return
        _shutdown.set()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    for sig in signals:
        signal.signal(sig, handler)


# --- the reaper ----------------------------------------------------------------------

_owner: tuple[int, str] | None = None
_reaper: tuple[int, subprocess.Popen[bytes]] | None = None
_reaper_lock = threading.Lock()


def owner_token() -> str:
    """This process's token: its pid and a random part (pids are reused)."""
    global _owner
    if _owner is None or _owner[0] != os.getpid():
        _owner = (os.getpid(), f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
    return _owner[1]


def reaper_pid() -> int | None:
    if _reaper is None or _reaper[0] != os.getpid() or _reaper[1].poll() is not None:
        return None
    return _reaper[1].pid


def ensure_reaper() -> int:
    """Start this process's reaper unless it runs already; returns its pid."""
    global _reaper
    with _reaper_lock:
        pid = reaper_pid()
        if pid is not None:
            return pid
        env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
        process = subprocess.Popen(
            [sys.executable, "-m", "devstack.process", "reap", "--owner", owner_token()],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,  # the write end stays here: EOF means we are gone
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # not hit by the signals that hit our group
        )
        _reaper = (os.getpid(), process)
        return process.pid


def processes_with(var: str, value: str) -> list[Any]:
    """Live processes (psutil.Process) whose environment has var=value.
    Processes of other users cannot be read and are never matched."""
    import psutil

    me, found = os.getpid(), []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(var) == value:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def terminate(processes: list[Any], timeout: float = STOP_TIMEOUT) -> list[Any]:
    """SIGTERM each, wait up to `timeout`, SIGKILL what is left; returns
    the processes that were still alive after the grace period."""
    import psutil

    for p in processes:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return alive


def _reap(owner: str) -> int:
    # Ours to finish once started: a terminal's SIGINT or SIGHUP must not cut it short.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        while os.read(sys.stdin.fileno(), 4096):
            pass
    orphans = processes_with(OWNER_ENV, owner)
    if orphans:
        names = ", ".join(describe(p.pid) for p in orphans)
        print(
            f"devstack reaper: owner {owner.split('-')[0]} is gone; stopping {names}",
            file=sys.stderr,
            flush=True,
        )
        terminate(orphans)
    return 0


# --- children ------------------------------------------------------------------------


@dataclass
class Child:
    """One server process, in a process group of its own."""

    name: str
    process: subprocess.Popen[Any]
    argv: list[str] = field(default_factory=list)
    token: str = ""  # CHILD_ENV of its processes ("" for a Child built around a foreign Popen)
    _done: bool = field(
        default=False, init=False, repr=False
    )  # stopped or killed, and reaped: nothing left to signal
    _reaped_elsewhere: bool = field(
        default=False, init=False, repr=False
    )  # by a waitpid not Popen's

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        *,
        cwd: Path | str = REPO,
        env: dict[str, str] | None = None,
        tag: str | None = None,
        stdin: Any = subprocess.DEVNULL,
        stdout: Any = None,
        stderr: Any = None,
        text: bool = False,
    ) -> Child:
        """Start `argv` under the reaper's watch. `env` defaults to ours;
        `tag` lands in DEVSTACK_TAG so that the group can be found later."""
        ensure_reaper()
        child_env = dict(os.environ if env is None else env)
        child_env[OWNER_ENV] = owner_token()
        child_env[CHILD_ENV] = token = uuid.uuid4().hex
        if tag is not None:
            child_env[TAG_ENV] = tag
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=child_env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            text=text,
            start_new_session=True,
        )
        return cls(name, process, list(argv), token)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def alive(self) -> bool:
        return not self._exited()

    def _reaped(self) -> bool:
        """Its exit status was collected: from then on its pid and group id may be reused."""
        return self.process.returncode is not None or self._reaped_elsewhere

    def _exited(self) -> bool:
        """The leader has exited; it is left unreaped (a zombie) where the platform allows,
        so that its group id stays ours until stop() or kill() has swept the group."""
        if self._reaped():
            return True
        if not hasattr(os, "waitid"):
            return self.process.poll() is not None
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped behind Popen's back
            self._reaped_elsewhere = True
            return True

    def _wait_exit(self, timeout: float | None) -> bool:
        """Wait up to `timeout` (None: for ever) for the leader to exit, without reaping it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while not self._exited():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return True

    def wait(self, timeout: float | None) -> bool:
        """Wait up to `timeout` for the child to exit (True if it did), leaving it to `stop`
        to sweep its group and reap it."""
        return self._wait_exit(timeout)

    def signal(self, sig: int) -> None:
        """Send `sig` to the whole group (the server and any children of it). A no-op once
        the leader is reaped: the group id is then no proof the group is ours."""
        if self._reaped():
            return
        # A reap by another thread between the check above and this call would reopen the
        # window; Popen offers no hook to close it, and our own stop/kill do not race so.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def terminate(self) -> None:
        """Ask to stop (SIGTERM) without waiting; `stop` waits."""
        if self.alive():
            self.signal(signal.SIGTERM)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM the group, wait up to `timeout`, then SIGKILL it; returns
        the exit code. Whatever else is left in the group is killed too.
        A no-op for a child already stopped."""
        if not self._done:
            swept = False
            if not self._reaped():
                self.signal(signal.SIGTERM)
                if not self._wait_exit(timeout):
                    self.signal(signal.SIGKILL)
                    self._wait_exit(None)
                # The leader has exited but is not reaped, so the group id is still ours:
                # a child of it that ignored SIGTERM is killed with the group.
                swept = not self._reaped()
                self.signal(signal.SIGKILL)
                self.process.wait()
            if not swept:
                # Reaped before we could sweep (someone polled it after it exited on its
                # own): kill only what carries this child's token, never the group id.
                self._kill_leftovers()
            self._done = True
        self._close_pipes()
        return self.process.returncode

    def kill(self) -> None:
        """kill -9 of the group: the crash the fault tests and the demo inject.
        A no-op for a child already stopped."""
        if not self._done:
            swept = not self._reaped()
            self.signal(signal.SIGKILL)
            self.process.wait()
            if not swept:
                self._kill_leftovers()
            self._done = True
        self._close_pipes()

    def _kill_leftovers(self) -> None:
        """SIGKILL the live processes of this child's group that carry its token."""
        if not self.token:
            return
        import psutil

        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) != self.pid or p.status() == psutil.STATUS_ZOMBIE:
                    continue
                if p.environ().get(CHILD_ENV) == self.token:
                    p.kill()  # psutil refuses if the pid was reused since process_iter saw it
            except (psutil.Error, OSError):
                continue

    def _close_pipes(self) -> None:
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None and not stream.closed:
                with contextlib.suppress(OSError):
                    stream.close()


def stop_all(children: Iterable[Child], timeout: float = STOP_TIMEOUT) -> None:
    """Stop several children at once: SIGTERM to all, then wait for each
    within one shared deadline, then SIGKILL what is left."""
    children = list(children)
    for c in children:
        c.terminate()
    deadline = time.monotonic() + timeout
    for c in children:
        c.stop(max(0.1, deadline - time.monotonic()))


def wait_listening(child: Child, port: int, timeout: float, log: Path | str | None = None) -> None:
    """Wait until `child` accepts connections on `port`; raise ChildStartError
    (naming the log) if it exits, the timeout passes, or a stop signal comes."""
    deadline = time.monotonic() + timeout
    where = f"; see {log}" if log else ""
    while time.monotonic() < deadline:
        if shutting_down():
            raise ChildStartError(f"{child.name}: start abandoned, stopping")
        if not child.alive():
            raise ChildStartError(f"{child.name} exited with {child.returncode}{where}")
        if port_open(port):
            return
        time.sleep(0.1)
    raise ChildStartError(f"{child.name} not ready on port {port} after {timeout:.0f}s{where}")


def read_line(stream: IO[Any], timeout: float) -> str:
    """One line from a child's pipe, or '' if none comes within `timeout`."""
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else ""


class ChildStartError(RuntimeError):
    """A child did not come up; the message names it and where its log is."""


@contextlib.contextmanager
def started(*children: Child) -> Iterator[tuple[Child, ...]]:
    """Stop `children` when the block ends, however it ends."""
    try:
        yield children
    finally:
        stop_all(children)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.process")
    sub = parser.add_subparsers(dest="command", required=True)
    reap = sub.add_parser("reap", help="stop the owner's processes once its pipe closes")
    reap.add_argument("--owner", required=True)
    args = parser.parse_args(argv)
    return _reap(args.owner)


if __name__ == "__main__":
    sys.exit(main())
