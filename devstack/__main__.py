"""`python -m devstack up`: the whole local stack in the foreground.

Starts Azurite, the Cosmos DB server, the Service Bus emulator, the remote
service and the local host on the ports local.settings.template.json names,
waits until each is ready, prints where they are, and stops them all on Ctrl-C
or as soon as one of them dies."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from devstack.stack import Ports, Stack, StackError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the whole local stack in the foreground")
    up.add_argument("--run-dir", default=".devstack/up", help="data and logs (kept between runs)")
    up.add_argument("--no-host", action="store_true", help="servers only (run `func start` yourself)")
    args = parser.parse_args(argv)

    stack = Stack(Path(args.run_dir), ports=Ports(), with_host=not args.no_host)
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        stack.start()
    except StackError as exc:
        print(f"devstack: {exc}", file=sys.stderr)
        return 1
    for name, server in stack.servers.items():
        print(f"devstack: {name:<10} ready on 127.0.0.1:{server.port}  (log: {server.log})")
    print("devstack: up; Ctrl-C stops everything")
    try:
        while not stopping:
            dead = stack.dead()
            if dead:
                print(f"devstack: {', '.join(dead)} stopped; stopping the rest", file=sys.stderr)
                return 1
            time.sleep(0.5)
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
