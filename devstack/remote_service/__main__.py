"""`python -m devstack.remote_service --port PORT [--state-file F] [--seed N] [--catalog F]`

Serves the operations of the step catalog `--catalog` (default: the file the
setting STEP_CATALOG_FILE names, else domain/steps.json). Prints one line `remote-service ready http://127.0.0.1:PORT` once it listens
(`--port 0` picks a free port), and stops cleanly on SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from devstack.remote_service.app import create_app
from domain.steps import DEFAULT_CATALOG_FILE, StepCatalog, load_catalog

log = logging.getLogger("remote_service")

READY_PREFIX = "remote-service ready "


async def serve(
    host: str, port: int, state_file: Path | None, seed: int | None, steps: StepCatalog
) -> None:
    # Requests held by an injected outage would keep aiohttp's cleanup waiting
    # its default 60 s; a stopping service answers none of them anyway.
    runner = web.AppRunner(
        create_app(state_file=state_file, seed=seed, steps=steps),
        access_log=None,
        shutdown_timeout=2.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stopper(stop, sig))
    bound_host, bound_port = runner.addresses[0][:2]
    # Only once it listens and handles SIGTERM: whoever waits for this line
    # may stop it right away.
    print(f"{READY_PREFIX}http://{bound_host}:{bound_port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _stopper(stop: asyncio.Event, sig: signal.Signals) -> Callable[[], None]:
    def on_signal() -> None:
        # Said out loud: when a demo's service vanishes, its log tells why.
        log.warning("stopping on %s", sig.name)
        stop.set()

    return on_signal


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack.remote_service", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7081, help="0 picks a free port")
    parser.add_argument("--state-file", type=Path, help="keep the ledger across restarts")
    parser.add_argument("--seed", type=int, help="seed for rate-based faults")
    parser.add_argument(
        "--catalog",
        type=Path,
        default=Path(os.environ.get("STEP_CATALOG_FILE") or DEFAULT_CATALOG_FILE),
        help="the step catalog whose operations to serve (a JSON file like domain/steps.json)",
    )
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    steps = load_catalog(args.catalog)  # a bad catalog stops it here, saying which entry
    asyncio.run(serve(args.host, args.port, args.state_file, args.seed, steps))


if __name__ == "__main__":
    main()
