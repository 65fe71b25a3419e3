"""The standalone agent worker's entry (`python -m agents.worker`): settings,
signals, and the composition root's RequestProcessor handed to `serve`."""

from __future__ import annotations

import asyncio
import logging
import signal

import bootstrap
from adapters import telemetry
from agents.config import load_agent_settings, require_agent_keys
from agents.worker import READY_LINE, serve


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    telemetry.configure()
    settings = load_agent_settings()
    require_agent_keys(settings)  # no keys: refuse to start, before connecting anywhere

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(
            settings,
            stop,
            lambda: print(READY_LINE, flush=True),
            lambda client, session, cfg: bootstrap.request_processor(client, session, cfg),
        )

    try:
        asyncio.run(run())
    finally:
        telemetry.flush()


if __name__ == "__main__":
    main()
