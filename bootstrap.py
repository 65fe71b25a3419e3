"""The composition root: builds the real adapters from settings and hands them
to the use cases the triggers call. `build(settings, overrides=...)` returns
the `App`; only the entry layer (function_app.py, the CLI, the agent worker)
uses it, and the simulation builds its own with `Overrides`
(docs/adr/020a-entry-layer.md). Async SDK clients are bound to the event
loop that created them, so an App caches what it builds per running loop."""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp

from adapters import crashpoints, telemetry
from adapters.checkpoints import CosmosCheckpointStore
from adapters.clock import SYSTEM_CLOCK
from adapters.cosmos_client import (
    RequestCharges,
    build_client,
    ensure_orders_container,
    ensure_state_container,
)
from adapters.orders_db import CosmosOrdersRepository
from adapters.ports import DeadlineIndex, NoIndex
from adapters.recovery_index import (
    CosmosRecoveryIndex,
    ensure_index_container,
    ensure_shard_count,
)
from adapters.servicebus import (
    AGENT_RESPONSES_QUEUE,
    ServiceBusPublisher,
    servicebus_client,
)
from adapters.settings import Settings, SettingsError, azure_credential
from adapters.settings import settings as load_settings
from adapters.settlement import BackoffPolicy, MessageGate, RunSync
from adapters.state_store import CosmosStateStore
from agents.agent import Agent, Breakers
from agents.config import (
    AgentSettings,
    load_agent_settings,
    load_step_catalog,
    require_agent_keys,
    require_servicebus,
)
from agents.messaging import RequestProcessor, ServiceBusReplySender
from agents.remote_client import HttpRemoteService
from domain.steps import StepCatalog
from orchestrators.hooks import CrashPoint, no_crash_point
from orchestrators.policy import StarterPolicy
from orchestrators.reply_bridge import on_reply_message
from orchestrators.requests import AgentRequests
from orchestrators.starter import Starter, fast_start
from reporting import Alerts, StatusReporter
from submit.handler import SubmitHandler
from submit.policy import SubmitPolicy

if TYPE_CHECKING:
    from azure.core.credentials_async import AsyncTokenCredential
    from azure.cosmos.aio import ContainerProxy
    from azure.servicebus.aio import ServiceBusClient

    from activities.scheduler_activities import SchedulerActivities
    from adapters.settlement import Settle
    from console.views import Deps
    from supervisor.supervisor import Supervisor

log = logging.getLogger(__name__)

# Once per process, before any trigger runs (function_app imports this module).
telemetry.configure()


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Seams:
    """What the app takes from the machine: the message id of an alert that
    names none, how a synchronous settlement call runs off the loop, and the
    clock the agents' circuit breakers time their open state on."""

    new_id: Callable[[], uuid.UUID] = uuid.uuid4
    run_sync: RunSync = asyncio.to_thread
    breaker_now: Callable[[], datetime] = _utc_now


_P = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class Overrides:
    """What a test or the simulation hands `build` instead of what it would
    build from settings: the seams, and providers of the use cases."""

    seams: Seams = field(default_factory=Seams)
    submit_handler: _P | None = None
    starter: _P | None = None
    scheduler_activities: _P | None = None
    supervisor: _P | None = None
    message_gate: Callable[[str], Awaitable[MessageGate]] | None = None
    request_processor: _P | None = None
    crash_point: CrashPoint | None = None
    console_deps: Callable[..., Awaitable[Deps]] | None = None
    steps: StepCatalog | None = None  # the step catalog (else STEP_CATALOG_FILE's, or the shipped)


@dataclass
class Container:
    """Everything built once per process and loop; `close` releases it."""

    settings: Settings
    store: CosmosStateStore
    orders: CosmosOrdersRepository
    publisher: ServiceBusPublisher
    agent: Agent
    closers: list[Callable[[], Awaitable[Any]]]
    state_container: ContainerProxy
    index: DeadlineIndex
    index_container: ContainerProxy | None
    submit: SubmitHandler | None = None
    starter: Starter | None = None
    activities: SchedulerActivities | None = None
    peeker: Any = None  # the console's queue peeker


def _step_modes(cfg: Settings, steps: StepCatalog) -> dict[str, str]:
    """INLINE_STEPS: the steps run as in-app activities, not through agent-requests."""
    unknown = set(cfg.inline_steps) - set(steps.names)
    if unknown:
        raise SettingsError(f"INLINE_STEPS names unknown steps: {sorted(unknown)}")
    return {name: "inline" for name in cfg.inline_steps}


def _credential(cfg: Settings) -> AsyncTokenCredential | None:
    """One token credential per process for identity-based access; none when
    both Cosmos accounts have keys (the local stack)."""
    if cfg.state_account.key and cfg.orders_account.key:
        return None
    return azure_credential(cfg.managed_identity_client_id)


@functools.cache
def crash_point() -> CrashPoint:
    """The process's fault-injection hook (adapters.crashpoints), else the no-op."""
    return crashpoints.from_environment() or no_crash_point


_T = TypeVar("_T")


async def _once_per_loop(
    cache: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future],
    make: Callable[[], Awaitable[_T]],
) -> _T:
    """What `make` builds, once per running loop: concurrent first callers
    wait for the one build; a failed build is forgotten."""
    loop = asyncio.get_running_loop()
    future = cache.get(loop)
    if future is None:
        future = loop.create_future()
        cache[loop] = future
        try:
            future.set_result(await make())
        except BaseException as exc:
            cache.pop(loop, None)
            future.set_exception(exc)
            raise
    return await future


def build(settings: Settings | None = None, *, overrides: Overrides | None = None) -> App:
    """The app's root. `settings` None: read from the environment on first
    use (function_app builds its App at import, before any setting is needed)."""
    return App(settings, overrides or Overrides())


class App:
    """What the triggers need, built once per process and event loop."""

    def __init__(self, settings: Settings | None, overrides: Overrides) -> None:
        self._settings = settings
        self.overrides = overrides
        self.seams = overrides.seams
        self._containers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future] = (
            weakref.WeakKeyDictionary()
        )
        self._processors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future] = (
            weakref.WeakKeyDictionary()
        )
        self._alerts: weakref.WeakKeyDictionary[Any, Alerts] = weakref.WeakKeyDictionary()

    @property
    def settings(self) -> Settings:
        """The settings given, else the environment's."""
        return self._settings if self._settings is not None else load_settings()

    @functools.cached_property
    def steps(self) -> StepCatalog:
        """The step catalog this app runs, the agents' own (STEP_CATALOG_FILE,
        else the shipped domain/steps.json): the workflow sends each step the
        order fields its entry names."""
        o = self.overrides.steps
        return o if o is not None else load_step_catalog()

    def crash_point(self) -> CrashPoint:
        o = self.overrides.crash_point
        return o if o is not None else crash_point()

    def alerts_over(self, publisher: Any) -> Alerts:
        """The process's one Alerts over `publisher`, whose windows every use case shares."""
        alerts = self._alerts.get(publisher)
        if alerts is None:
            alerts = self._alerts[publisher] = Alerts(
                publisher,
                new_id=self.seams.new_id,
                window=self.settings.alert_window.total_seconds(),
            )
        return alerts

    # --- the per-loop container ------------------------------------------------

    async def container(self) -> Container:
        return await _once_per_loop(self._containers, self._build)

    async def close(self) -> None:
        """Close this loop's clients (tests; the host process just exits)."""
        loop = asyncio.get_running_loop()
        future = self._containers.pop(loop, None)
        if future is None or not future.done() or future.exception() is not None:
            return
        c = future.result()
        alerts = self._alerts.get(c.publisher)
        if alerts is not None:
            await alerts.close()  # the open windows' aggregates, before the sender closes
        await c.publisher.close()
        for closer in c.closers:
            await closer()

    async def _build(self) -> Container:
        cfg = self.settings
        charges = RequestCharges()
        credential = _credential(cfg)
        state_client = build_client(cfg.state_account, credential=credential)
        orders_client = (
            state_client
            if cfg.orders_account == cfg.state_account
            else build_client(cfg.orders_account, credential=credential)
        )
        state_db = state_client.get_database_client(cfg.state_database)
        if cfg.create_containers:
            # Local stack only; in Azure the Bicep templates create them.
            state = await ensure_state_container(
                state_client, cfg.state_database, cfg.state_container
            )
            orders = await ensure_orders_container(
                orders_client, cfg.orders_database, cfg.orders_container
            )
        else:
            state = state_db.get_container_client(cfg.state_container)
            orders = orders_client.get_database_client(cfg.orders_database).get_container_client(
                cfg.orders_container
            )
        clients = [state_client] if orders_client is state_client else [state_client, orders_client]
        # Closed in this order; the credential last, after the clients that use it.
        closers: list[Callable[[], Awaitable[Any]]] = [client.close for client in clients]
        if credential is not None:
            closers.append(credential.close)
        try:
            index_container, index = await self._recovery_index(state_client, charges)
        except BaseException:
            for closer in closers:
                await closer()
            raise
        session = aiohttp.ClientSession()
        closers.insert(0, session.close)
        # The in-app agent (INLINE_STEPS) reads the agents' own settings, as the others do.
        agent = build_agent(session, load_agent_settings(), self.seams)
        return Container(
            settings=cfg,
            store=CosmosStateStore(state, charges),
            orders=CosmosOrdersRepository(orders, charges),
            publisher=ServiceBusPublisher(servicebus_client(cfg.servicebus)),
            agent=agent,
            closers=closers,
            state_container=state,
            index=index,
            index_container=index_container,
        )

    async def _recovery_index(
        self, state_client: Any, charges: RequestCharges
    ) -> tuple[ContainerProxy | None, DeadlineIndex]:
        """The recovery index's container and adapter with SUPERVISOR_SCAN=index, else NoIndex."""
        cfg = self.settings
        if cfg.supervisor_scan != "index":
            return None, NoIndex()
        container = (
            await ensure_index_container(
                state_client, cfg.state_database, cfg.recovery_index_container
            )
            if cfg.create_containers
            else state_client.get_database_client(cfg.state_database).get_container_client(
                cfg.recovery_index_container
            )
        )
        await ensure_shard_count(container, cfg.recovery_index_shards)
        return container, CosmosRecoveryIndex(container, charges, shards=cfg.recovery_index_shards)

    # --- the use cases the triggers call ------------------------------------------

    async def submit_handler(self) -> SubmitHandler:
        """One per process and loop, as every use case here: its backlog reader
        caches the gauge between messages."""
        if self.overrides.submit_handler is not None:
            return await self.overrides.submit_handler()
        c = await self.container()
        if c.submit is None:
            c.submit = SubmitHandler(
                SubmitPolicy.from_settings(c.settings),
                c.store,
                c.orders,
                StatusReporter(c.publisher),
                self.alerts_over(c.publisher),
                list(c.agent.steps.names),
                fast_start=fast_start(self.starter),
            )
        return c.submit

    async def scheduler_activities(self) -> SchedulerActivities:
        """One per process and loop: what the host runs is what the simulation
        and the benches measure."""
        if self.overrides.scheduler_activities is not None:
            return await self.overrides.scheduler_activities()
        from activities.policy import ActivityPolicy
        from activities.scheduler_activities import SchedulerActivities

        c = await self.container()
        if c.activities is not None:
            return c.activities
        c.activities = SchedulerActivities(
            ActivityPolicy.from_settings(c.settings),
            c.store,
            c.orders,
            c.publisher,
            c.agent.steps.names,
            c.agent,
            _step_modes(c.settings, c.agent.steps),
            c.index,
            crash_point=self.crash_point(),
            alerts=self.alerts_over(c.publisher),
            steps=c.agent.steps,
        )
        return c.activities

    async def starter(self) -> Starter:
        if self.overrides.starter is not None:
            return await self.overrides.starter()
        c = await self.container()
        # The fast path uses what the last timer run measured.
        if c.starter is None:
            c.starter = Starter(
                StarterPolicy.from_settings(
                    c.settings, c.agent.steps.names, _step_modes(c.settings, c.agent.steps)
                ),
                c.store,
                c.index,
                publisher=c.publisher,
                crash_point=self.crash_point(),
                alerts=self.alerts_over(c.publisher),
                count_interval=c.settings.starter_count_interval or None,
                orders=c.orders,
                requests=AgentRequests(
                    c.settings.scheduler_keys, c.publisher, c.orders, c.agent.steps
                ),
            )
        return c.starter

    async def message_gate(self, queue: str) -> MessageGate:
        """The gate a queue trigger runs its handler through (adapters.settlement)."""
        if self.overrides.message_gate is not None:
            return await self.overrides.message_gate(queue)
        c = await self.container()
        return MessageGate(
            queue,
            self.alerts_over(c.publisher),
            c.publisher,
            BackoffPolicy.from_env(),
            run_sync=self.seams.run_sync,
        )

    async def on_reply(self, message: Any, actions: Any, client: Any) -> Settle:
        """The reply bridge's trigger body with its gate, keys (SettingsError
        naming a missing one) and fault-injection hook."""
        gate = await self.message_gate(AGENT_RESPONSES_QUEUE)
        return await on_reply_message(
            message,
            actions,
            client,
            gate=gate,
            keys=self.settings.scheduler_keys(),
            crash_point=self.crash_point(),
        )

    async def supervisor(self) -> Supervisor:
        if self.overrides.supervisor is not None:
            return await self.overrides.supervisor()
        from supervisor.sources import IndexSource, QuerySource, checkpoint_name
        from supervisor.supervisor import Supervisor

        c = await self.container()
        # Adapters of its own, sharing the clients, so each run's request charge is its own.
        charges = RequestCharges()
        store = CosmosStateStore(c.state_container, charges)
        source = (
            IndexSource(
                CosmosRecoveryIndex(
                    c.index_container, charges, shards=c.settings.recovery_index_shards
                ),
                store,
            )
            if c.index_container is not None
            else QuerySource(store)
        )
        return Supervisor(
            store,
            source,
            CosmosCheckpointStore(
                c.state_container, charges, checkpoint_name(c.settings.supervisor_scan)
            ),
            StatusReporter(c.publisher),
            self.alerts_over(c.publisher),
            c.settings.retry,
            c.settings.supervisor_page_size,
            charges=charges,
            max_pages=c.settings.supervisor_max_pages,
            budget=c.settings.supervisor_run_budget,
        )

    async def agent_processor(self) -> RequestProcessor:
        """The queue-triggered agent's RequestProcessor, with its own clients
        from the agents' settings, made once per loop."""
        if self.overrides.request_processor is not None:
            return await self.overrides.request_processor()

        async def build() -> RequestProcessor:
            agent_cfg = load_agent_settings()
            client = servicebus_client(require_servicebus(agent_cfg))
            processor, _replies = request_processor(
                client, aiohttp.ClientSession(), agent_cfg, self.seams
            )
            return processor

        return await _once_per_loop(self._processors, build)

    async def console_deps(self, durable: Any | None = None) -> Deps:
        """What a console page reads from and acts on: adapters of its own per
        request (the page shows what it cost), over the app's clients."""
        if self.overrides.console_deps is not None:
            return await self.overrides.console_deps(durable=durable)
        from adapters.console_reads import ConsoleReads
        from console.peek import QueuePeeker
        from console.views import Deps

        c = await self.container()
        charges = RequestCharges()
        if c.peeker is None:
            c.peeker = QueuePeeker(servicebus_client(c.settings.servicebus))
        return Deps(
            settings=c.settings,
            store=CosmosStateStore(c.state_container, charges),
            reads=ConsoleReads(c.state_container, charges),
            orders=c.orders,
            servicebus=c.peeker,
            durable=durable,
            publisher=c.publisher,
        )


# --- tools: the operator CLI -------------------------------------------------------


@asynccontextmanager
async def state_store(cfg: Settings) -> AsyncIterator[CosmosStateStore]:
    """The state store alone, closed on exit (the CLI opens one per command)."""
    credential = _credential(cfg)
    client = build_client(cfg.state_account, credential=credential)
    try:
        database = client.get_database_client(cfg.state_database)
        yield CosmosStateStore(database.get_container_client(cfg.state_container))
    finally:
        await client.close()
        if credential is not None:
            await credential.close()


# --- the Agents: in the app (queue-triggered or inline) and the standalone worker ---


def build_agent(
    session: aiohttp.ClientSession, cfg: AgentSettings, seams: Seams | None = None
) -> Agent:
    """The Agent with the agents' own settings."""
    seams = seams or Seams()
    return Agent(
        HttpRemoteService(session, cfg.remote_service_url, cfg.service_urls),
        SYSTEM_CLOCK,
        cfg.policy,
        breakers=Breakers(
            cfg.policy.breaker_fail_max, cfg.policy.breaker_reset_timeout, now=seams.breaker_now
        ),
        steps=cfg.steps,
    )


def request_processor(
    client: ServiceBusClient,
    session: aiohttp.ClientSession,
    cfg: AgentSettings,
    seams: Seams | None = None,
) -> tuple[RequestProcessor, ServiceBusReplySender]:
    """What handles one agent request, for the queue-triggered agent and the
    worker alike; the caller owns `client` and `session`, and closes the
    returned reply sender before them."""
    keys = require_agent_keys(cfg)  # before anything is opened: no keys, no agent
    replies = ServiceBusReplySender(client, AGENT_RESPONSES_QUEUE)
    seams = seams or Seams()
    publisher = ServiceBusPublisher(client)
    alerts = Alerts(publisher, new_id=seams.new_id, window=cfg.alert_window)
    processor = RequestProcessor(
        build_agent(session, cfg, seams),
        replies,
        alerts,
        BackoffPolicy.from_env(),  # the gate's schedule and MAX_DELIVERY_COUNT
        keys=keys,
        scheduler=publisher,
    )
    return processor, replies
