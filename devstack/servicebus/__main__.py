"""Command line: `python -m devstack.servicebus --host 127.0.0.1 --port PORT --config FILE [--data-dir DIR]`.

Prints one line when ready, e.g.
`devstack.servicebus ready host=127.0.0.1 port=5672 queues=6`, and runs until
interrupted. `--port 0` binds a free port and prints it. `--log-level DEBUG`
logs every message's entity, message id, delivery count and outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from .config import ConfigError, load_config
from .server import EmulatorServer


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.servicebus", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument(
        "--config", required=True, help="a Config.json in the official emulator's shape"
    )
    parser.add_argument(
        "--data-dir", default=None, help="keep state in SQLite here; memory only without it"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    server = EmulatorServer(load_config(args.config), data_dir=args.data_dir)
    port = await server.start(args.host, args.port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"devstack.servicebus ready host={args.host} port={port} queues={server.broker.queue_count}"
        + (f" restored={server.restored}" if args.data_dir else ""),
        flush=True,
    )
    serving = loop.create_task(server.serve_forever())
    await stop.wait()
    serving.cancel()
    server.close()


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        asyncio.run(_serve(args))
    except ConfigError as exc:
        print(f"devstack.servicebus: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"devstack.servicebus: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
