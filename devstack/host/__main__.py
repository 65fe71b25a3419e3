"""`python -m devstack.host [--app function_app[:app]] [--settings local.settings.json] [--clock controllable]`"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading

from .errors import HostError
from .runtime import Host, HostOptions


def parse_args(argv: list[str] | None = None) -> HostOptions:
    p = argparse.ArgumentParser(
        prog="python -m devstack.host",
        description="Run a Python Functions app without the Functions host.",
    )
    p.add_argument(
        "--app",
        default="function_app",
        help="the app's module, searched for its one FunctionApp/DFApp as the worker does "
        "(default: function_app), or module:attribute",
    )
    p.add_argument(
        "--app-dir", default=None, help="directory of the app (default: current directory)"
    )
    p.add_argument(
        "--settings",
        default=None,
        help="local.settings.json to read (default: <app-dir>/local.settings.json if present); "
        "its Values become app settings unless the environment has them",
    )
    p.add_argument("--host-json", default=None, help="host.json (default: <app-dir>/host.json)")
    p.add_argument(
        "--data-dir", default=".devstack/host", help="where the task hub's SQLite file lives"
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("DEVSTACK_HOST_PORT", "0")),
        help="port of the durable HTTP API on 127.0.0.1 (default: a free port)",
    )
    p.add_argument("--clock", choices=["real", "controllable"], default="real")
    p.add_argument(
        "--clock-start",
        default=None,
        help="with --clock controllable: the ISO-8601 UTC time the clock starts at (default: now)",
    )
    p.add_argument(
        "--lease-seconds",
        type=float,
        default=5.0,
        help="a dead host's orchestrations and activities are taken over after this long",
    )
    p.add_argument(
        "--host-id", default=None, help="host id for timer singleton leases (default: from --app)"
    )
    p.add_argument("--log-level", default=os.environ.get("DEVSTACK_HOST_LOG", "INFO"))
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=DRAIN_SECONDS,
        help="after SIGTERM/SIGINT, how long in-flight work may take before the process exits anyway",
    )
    a = p.parse_args(argv)
    global _drain_seconds
    _drain_seconds = a.drain_seconds
    logging.basicConfig(
        level=a.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("azure", "uamqp", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return HostOptions(
        app=a.app,
        app_dir=a.app_dir,
        settings=a.settings,
        host_json=a.host_json,
        data_dir=a.data_dir,
        port=a.port,
        clock=a.clock,
        clock_start=a.clock_start,
        lease_seconds=a.lease_seconds,
        host_id=a.host_id,
    )


# A stop drains in-flight work (Service Bus invocations finish and settle,
# running orchestration episodes and activities finish, timer functions
# return) for at most this long; then the process exits without waiting
# further. Anything cut short is what a crash leaves, which the host recovers
# from by design (message locks expire, orchestration leases are taken over).
DRAIN_SECONDS = 5.0
_drain_seconds = DRAIN_SECONDS
log = logging.getLogger("devstack.host")


def _hard_exit(reason: str, code: int) -> None:
    log.warning("%s; exiting now", reason)
    logging.shutdown()
    os._exit(code)


async def _main(options: HostOptions) -> None:
    host = Host(options)
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if host_stopping.is_set():
            _hard_exit(f"second {sig.name} while draining", 128 + sig)
        host_stopping.set()
        log.info("%s: draining in-flight work for up to %.0fs", sig.name, _drain_seconds)
        host.stop()
        # A thread, not the loop: a drain stuck in a blocking call must not hold the exit.
        timer = threading.Timer(
            _drain_seconds,
            _hard_exit,
            (f"drain not finished after {_drain_seconds:.0f}s", 128 + sig),
        )
        timer.daemon = True
        timer.start()

    host_stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await host.run()
    except (HostError, asyncio.CancelledError):
        raise
    except Exception as exc:
        if host.ready:
            raise
        # Whatever stops the start is a refusal: one line, exit 2, as docs/local-host.md
        # promises; the traceback is for --log-level DEBUG.
        log.debug("start-up failed", exc_info=True)
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise HostError(
            f"cannot start: {type(exc).__name__}: {first} (--log-level DEBUG shows the traceback)"
        ) from None


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
