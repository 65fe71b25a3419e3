"""The host process: wires the app's functions to their triggers and runs until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import re
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from .app import (
    DURABLE_CLIENT,
    HTTP_OUTPUT,
    HTTP_TRIGGER,
    QUEUE_TRIGGER,
    SERVICE_BUS_TRIGGER,
    SUPPORTED_TRIGGERS,
    TIMER_TRIGGER,
    index_app,
    load_app,
)
from .clock import Clock, ControllableClock
from .config import DEFAULT_VERSION_SETTING, load_host_json, load_local_settings
from .durable import DurableEngine
from .errors import HostError
from .http_api import DurableHttpApi, client_binding
from .http_triggers import HttpTriggers, route_prefix
from .invoke import set_output_sender
from .outputs import QUEUE_OUTPUT, QueueOutputSender
from .queues import QueueTriggers
from .replay import install_settled_strict_mode
from .servicebus import ServiceBusTriggers
from .store import Store
from .timers import TimerTriggers

log = logging.getLogger("devstack.host")

HEARTBEAT_EVERY = 1.0


@dataclass
class HostOptions:
    app: str
    app_dir: str | None = None
    settings: str | None = None
    host_json: str | None = None
    data_dir: str = ".devstack/host"
    port: int = 0
    clock: str = "real"
    clock_start: str | None = None
    lease_seconds: float = 5.0
    host_id: str | None = None


def _free_port() -> int:
    from devstack.process import free_port  # the stack's one port helper

    return free_port()


class Host:
    def __init__(self, options: HostOptions) -> None:
        self.options = options
        self.clock: Clock = Clock()
        if options.clock == "controllable":
            start = None
            if options.clock_start:
                try:
                    start = datetime.fromisoformat(options.clock_start.replace("Z", "+00:00"))
                except ValueError:
                    raise HostError(
                        f"--clock-start {options.clock_start!r} is not an ISO-8601 time"
                    ) from None
                start = start if start.tzinfo else start.replace(tzinfo=UTC)
            self.clock = ControllableClock(start)
        self._stop = asyncio.Event()
        self.ready = False  # set once the ready line is printed

    async def run(self) -> None:
        o = self.options
        app_dir = Path(o.app_dir or os.getcwd())
        settings = o.settings
        if settings is None and (app_dir / "local.settings.json").exists():
            settings = str(app_dir / "local.settings.json")  # what `func start` reads
        load_local_settings(settings)
        host_json = o.host_json or str(app_dir / "host.json")
        config = load_host_json(host_json)
        # The app reads the version new instances get from the same place the
        # host does: a host.json given with --host-json is not next to the app.
        os.environ[DEFAULT_VERSION_SETTING] = config.durable.default_version
        install_settled_strict_mode()
        app = load_app(o.app, str(app_dir))
        catalog = index_app(app)
        for f in catalog.functions:
            if f.trigger_type not in SUPPORTED_TRIGGERS:
                raise HostError(
                    f"function {f.name}: trigger {f.trigger_type!r} is not supported by devstack.host"
                )
            for b in f.bindings:
                if b == f.trigger or b.get("type") == DURABLE_CLIENT:
                    continue
                if f.trigger_type == HTTP_TRIGGER and b.get("type") == HTTP_OUTPUT:
                    continue
                if b.get("type") == QUEUE_OUTPUT and str(b.get("direction")).upper() == "OUT":
                    continue
                raise HostError(
                    f"function {f.name}: binding {b.get('type')!r} ({b.get('name')}) "
                    "is not supported by devstack.host"
                )

        outputs = QueueOutputSender(config.queues.message_encoding)
        for f in catalog.functions:
            outputs.check(f)
        set_output_sender(outputs)

        # Azure's setting names keep Azure's spelling: environment names are case-sensitive on Linux.
        host_id = (
            o.host_id
            or os.environ.get("AzureFunctionsWebHost__hostid")  # noqa: SIM112 - Azure's exact spelling
            or _default_host_id(o.app)
        )
        storage = os.environ.get("AzureWebJobsStorage")  # noqa: SIM112 - Azure's exact spelling
        if catalog.of_type(TIMER_TRIGGER) and not storage:
            raise HostError(
                "missing app setting 'AzureWebJobsStorage' (timer triggers keep their singleton lease "
                "and schedule status there); set it in local.settings.json or the environment"
            )

        Path(o.data_dir).mkdir(parents=True, exist_ok=True)
        process_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        store = Store(
            str(Path(o.data_dir) / f"{config.durable.hub_name}.sqlite"), process_id, o.lease_seconds
        )
        store.heartbeat()

        port = o.port or _free_port()
        base = f"http://127.0.0.1:{port}"
        binding = client_binding(base, config.durable.hub_name)
        binding_json = json.dumps(binding)
        engine = DurableEngine(store, catalog, self.clock, config.durable, binding)
        timer_view: list[TimerTriggers] = []
        api = DurableHttpApi(
            engine,
            self.clock,
            [base],
            timers=lambda: timer_view[0].describe() if timer_view else [],
            functions=lambda: [
                {"name": fn.name, "trigger": fn.trigger_type} for fn in catalog.functions
            ],
        )
        http = HttpTriggers(
            catalog.of_type(HTTP_TRIGGER), route_prefix(config.raw), lambda: binding_json
        )
        web_app = web.Application(
            client_max_size=100 * 1024 * 1024
        )  # the host's default request limit
        web_app.add_routes(api.routes())
        if http.routes:
            # After the durable and admin routes, as the real host puts its own routes first.
            web_app.router.add_route("*", "/{tail:.*}", http.handle)
        runner = web.AppRunner(web_app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        try:
            await site.start()
        except OSError as exc:
            raise HostError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None

        timers = TimerTriggers(
            catalog.of_type(TIMER_TRIGGER), self.clock, storage, host_id, lambda: binding_json
        )
        timer_view.append(timers)
        sb = ServiceBusTriggers(
            catalog.of_type(SERVICE_BUS_TRIGGER), config.service_bus, lambda: binding_json
        )
        queues = QueueTriggers(catalog.of_type(QUEUE_TRIGGER), config.queues, lambda: binding_json)
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        heartbeats: list[Callable[[], None]] = []
        try:
            sb.start(loop)
            await sb.check_reachable()
            await queues.start()
            await timers.start()
            tasks.append(asyncio.create_task(engine.run(), name="durable"))
            # On a thread with its own connection: a loop busy with a long episode, or waiting
            # for another host's write lock, must not let this host's locks lapse (another host
            # would then run its activities a second time).
            heartbeats.append(store.start_heartbeats(HEARTBEAT_EVERY))
            counts = {
                kind: len(catalog.of_type(kind))
                for kind in sorted({f.trigger_type for f in catalog.functions})
            }
            print(
                f"devstack.host ready: app={o.app} functions={len(catalog.functions)} "
                f"({', '.join(f'{k}={v}' for k, v in counts.items())}) durable={base}/durabletask/ "
                + (
                    f"http={base}/{http.prefix + '/' if http.prefix else ''} "
                    if http.routes
                    else ""
                )
                + f"hub={config.durable.hub_name} clock={o.clock} pid={os.getpid()}",
                flush=True,
            )
            # Started: what the app, the SDKs and the host built so far lives as long as the
            # process. Frozen out of the collector's passes, a full pass no longer walks the
            # 130,000 objects of the modules each time (bench/pipeline_bench.py, 400 orders:
            # the collector's CPU 1.7 -> 1.0 s, its full passes 0.61 -> 0.09 s).
            gc.freeze()
            self.ready = True
            stop_wait = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stop_wait and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            engine.stop()
            await timers.stop()
            await sb.stop()
            await queues.stop()
            await engine.drain(timeout=20)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await runner.cleanup()
            await _close_durable_client_session()
            for stop_beating in heartbeats:
                stop_beating()  # before the release, which deletes the heartbeat row
            with contextlib.suppress(Exception):
                store.release_host()
            store.close()
            # Apps keep their aio clients (Cosmos, aiohttp) for the process's life and never close
            # them; a worker exits without complaining about it, and so does this host.
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)

    def stop(self) -> None:
        self._stop.set()


async def _close_durable_client_session() -> None:
    """The SDK client keeps one aiohttp session per process; close it as the worker's exit would."""
    from azure.durable_functions.models.utils import http_utils

    if http_utils._client_session is not None and not http_utils._client_session.closed:
        await http_utils._client_session.close()


def _default_host_id(app_spec: str) -> str:
    return ("devstack-" + re.sub(r"[^a-z0-9-]", "-", app_spec.lower()))[:32].rstrip("-")
