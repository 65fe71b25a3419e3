"""`python -m devstack up | status | down`: the local stack from the command line.

`up` starts Azurite, the Cosmos DB server, the Service Bus emulator, the
remote service and the local host on the ports local.settings.template.json
names (or free ones), waits until each is ready, writes the settings for those
ports (<run-dir>/local.settings.json, and ./local.settings.json unless you
have your own), prints where they are and the connection strings, keeps every
store's data in the run directory across restarts, and stops them all on
Ctrl-C, SIGTERM, SIGHUP, or as soon as one of them dies. A port already taken
is named, with the process that holds it, before anything starts.

`status` shows the stacks whose state file (stack.json) is in a run directory
under .devstack/ (or --run-dir), and `down` stops them: the process that
started the stack first, then any process still tagged with the run directory
(a stack left by a crashed or killed run)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from devstack.process import exit_on_signals, request_shutdown, shutting_down
from devstack.stack import (
    KEYS_FILE,
    REPO,
    SETTINGS_FILE,
    WRITTEN_BY,
    Ports,
    Stack,
    StackError,
    find_stacks,
    stack_status,
    stop_left_stack,
)

RUNS = REPO / ".devstack"


def _run_dirs(run_dir: str | None) -> list[Path]:
    if run_dir:
        return [Path(run_dir)]
    return sorted(p for p in RUNS.glob("*") if p.is_dir()) if RUNS.is_dir() else []


def up(args: argparse.Namespace) -> int:
    if args.free_ports:
        ports = Ports.free()
    elif args.base_port:
        ports = Ports(*range(args.base_port, args.base_port + 7))
    else:
        ports = Ports()
    if not args.free_ports:
        taken = ports.taken()
        if taken:
            for port, owner in taken.items():
                print(f"devstack: port {port} is taken by {owner}", file=sys.stderr)
            print(
                "devstack: stop it (`python -m devstack down` stops a stack left by an earlier run)"
                " or run with --free-ports",
                file=sys.stderr,
            )
            return 1
    try:
        overrides = shard_overrides(args.shard) if args.shard else {}
    except ValueError as exc:
        print(f"devstack: --shard: {exc}", file=sys.stderr)
        return 2
    if args.remote_service_url:
        overrides["REMOTE_SERVICE_URL"] = args.remote_service_url
    stack = Stack(
        Path(args.run_dir),
        ports=ports,
        overrides=overrides,
        with_host=not args.no_host,
        keep_cosmos=True,
    )
    reset = stack.reconcile_data()
    if reset:
        print(f"devstack: WARNING: {reset}", file=sys.stderr, flush=True)
    exit_on_signals()
    try:
        try:
            stack.start()
        except StackError as exc:
            print(f"devstack: {exc}", file=sys.stderr)
            return 1
        for name, server in stack.servers.items():
            print(f"devstack: {name:<10} ready on 127.0.0.1:{server.port}  (log: {server.log})")
        print(
            f"devstack: keys       AGENT_SIGNING_KEYS, REPLY_TOKEN_KEYS in "
            f"{Path(args.run_dir) / KEYS_FILE} (for `func start` with --no-host)"
        )
        if "host" in stack.servers:
            print(f"devstack: console    http://127.0.0.1:{stack.servers['host'].port}/api/console")
        hand_over_settings(stack)
        print(
            f"devstack: up (pid {os.getpid()}); Ctrl-C or `python -m devstack down` "
            "stops everything",
            flush=True,
        )
        while not shutting_down():
            dead = stack.dead()
            if dead:
                print(f"devstack: {', '.join(dead)} stopped; stopping the rest", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    except KeyboardInterrupt:
        request_shutdown()
        return 130
    finally:
        started = time.monotonic()
        stack.stop()
        print(
            f"devstack: stopped in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True
        )


def shard_overrides(text: str) -> dict[str, str]:
    """`I/N`: the settings of shard I of N (docs/adr/020e-task-hub-shards.md): its
    SHARD_INDEX and SHARD_COUNT and a task hub of its own, OrderProcessingS<I>."""
    index, sep, count = text.partition("/")
    if not sep or not index.isdigit() or not count.isdigit():
        raise ValueError(f"{text!r} is not INDEX/COUNT (e.g. 1/2)")
    from domain.shards import check_shard_count

    check_shard_count(int(count))
    if int(index) >= int(count):
        raise ValueError(f"shards of {count} are numbered 0 to {int(count) - 1}, not {index}")
    return {
        "SHARD_COUNT": str(int(count)),
        "SHARD_INDEX": str(int(index)),
        "TASKHUB_NAME": f"OrderProcessingS{int(index)}",
    }


CONNECTIONS = (
    "ServiceBusConnection",
    "CosmosDbConnection",
    "AzureWebJobsStorage",
    "REMOTE_SERVICE_URL",
)


def _local_settings() -> Path:
    """./local.settings.json: what `func start` and the CLI read from where they run."""
    return Path.cwd() / SETTINGS_FILE


def hand_over_settings(stack: Stack) -> None:
    """Write the settings for the ports this stack chose and say where they are: always in
    the run directory, and as ./local.settings.json when there is none (or the one there
    is an earlier `up`'s). A local.settings.json of the user's own is left alone, and
    named loudly if it points elsewhere."""
    written = stack.write_settings()
    print(f"devstack: settings   {written}")
    mine = _written_by_devstack(_local_settings())
    if mine is None or mine:
        stack.write_settings(_local_settings())
        print(
            f"devstack: settings   {_local_settings()} (written for these ports; the CLI reads it)"
        )
    else:
        try:
            theirs = json.loads(_local_settings().read_text()).get("Values", {})
        except (OSError, ValueError):
            theirs = {}
        differ = [k for k in CONNECTIONS if theirs.get(k) not in (None, stack.settings[k])]
        if differ:
            print(
                f"devstack: WARNING: {_local_settings()} is your own and names other endpoints "
                f"({', '.join(differ)}); the CLI and `func start` read it, not this stack. "
                f"Point them here with LOCAL_SETTINGS={written}, or remove it and run up again.",
                file=sys.stderr,
            )
    for key in CONNECTIONS:
        print(f"devstack: {key}={stack.settings[key]}")
    data = stack.cosmos_data_line()
    if data:
        print(f"devstack: data       kept in {stack.run_dir} (Cosmos: {data})")


def _written_by_devstack(path: Path) -> bool | None:
    """None: no file; True: written by `up`; False: the user's own (or unreadable)."""
    if not path.exists():
        return None
    try:
        return WRITTEN_BY in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        return False


def status(args: argparse.Namespace) -> int:
    stacks = find_stacks(_run_dirs(args.run_dir))
    if not stacks:
        print(
            "devstack: no stack state found"
            + (f" in {args.run_dir}" if args.run_dir else f" under {RUNS}")
        )
    for left in stacks:
        print("\n".join(stack_status(left)))
    return 0


def down(args: argparse.Namespace) -> int:
    stacks = find_stacks(_run_dirs(args.run_dir))
    for left in stacks:
        for line in stop_left_stack(left):
            print(f"devstack: {left.run_dir}: {line}")
        print(f"devstack: {left.run_dir}: down")
    if not stacks:
        print("devstack: nothing to stop")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start the whole local stack in the foreground")
    p_up.add_argument(
        "--run-dir", default=str(RUNS / "up"), help="data and logs (kept between runs)"
    )
    p_up.add_argument(
        "--no-host", action="store_true", help="servers only (run `func start` yourself)"
    )
    p_up.add_argument(
        "--free-ports",
        action="store_true",
        help="free ports instead of the template's fixed ones (printed when ready)",
    )
    p_up.add_argument(
        "--base-port",
        type=int,
        default=0,
        help="seven consecutive ports from this one instead of the template's "
        "(blob, queue, table, cosmos, servicebus, remote, host)",
    )
    p_up.add_argument(
        "--shard",
        default="",
        metavar="I/N",
        help="run shard I of N (SHARD_INDEX, SHARD_COUNT, task hub OrderProcessingS<I>); "
        "one stack per shard, each with its own --run-dir and ports",
    )
    p_up.add_argument(
        "--remote-service-url",
        default="",
        help="call this remote service instead of the stack's own (shards share one)",
    )
    p_status = sub.add_parser("status", help="show stacks found in run directories")
    p_status.add_argument(
        "--run-dir", default=None, help="one run directory (default: all under .devstack/)"
    )
    p_down = sub.add_parser(
        "down", help="stop stacks found in run directories, left by earlier runs too"
    )
    p_down.add_argument(
        "--run-dir", default=None, help="one run directory (default: all under .devstack/)"
    )
    sub.add_parser(
        "key",
        help="print a new random key for AGENT_SIGNING_KEYS or REPLY_TOKEN_KEYS "
        "(for local.settings.json with `func start`; docs/adr/017e-internal-queue-keys.md)",
    )
    args = parser.parse_args(argv)
    return {"up": up, "status": status, "down": down, "key": key}[args.command](args)


def key(_args: argparse.Namespace) -> int:
    from domain.signing import new_key

    print(new_key())
    return 0


if __name__ == "__main__":
    sys.exit(main())
