"""The composition root: builds the real adapters from settings, once per
process and event loop, and hands them to the use cases the triggers call.
Every entry point builds through it: the Functions app's triggers, the
queue-triggered agent and the standalone agent worker (`request_processor`),
and the operator CLI (`state_store`).

Async SDK clients are bound to the event loop that created them, so the
container is cached per running loop (the Functions worker has one; tests
have one per test)."""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from adapters.servicebus import ServiceBusPublisher, servicebus_client
from adapters.settings import Settings, SettingsError, azure_credential, settings
from adapters.state_store import CosmosStateStore
from agents.agent import Agent
from agents.config import AgentSettings, load_agent_settings, require_agent_keys
from agents.messaging import RequestProcessor, ServiceBusReplySender
from agents.remote_client import HttpRemoteService
from domain.steps import StepCatalog
from orchestrators.hooks import CrashPoint, no_crash_point
from reporting import Alerts, StatusReporter

if TYPE_CHECKING:
    from azure.core.credentials_async import AsyncTokenCredential
    from azure.cosmos.aio import ContainerProxy
    from azure.servicebus.aio import ServiceBusClient

    from orchestrators.starter import Starter
    from submit.handler import SubmitHandler

log = logging.getLogger(__name__)

# Once per process, before any trigger runs (every trigger module imports this one).
telemetry.configure()


@dataclass
class Container:
    """Everything built once per process and loop; `close` releases it."""

    settings: Settings
    store: CosmosStateStore
    orders: CosmosOrdersRepository
    publisher: ServiceBusPublisher
    agent: Agent
    closers: list[Callable[[], Awaitable[Any]]]
    charges: RequestCharges
    state_container: ContainerProxy
    index: DeadlineIndex
    index_container: ContainerProxy | None
    submit: SubmitHandler | None = None
    starter: Starter | None = None


_containers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future] = (
    weakref.WeakKeyDictionary()
)


def _step_modes(cfg: Settings, steps: StepCatalog) -> dict[str, str]:
    """INLINE_STEPS names the steps run as in-app activities instead of
    through the agent-requests queue (both agent paths exist; the article
    allows either)."""
    unknown = set(cfg.inline_steps) - set(steps.names)
    if unknown:
        raise SettingsError(f"INLINE_STEPS names unknown steps: {sorted(unknown)}")
    return {name: "inline" for name in cfg.inline_steps}


async def _build() -> Container:
    cfg = settings()
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
        state = await ensure_state_container(state_client, cfg.state_database, cfg.state_container)
        orders = await ensure_orders_container(
            orders_client, cfg.orders_database, cfg.orders_container
        )
    else:
        state = state_db.get_container_client(cfg.state_container)
        orders = orders_client.get_database_client(cfg.orders_database).get_container_client(
            cfg.orders_container
        )
    index: DeadlineIndex = NoIndex()
    index_container = None
    if cfg.supervisor_scan == "index":
        index_container = (
            await ensure_index_container(
                state_client, cfg.state_database, cfg.recovery_index_container
            )
            if cfg.create_containers
            else state_db.get_container_client(cfg.recovery_index_container)
        )
        # Refused here, before any entry is written or read, when the container
        # was set up with another shard count (ADR 019b).
        try:
            await ensure_shard_count(index_container, cfg.recovery_index_shards)
        except BaseException:
            await state_client.close()
            if orders_client is not state_client:
                await orders_client.close()
            if credential is not None:
                await credential.close()
            raise
        index = CosmosRecoveryIndex(index_container, charges, shards=cfg.recovery_index_shards)
    session = aiohttp.ClientSession()
    # The in-app agent (INLINE_STEPS) keeps the agents' own settings (AGENT_*,
    # REMOTE_SERVICE_URL[__<SERVICE>], STEP_CATALOG_FILE), as the
    # queue-triggered agent and the worker do; its step catalog is the app's.
    agent = build_agent(session, load_agent_settings())
    # Closed in this order; the credential last, after the clients that use it.
    closers: list[Callable[[], Awaitable[Any]]] = [session.close, state_client.close]
    if orders_client is not state_client:
        closers.append(orders_client.close)
    if credential is not None:
        closers.append(credential.close)
    return Container(
        settings=cfg,
        store=CosmosStateStore(state, charges),
        orders=CosmosOrdersRepository(orders, charges),
        publisher=ServiceBusPublisher(servicebus_client(cfg.servicebus)),
        agent=agent,
        closers=closers,
        charges=charges,
        state_container=state,
        index=index,
        index_container=index_container,
    )


def _credential(cfg: Settings) -> AsyncTokenCredential | None:
    """One token credential per process for identity-based access in Azure: the
    app's user-assigned identity (adapters.settings.azure_credential); none when
    both Cosmos accounts have keys (the local stack)."""
    if cfg.state_account.key and cfg.orders_account.key:
        return None
    return azure_credential(cfg.managed_identity_client_id)


@functools.cache
def crash_point() -> CrashPoint:
    """The fault-injection hook of this process: the one fault tests ask for
    through the environment (adapters.crashpoints), else the no-op."""
    return crashpoints.from_environment() or no_crash_point


async def container() -> Container:
    loop = asyncio.get_running_loop()
    future = _containers.get(loop)
    if future is None:
        future = loop.create_future()
        _containers[loop] = future
        try:
            future.set_result(await _build())
        except BaseException as exc:
            _containers.pop(loop, None)
            future.set_exception(exc)
            raise
    return await future


async def close() -> None:
    """Close this loop's clients (tests; the host process just exits)."""
    loop = asyncio.get_running_loop()
    future = _containers.pop(loop, None)
    if future is None or not future.done() or future.exception() is not None:
        return
    c = future.result()
    await c.publisher.close()
    for closer in c.closers:
        await closer()


async def submit_handler():
    """One handler per process and loop: its backlog reader caches the gauge
    between messages (a handler per message would read it for every order)."""
    from submit.handler import SubmitHandler

    c = await container()
    if c.submit is None:
        c.submit = SubmitHandler(
            c.settings,
            c.store,
            c.orders,
            StatusReporter(c.publisher),
            Alerts(c.publisher),
            list(c.agent.steps.names),
        )
    return c.submit


async def scheduler_activities():
    from activities.scheduler_activities import SchedulerActivities

    c = await container()
    return SchedulerActivities(
        c.settings,
        c.store,
        c.orders,
        c.publisher,
        c.agent.steps.names,
        c.agent,
        _step_modes(c.settings, c.agent.steps),
        c.index,
        crash_point=crash_point(),
    )


async def starter():
    from orchestrators.starter import Starter

    c = await container()
    # One per process and loop: the fast path uses what the last timer run
    # measured (the Processing count) instead of counting per order.
    if c.starter is None:
        c.starter = Starter(
            c.settings, c.store, c.index, publisher=c.publisher, crash_point=crash_point()
        )
    return c.starter


async def alerts() -> Alerts:
    return Alerts((await container()).publisher)


def reply_keys():
    """The keys the reply bridge checks a reply with (domain.signing.SchedulerKeys);
    SettingsError naming the missing setting (ADR 017e)."""
    return settings().scheduler_keys()


async def message_gate(queue: str):
    """The gate a queue trigger runs its handler through: reads any body kind,
    turns transient failures into delayed retries on the same queue, dead-letters
    the rest with a reason and one alert (adapters.settlement.MessageGate)."""
    from adapters.settlement import BackoffPolicy, MessageGate

    c = await container()
    return MessageGate(queue, Alerts(c.publisher), c.publisher, BackoffPolicy.from_env())


async def supervisor():
    from supervisor.sources import IndexSource, QuerySource, checkpoint_name
    from supervisor.supervisor import Supervisor

    c = await container()
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
        Alerts(c.publisher),
        c.settings.retry,
        c.settings.supervisor_page_size,
        charges=charges,
        max_pages=c.settings.supervisor_max_pages,
        budget=c.settings.supervisor_run_budget,
    )


# --- tools: the operator CLI -------------------------------------------------------


@asynccontextmanager
async def state_store(cfg: Settings) -> AsyncIterator[CosmosStateStore]:
    """The state store alone, with the app's client and credential rules, closed
    on exit (the CLI opens one per command)."""
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


def build_agent(session: aiohttp.ClientSession, cfg: AgentSettings) -> Agent:
    """The Agent with the agents' own settings (AGENT_*, REMOTE_SERVICE_URL[__<SERVICE>],
    STEP_CATALOG_FILE)."""
    return Agent(
        HttpRemoteService(session, cfg.remote_service_url, cfg.service_urls),
        SYSTEM_CLOCK,
        cfg.policy,
        steps=cfg.steps,
    )


def request_processor(
    client: ServiceBusClient, session: aiohttp.ClientSession, cfg: AgentSettings
) -> tuple[RequestProcessor, ServiceBusReplySender]:
    """What handles one agent request, for the queue-triggered agent and the
    worker alike; the caller owns `client` and `session`, and closes the reply
    sender (returned with it) before them."""
    keys = require_agent_keys(cfg)  # before anything is opened: no keys, no agent
    replies = ServiceBusReplySender(client, cfg.responses_queue)
    publisher = ServiceBusPublisher(client)
    alerts = Alerts(publisher)
    from adapters.settlement import BackoffPolicy

    processor = RequestProcessor(
        build_agent(session, cfg),
        replies,
        alerts,
        BackoffPolicy.from_env(),  # the gate's schedule and MAX_DELIVERY_COUNT
        keys=keys,
        scheduler=publisher,
    )
    return processor, replies
