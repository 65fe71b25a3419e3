"""The emulator process: an asyncio TCP server, its connections and the timer
loop that expires locks, activates scheduled messages and ends time to live."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from .config import QueueSettings, TopicSettings
from .entities import Broker
from .journal import SqliteJournal
from .protocol import Connection

_LOG = logging.getLogger("devstack.servicebus")

#: Longest sleep of the timer loop; timers fire within this of being due.
TIMER_TICK_S = 0.05


class EmulatorServer:
    """Owns the broker, the listening socket and every client connection."""

    def __init__(
        self, entities: list[QueueSettings | TopicSettings], data_dir: str | Path | None = None
    ) -> None:
        self.journal = SqliteJournal(data_dir) if data_dir else None
        self.broker = Broker(entities, journal=self.journal)
        self.restored = self.journal.restore(self.broker) if self.journal else 0
        self.connections: set[Connection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._timer_task: asyncio.Task | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 picks a free port); return the bound port."""
        self._server = await asyncio.start_server(self._on_client, host, port)
        self._timer_task = asyncio.get_running_loop().create_task(self._run_timers())
        return self._server.sockets[0].getsockname()[1]

    async def serve_forever(self) -> None:
        assert self._server is not None
        try:
            await self._server.serve_forever()
        finally:
            self.close()

    def close(self) -> None:
        if self._timer_task:
            self._timer_task.cancel()
        if self._server:
            self._server.close()
        if self.journal:
            self.journal.close()

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(self, reader, writer)
        self.connections.add(connection)
        await connection.run()

    def forget(self, connection: Connection) -> None:
        self.connections.discard(connection)

    async def _run_timers(self) -> None:
        while True:
            due = self.broker.next_timer_ms()
            now = self.broker.clock()
            delay = TIMER_TICK_S if due is None else min(TIMER_TICK_S, max(0.0, (due - now) / 1000))
            await asyncio.sleep(delay)
            try:
                self.broker.run_timers()
                self.broker.journal.flush()
            except Exception:  # keep the loop alive: one bad timer must not stop lock expiry
                _LOG.exception("timer loop failed")
