"""`python -m devstack.host --app function_app:app [--settings local.settings.json] [--clock controllable]`"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from .errors import HostError
from .runtime import Host, HostOptions


def parse_args(argv: list[str] | None = None) -> HostOptions:
    p = argparse.ArgumentParser(prog="python -m devstack.host",
                                description="Run a Python Functions app without the Functions host.")
    p.add_argument("--app", default="function_app:app", help="module:attribute of the FunctionApp/DFApp")
    p.add_argument("--app-dir", default=None, help="directory of the app (default: current directory)")
    p.add_argument("--settings", default=None, help="local.settings.json to read (default: <app-dir>/local.settings.json if present); "
                   "its Values become app settings unless the environment has them")
    p.add_argument("--host-json", default=None, help="host.json (default: <app-dir>/host.json)")
    p.add_argument("--data-dir", default=".devstack/host", help="where the task hub's SQLite file lives")
    p.add_argument("--port", type=int, default=int(os.environ.get("DEVSTACK_HOST_PORT", "0")),
                   help="port of the durable HTTP API on 127.0.0.1 (default: a free port)")
    p.add_argument("--clock", choices=["real", "controllable"], default="real")
    p.add_argument("--clock-start", default=None,
                   help="with --clock controllable: the ISO-8601 UTC time the clock starts at (default: now)")
    p.add_argument("--lease-seconds", type=float, default=5.0,
                   help="a dead host's orchestrations and activities are taken over after this long")
    p.add_argument("--host-id", default=None, help="host id for timer singleton leases (default: from --app)")
    p.add_argument("--log-level", default=os.environ.get("DEVSTACK_HOST_LOG", "INFO"))
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("azure", "uamqp", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return HostOptions(app=a.app, app_dir=a.app_dir, settings=a.settings, host_json=a.host_json,
                       data_dir=a.data_dir, port=a.port, clock=a.clock, clock_start=a.clock_start, lease_seconds=a.lease_seconds,
                       host_id=a.host_id)


async def _main(options: HostOptions) -> None:
    host = Host(options)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, host.stop)
    await host.run()


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        asyncio.run(_main(options))
    except HostError as exc:
        print(f"devstack.host: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
