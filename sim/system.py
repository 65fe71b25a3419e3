"""One schedule: the product's own code wired to the simulated worlds, run from
a seed, then checked.

The product is driven through its registered functions (function_app's
Submit trigger, the orchestrator and activities through the Durable SDK's
replay, the Supervisor's timer) and, where a function takes a durable client
binding the simulator cannot hand in, through what that function calls
(`Starter.run`, the root's `App.on_reply`) and the agents' `RequestProcessor`.
The app is built as production builds it (`bootstrap.build`, then
function_app's `create_app` over it), with `Overrides`: the simulation's own
use cases over the simulated adapters, with the simulation's clocks, and its
seams (seeded alert ids, inline settlement, the breakers on the virtual
clock); nothing in the product is patched (docs/adr/020a-entry-layer.md)."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import logging
import random
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from adapters.checkpoints import CosmosCheckpointStore
from adapters.cosmos_client import RequestCharges
from adapters.durable_client import GONE_MARKERS
from adapters.orders_db import CosmosOrdersRepository
from adapters.ports import ANY_OWNER, NoIndex, bucket_of
from adapters.recovery_index import MAX_BUCKETS_PER_PAGE, CosmosRecoveryIndex, entry_id
from adapters.servicebus import AGENT_REQUESTS_QUEUE, AGENT_RESPONSES_QUEUE, ALERTS_QUEUE
from adapters.settings import CosmosAccount, ServiceBusAccess, Settings, ingress_queues
from adapters.settlement import ORIGINAL_ID_PROPERTY, BackoffPolicy, MessageGate
from adapters.state_store import CosmosStateStore
from agents.agent import Agent, AgentPolicy, Breakers
from agents.messaging import RequestProcessor
from agents.ports import RemoteCall
from agents.remote_client import _interpret
from bootstrap import App, Overrides, Seams, build
from devstack.host.app import SERVICE_BUS_TRIGGER, index_app
from devstack.host.durable import (
    EVENT_RAISED,
    ORCHESTRATOR_STARTED,
    TASK_COMPLETED,
    TASK_FAILED,
    TASK_SCHEDULED,
    TIMER_FIRED,
)
from devstack.host.invoke import call_function
from devstack.remote_service.ledger import Ledger
from domain import state_machine as sm
from domain.errors import DomainError, TransientError
from domain.ids import order_key, reply_event_name
from domain.signing import KeyRing
from domain.state_machine import MAX_COMPENSATION_RESTARTS
from domain.steps import DEFAULT_CATALOG, StepCatalog
from orchestrators.policy import StarterPolicy
from orchestrators.starter import Starter, fast_start
from reporting import Alerts, StatusReporter
from submit.policy import SubmitPolicy

from .bus import (
    HANDLING,
    Bus,
    Delivery,
    Msg,
    SimActions,
    SimReceiver,
    SimServiceBusClient,
    later_copy,
    publisher,
    reply_sender,
    rules_for,
)
from .cosmos import SimContainer, SimCosmosClient
from .durable import SimDurable, default_version
from .hostile import ALERT_KINDS as FORGERY_ALERTS
from .hostile import PREFIX as FORGED
from .hostile import Hostile
from .partitions import PartitionWrites
from .remote import http_remote
from .worker import WorkerHost, WorkerRun, draw_workers
from .world import START, Crash, FaultConfig, Outages, World

# The client applications, as the registry the app reads names them
# (REPLY_QUEUE_REGISTRY; each ingress queue is the one adapters.settings
# derives from it). Two, sending colliding OrderIDs: an OrderID is unique per
# application only (docs/adr/017f-order-keys.md).
REGISTRY = {"webshop": "replies-webshop", "partner-portal": "replies-partner-portal"}
INGRESS_OF = ingress_queues({"REPLY_QUEUE_REGISTRY": json.dumps(REGISTRY)})
APP_OF_INGRESS = {queue: app for app, queue in INGRESS_OF.items()}
APPS = tuple(sorted(REGISTRY))
IMPERSONATION = "impersonation"  # the message id of a client's order in another's name
ALERT_REPEAT = timedelta(hours=12)  # the least time between two pages for one incident
STARTER_PERIOD = 10.0
SUPERVISOR_PERIOD = 10.0
SLACK = timedelta(seconds=5)
STATUS_GRACE = timedelta(
    seconds=30
)  # the Starter's default: outbox entries older than this are its to send
HOST_OUTAGE = timedelta(days=8)
# A client's changed resend of a Rejected order (the customer edited the
# cart): a total neither the order (20.00) nor its conflicting copy (40.00) has.
CHANGED_TOTAL = "60.00"

TERMINAL_STATUS = {
    "Processed": "Processed",
    "Error": "Failed",
    "Compensated": "Compensated",
    "CompensationFailed": "CompensationFailed",
    "Rejected": "Rejected",
}

ROWS = [
    ("1", "(none) -> Pending", "submit"),
    ("2", "Pending -> Processing", "starter"),
    ("3", "Processing -> Processing (CompleteBy, Steps)", "orchestration"),
    ("4", "Processing -> Processed", "orchestration"),
    ("5", "Processing -> Error", "orchestration"),
    ("6", "Processing -> Pending (FailureCount+1)", "supervisor"),
    ("7", "Processing -> Error or long-retry wait", "supervisor"),
    ("8a", "Processing/Error -> Compensating", "orchestration"),
    ("8b", "Compensating -> Compensated", "orchestration"),
    ("8c", "Compensating -> CompensationFailed", "orchestration"),
    ("8d", "Compensating -> long retry (unconfirmed undo)", "orchestration"),
    ("9", "Error -> Pending (resubmit)", "operator"),
]


def catalog(root: App):
    """The functions of the Functions app over `root`, as the host indexes them."""
    import function_app

    return index_app(function_app.create_app(root))


@dataclass
class Options:
    orders: int = 3
    scan: str = "query"  # or "index"
    page_size: int = 100
    backlog_limit: int = 5000
    retry: sm.RetryPolicy = field(
        default_factory=lambda: sm.RetryPolicy(
            threshold=3,
            long_retries=1,
            long_delay=timedelta(seconds=120),
            claim_timeout=timedelta(seconds=30),
            # An unconfirmed undo's long retries (2.2) outlast any outage here.
            undo_long_retries=5,
        )
    )
    step_timeout: timedelta = timedelta(seconds=20)
    faults: FaultConfig = field(default_factory=FaultConfig)
    fault_window: float = 240.0
    # The workflow version new instances run: host.json's defaultVersion
    # (None) or one named (e.g. "1.1", still registered for attempts in flight).
    version: str | None = None
    # Client applications sending orders: 2 (colliding OrderIDs), or 1, the
    # world regression seeds recorded before there were two replay in.
    apps: int = 2
    # The recovery index's shard count (ADR 019b); None: drawn from the seed.
    index_shards: int | None = None
    # Host processes of the Functions app, each with its own in-memory state
    # (Submit's backlog cache, the Starter's Processing figure and fast-path
    # window, the agent's circuit breakers): 1 is the world regression seeds
    # recorded before there were several replay in.
    hosts: int = 1
    # A client sends, on its own ingress queue, an order whose body names the
    # other application (and its own reply queue): it must be dead-lettered
    # and create nothing under the other application's keys.
    impersonation: bool = False
    # A declined "do" was applied before the provider refused it (an
    # authorisation held, then the capture declined): its undo is owed.
    applied_declines: bool = False
    # Compensation instances that die (issue 21, the restart budget on the
    # path): the first N executions of each order's compensation end Failed
    # at an episode while faults last, as an instance whose activities'
    # retries were spent on a store that could not answer does.
    # N past MAX_COMPENSATION_RESTARTS spends the restarts: a long retry.
    compensation_deaths: int = 0
    # A Supervisor on a lagging replica (issue 21, the paths a lagging read
    # opens: a candidate whose record moved on, an entry whose record shows
    # the attempt before): this share of its reads and queries, while faults
    # last, see every document written since in its previous version.
    lagging_supervisor: float = 0.0
    # Applications that opted in to progress statuses (REPLY_QUEUE_REGISTRY's
    # `"progress": true`): their attempts are claimed without marks and run
    # as 2.3's do inside the live workflow (begin, one write per step, an
    # index entry per step's deadline, compensation from the attempt's own
    # list), the path an older claimer, a restart by hand or a compensation's
    # restart also takes (issue 21: the mutation run showed that path unrun).
    progress_apps: frozenset[str] = frozenset()
    # Times the singleton lock's lease is lost while faults last (the host
    # holding it stalls past its renewal): for 15-45 s no host holds it, no
    # Starter or Supervisor run, and the runs after it meet due attempts in
    # older index buckets, where a lagging read's skipped candidate or held
    # entry must keep the cursor (issue 21, mutants `sup-no-rewind`,
    # `idx-resume-last-not-due`).
    lease_pauses: int = 0
    # The workflow's steps (domain/steps.json unless a test adds one).
    steps: StepCatalog = DEFAULT_CATALOG
    # Runs of the standalone agent worker (agents/worker's own loop, beside
    # the queue-triggered agent; sim/worker.py), from a stream of their own.
    workers: tuple[WorkerRun, ...] = ()


def options_for(
    seed: int,
    orders: int,
    version: str | None = None,
    hostile: int | None = None,
    apps: int = 2,
    wider: bool = True,
    hosts: int | None = None,
    fallible: bool = True,
    mutation_world: bool = True,
    bus_outages: bool = True,
    link_drops: bool = True,
    entity_full: bool = True,
) -> Options:
    """Everything about a schedule, drawn from its seed; `hostile` fixes the
    number of forgeries (sim.hostile) instead (0 replays a schedule found
    before the hostile sender existed); `apps`: 1 for the one-application
    world of older regression seeds; `wider` False leaves out the Durable
    client's faults, odd provider answers and foreign documents (seeds found
    before they existed); `hosts`: None draws the number of host processes
    and their restarts from the seed, N fixes the number (restarts still
    drawn), 0 is the one-host world of the seeds recorded before there were
    several (no restarts); `fallible` False leaves out the fallible world's
    faults (`_fallible`; seeds found before it); `mutation_world` False
    leaves out what the 2.4 mutation run added (an application with
    progress statuses, lost leases, the lagging Supervisor in one schedule
    in two rather than four), for regression seeds recorded before it;
    `bus_outages` False leaves out the Service Bus outages (seeds recorded
    before them); `link_drops` False the dropped links after a lost send
    answer (FaultConfig.link_drops; seeds recorded before them); `entity_full`
    False the full queues (FaultConfig.entity_full; seeds recorded before them)."""
    rng = random.Random(f"options/{seed}")
    newer = wider and hosts != 0 and fallible and mutation_world
    quiet = rng.random() < 0.15
    f = FaultConfig()
    if not quiet:
        f = FaultConfig(
            crash=rng.choice((0.0, 0.01, 0.03)),
            duplicate=rng.choice((0.0, 0.05, 0.2)),
            delay=rng.choice((0.0, 0.05, 0.2)),
            lock_expiry=rng.choice((0.0, 0.05, 0.2)),
            throttle_storm=rng.random() < 0.2,
            throttle_bursts=rng.choice((0, 0, 3, 8)),
            host_outage=rng.random() < 0.02,
            send_fail=rng.choice((0.0, 0.05, 0.3)),
            decline=rng.choice((0.0, 0.2, 0.5)),
            outage=rng.random() < 0.15,
            lag=rng.choice((0.0, 0.05)),
            duplicate_activity=rng.choice((0.0, 0.05)),
            two_supervisors=rng.random() < 0.3,
            operator=rng.choice((0.0, 0.3, 0.7)),
            skew=rng.choice((0.0, 1.0, 2.0)),
            minute_edges=rng.random() < 0.3,
            burst=rng.random() < 0.3,
            bad_messages=rng.choice((0.0, 0.0, 0.2)),
        )
    # Forgeries on the internal queues, from a stream of their own so that
    # every other option of the seed stays what it was.
    if hostile is None:
        hostile = random.Random(f"hostile/{seed}").choice((0, 0, 3, 8, 20))
    f = replace(f, hostile=hostile)
    # Host processes, from a stream of their own too.
    host_rng = random.Random(f"hosts/{seed}")
    n_hosts, restarts = host_rng.choice((1, 2, 2, 3)), host_rng.choice((0, 0, 1, 2))
    if not wider or hosts == 0:
        n_hosts, restarts = 1, 0
    elif hosts is not None:
        n_hosts = hosts
    f = replace(f, host_restarts=0 if quiet else restarts)
    scan = rng.choice(("query", "index"))
    options = Options(
        # An outage must outlast the whole retry budget: the faults run long enough for that.
        fault_window=450.0 if f.outage else 240.0,
        orders=orders,
        scan=scan,
        page_size=rng.choice((1, 2, 3, 100)),
        backlog_limit=rng.choice((5000, 5000, 5000, 0)),
        faults=f,
        version=version,
        apps=apps,
        hosts=n_hosts,
        # From a stream of its own; not in the worlds older regression seeds replay.
        impersonation=wider
        and hosts != 0
        and apps > 1
        and random.Random(f"impersonate/{seed}").random() < 0.3,
        applied_declines=wider and hosts != 0 and random.Random(f"applied/{seed}").random() < 0.5,
        # From a stream of its own, in the fallible world only (regression
        # seeds recorded before it replay without it).
        compensation_deaths=(
            _compensation_deaths(seed) if wider and hosts != 0 and fallible and not quiet else 0
        ),
        lagging_supervisor=(
            0.3
            if wider
            and hosts != 0
            and fallible
            and not quiet
            # One schedule in two (one in four before issue 21's mutation
            # run showed the lagged paths too rarely met in 60 seeds).
            and random.Random(f"lagging/{seed}").random() < (0.5 if mutation_world else 0.25)
            else 0.0
        ),
        progress_apps=_progress_apps(seed, apps) if newer else frozenset(),
        lease_pauses=(
            random.Random(f"lease/{seed}").choice((0, 0, 1, 2)) if newer and not quiet else 0
        ),
    )
    if not quiet and wider:
        # Drawn last, so every earlier choice of a seed stays what it was.
        f.durable_fail = rng.choice((0.0, 0.02, 0.1, 0.3))
        f.odd_answers = rng.choice((0.0, 0.0, 0.3))
        f.foreign_docs = rng.random() < 0.3
        f.resend = rng.choice((0.0, 0.0, 0.3, 0.8))
        f.undo_blackout = _draws_undo_blackout(seed)
        if fallible:
            _fallible(rng, f)
            f.bus_blips = _bus_blips(seed) if bus_outages else 0
            f.link_drops = _link_drops(seed) if link_drops else 0
            f.entity_full = _entity_full(seed) if entity_full else 0
    if wider and hosts != 0 and fallible and not quiet:
        options.workers, f.receive_fail = draw_workers(seed, options.fault_window)
    return options


def _progress_apps(seed: int, apps: int) -> frozenset[str]:
    """In one schedule in two, from a stream of its own, one application
    gets progress statuses (the partner's when there are two)."""
    rng = random.Random(f"progress/{seed}")
    if rng.random() >= 1 / 2:
        return frozenset()
    return frozenset({"webshop" if apps == 1 else "partner-portal"})


def _compensation_deaths(seed: int) -> int:
    """How many executions of each order's compensation die, in one
    schedule in four: up to two more than the restarts the Starter has
    before a long retry."""
    rng = random.Random(f"dies/{seed}")
    if rng.random() >= 0.25:
        return 0
    return rng.choice((2, 3, 4, 5))


def _fallible(rng: random.Random, f: FaultConfig) -> None:
    """The fallible world (issue 21: every external call can fail), drawn
    after every other option so that those stay what they were."""
    f.cosmos_fail = rng.choice((0.0, 0.01, 0.03, 0.1, 0.3))
    f.cosmos_lost = rng.choice((0.0, 0.01, 0.03, 0.1, 0.3))
    f.cosmos_outage = rng.random() < 0.3
    f.cosmos_blips = rng.choice((0, 0, 4, 12))
    f.query_lag = rng.choice((0.0, 0.05, 0.3))
    f.settle_fail = rng.choice((0.0, 0.05, 0.2, 0.5))
    f.send_lost = rng.choice((0.0, 0.02, 0.1))
    f.slow_answers = rng.choice((0.0, 0.05, 0.2))
    f.host_start = True


def _bus_blips(seed: int) -> int:
    """Service Bus outages in the fallible world, in one schedule in three,
    from a stream of their own so that no other draw of the seed moves."""
    rng = random.Random(f"bus-outage/{seed}")
    return rng.choice((1, 3, 8)) if rng.random() < 1 / 3 else 0


def _link_drops(seed: int) -> int:
    """How many lost send answers drop the link (FaultConfig.link_drops), in
    one schedule in two, from a stream of its own so no other draw moves."""
    rng = random.Random(f"link-drop/{seed}")
    return rng.choice((1, 2, 4)) if rng.random() < 0.5 else 0


def _entity_full(seed: int) -> int:
    """How many full-queue windows (FaultConfig.entity_full), in one schedule
    in three, from a stream of its own so no other draw moves."""
    rng = random.Random(f"entity-full/{seed}")
    return rng.choice((1, 1, 2)) if rng.random() < 1 / 3 else 0


def _draws_undo_blackout(seed: int) -> bool:
    """One wide schedule in ten has an undo blackout (FaultConfig.undo_blackout),
    from a stream of its own, so no other draw of the seed moves."""
    return random.Random(f"undo-blackout/{seed}").random() < 0.1


def undo_budget(o: Options) -> float:
    """Seconds one undo may take in one compensation: UndoTries x step timeout."""
    return 3 * o.step_timeout.total_seconds()


def liveness_bound(o: Options) -> timedelta:
    """Once faults stop, every order is terminal within this (from the
    settings): each of the max_failures + 1 attempts waits for the starter,
    runs every step to its deadline and is found by the supervisor past its
    slack; then the long-retry delays; then a compensation that lets every
    undo try run to its deadline."""
    steps = len(o.steps.steps)
    attempt = (
        STARTER_PERIOD
        + o.retry.claim_timeout.total_seconds()
        + steps * o.step_timeout.total_seconds()
        + 2 * SUPERVISOR_PERIOD
        + SLACK.total_seconds()
    )
    compensation = STARTER_PERIOD + steps * 3 * o.step_timeout.total_seconds()
    return timedelta(
        seconds=(o.retry.max_failures + 1) * attempt
        + o.retry.long_retries * o.retry.long_delay.total_seconds()
        + compensation
        + _undo_long_retry_bound(o)
        + 60
    )


def refusals(steps: StepCatalog) -> tuple[tuple[str, ...], ...]:
    """The operations a declined order's provider refuses (one is drawn per
    declined order), from the catalog: mostly a step whose provider refuses
    orders (its entry has a `refusal`; twice as often), sometimes another
    step, sometimes the last step and then the undo of the first refusing
    step (CompensationFailed). For domain/steps.json: the charge twice, the
    reservation, the shipment, and the shipment with the refund."""
    refusing = steps.refused
    table = [(f"{s.service}/{s.do_operation}",) for s in refusing for _ in range(2)]
    table += [(f"{s.service}/{s.do_operation}",) for s in steps.steps if s.refusal is None]
    if refusing:
        last = steps.steps[-1]
        first = refusing[0]
        table.append(
            (f"{last.service}/{last.do_operation}", f"{first.service}/{first.undo_operation}")
        )
    return tuple(table)


def _undo_long_retry_bound(o: Options) -> float:
    """What an unconfirmed undo adds (workflow 2.2, ADR 019a): a compensation
    deferred just before faults stop waits one long retry, and the restarted
    attempt runs; an undo blackout may outlast the faults by its length."""
    extra = (
        STARTER_PERIOD + o.retry.long_delay.total_seconds() + undo_budget(o) * len(o.steps.names)
    )
    if o.faults.undo_blackout:
        extra += BLACKOUT_UNDO_BUDGETS[1] * undo_budget(o)
    return extra


# An undo blackout lasts this many whole undo budgets (drawn between the two).
BLACKOUT_UNDO_BUDGETS = (1.5, 4.0)


def status_ok(status: int) -> bool:
    return 200 <= status < 300


# What providers really send back as a reference now and then.
ODD_REFERENCES: tuple[Any, ...] = (
    "R" * 5000,
    "",
    "   ",
    "réf-ünïcødé-参照-🧾" * 20,
    "line\nbreak\x00nul\u202etrl",
    "4111 1111 1111 1111",
    12345678901234567890,
    {"nested": {"Reference": ["a", 1, None]}},
    None,
)


class SimRemote:
    """The remote services (the RemoteService port): the devstack ledger's
    idempotency and fencing, answers interpreted by the product's own HTTP
    client rules, and the seed's faults (outage, permanent decline)."""

    def __init__(
        self,
        world: World,
        declines: dict[str, tuple[tuple[str, ...], str]],
        steps: StepCatalog = DEFAULT_CATALOG,
    ) -> None:
        self.world = world
        self.ledger = Ledger(operations=steps.operations())
        self.declines = declines
        self.applied_declines = False  # Options.applied_declines
        self.do_paths = steps.do_paths  # "service/operation" of every step's do
        self.calls: list[tuple[str, str, int, str]] = []  # (key, op, token, outcome)
        self.on_call: Callable[[RemoteCall], None] | None = None  # the simulation's check
        self.undo_budget = 60.0  # seconds; the simulation sets its own (undo_budget)

    async def call(self, call: RemoteCall, *, timeout: float) -> dict[str, Any]:
        status, text = await self.answer(call, timeout=timeout)
        what = f"{call.service}/{call.operation} for {call.idempotency_key}"
        return _interpret(what, status, text, None, call.fencing_token)

    async def answer(self, call: RemoteCall, *, timeout: float) -> tuple[int, str]:
        """The service's HTTP answer (status, body text) to one call; what the
        product's HttpRemoteService reads through sim.remote.SimSession."""
        if self.on_call is not None:
            self.on_call(call)
        self._undo_blackout(call)
        await self.world.point(
            f"remote.{call.service}.{call.operation}", delay=self.world.rng.choice((0.05, 0.2, 1.0))
        )
        op = f"{call.service}/{call.operation}"
        outage = self.world.faults.outage
        order_id = call.idempotency_key.partition("/")[0]
        down = (
            bool(outage)
            and outage[0] <= self.world.clock.now < outage[1]
            and outage[2] == call.service
        )
        # A partial outage: most calls fail outright; some are applied and
        # their answer is lost on the way back (a gateway timeout).
        lost = down and self.world.rng.random() < self.world.faults.outage_lost
        if down:
            self.world.faults.hit("outage_lost" if lost else "outage")  # the fault surface
        if down and not lost:
            status, text = 503, json.dumps({"code": "Unavailable", "error": "service unavailable"})
        elif op in self.declines.get(order_id, ((),))[0]:
            self.world.faults.hit("decline")
            if self.applied_declines and op in self.do_paths:
                # Applied, then refused (idempotent: a retry applies nothing more).
                self.ledger.apply(
                    call.service,
                    call.operation,
                    call.idempotency_key,
                    str(call.fencing_token),
                    call.body,
                )
            status, text = (
                402,
                json.dumps({"code": "Declined", "error": self.declines[order_id][1]}),
            )
        else:
            answer = self.ledger.apply(
                call.service,
                call.operation,
                call.idempotency_key,
                str(call.fencing_token),
                call.body,
            )
            body = answer.body
            if status_ok(answer.status) and self.world.faults.draw(
                self.world.faults.config.odd_answers, "odd_answer", call.idempotency_key
            ):
                body = {**body, "Reference": self.world.rng.choice(ODD_REFERENCES)}
            status, text = answer.status, json.dumps(body)
            if lost:
                status, text = (
                    504,
                    json.dumps({"code": "GatewayTimeout", "error": "no answer from upstream"}),
                )
        outcome = "ok" if status < 300 else "transient" if status >= 500 else "permanent"
        self.calls.append((call.idempotency_key, op, call.fencing_token, outcome))
        self.world.log(f"remote {op} {call.idempotency_key} token {call.fencing_token} -> {status}")
        return status, text

    def _undo_blackout(self, call: RemoteCall) -> None:
        """The schedule's first undo call starts its undo blackout
        (FaultConfig.undo_blackout): an outage of that service longer than the
        whole undo budget, every call in it applied and its answer lost."""
        faults = self.world.faults
        if (
            not faults.config.undo_blackout
            or faults.outage is not None
            or call.operation not in ("release", "refund", "cancel")
            or not faults.draw(1.0, "undo_blackout", call.service)
        ):
            return
        length = self.world.data_rng.uniform(*BLACKOUT_UNDO_BUDGETS) * self.undo_budget
        now = self.world.clock.now
        faults.outage = (now, now + timedelta(seconds=length), call.service)
        faults.outage_lost = 1.0
        self.world.log(f"undo blackout of {call.service} for {length:.0f} s")


class SimClock:
    """The product's Clock (adapters.clock) for one actor of the simulation:
    the world's time with the actor's skew; sleeping is a scheduling point."""

    def __init__(self, world: World, actor: str) -> None:
        self.world = world
        self.actor = actor

    def now(self) -> datetime:
        return self.world.clock.at(self.world.skew(self.actor))

    async def sleep(self, seconds: float) -> None:
        await self.world.point(f"{self.actor}.sleep", delay=seconds)


def _random_text(rng: random.Random) -> str:
    length = rng.choice((0, 10, 200, 230, 600, 4096))
    if length == 0:
        return ""
    alphabets = [
        (0x20, 0x7E),
        (0xA0, 0x2FF),
        (0x3040, 0x30FF),
        (0x1F300, 0x1F64F),
        (0x4E00, 0x9FFF),
    ]
    out = []
    for _ in range(length):
        lo, hi = rng.choice(alphabets)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


async def _inline(fn, /, *args, **kwargs):
    """The settlement runner of the simulation: the gate and the agents settle
    through the binding's synchronous actions in a worker thread; the
    simulation's actions are in memory, and a thread would make the schedule
    depend on the OS, so they run inline."""
    return fn(*args, **kwargs)


@dataclass
class _MeasuredRun:
    """What the Supervisor's timer gets from the root in the simulation: the
    run of a Supervisor as the root builds it, with the simulation's checks
    and figures around it."""

    run: Callable[[], Any]


# The host process the running task is on (Simulation.hosts); each delivery
# and timer run is a task of its own, so this is set per task.
_HOST: contextvars.ContextVar[int] = contextvars.ContextVar("sim_host", default=0)


@dataclass
class SimHost:
    index: int
    generation: int
    submit: Any
    starter: Starter
    processor: RequestProcessor


class Simulation:
    def __init__(
        self,
        seed: int,
        orders: int = 3,
        drop: frozenset[int] = frozenset(),
        options: Options | None = None,
        version: str | None = None,
        hostile: int | None = None,
        apps: int = 2,
        wider: bool = True,
        scan: str | None = None,
        hosts: int | None = None,
        fallible: bool = True,
    ) -> None:
        self.seed = seed
        self.junk: list[str] = []  # ids of the garbage documents (foreign_docs)
        self.faults_stopped = START  # set when they do (fixed_point)
        self.newer_fields: set[str] = set()  # records a newer version added a field to
        self.o = options or options_for(
            seed, orders, version, hostile, apps, wider, hosts=hosts, fallible=fallible
        )
        if scan is not None:  # `python -m sim --scan`: every schedule with this Supervisor
            self.o = replace(self.o, scan=scan)
        self.world = World(seed, self.o.faults, drop)
        w = self.world
        self.bus = Bus(w)
        self.state_c = SimContainer(w, "state", "/id")
        self.orders_c = SimContainer(w, "orders", "/id")
        self.index_c = SimContainer(w, "index", "/bucket")
        self.rows: Counter[str] = Counter()
        self.violations: list[tuple[str, str]] = []
        self.supervisor_costs: list[tuple[int, int]] = []  # (requests, pages) per run
        self.deadline_mismatch: list[str] = []
        self.quit_early: list[str] = []
        self.step_deadline_reused: list[str] = []
        self.impersonated = False
        self.changed_resends: list[tuple[str, str]] = []  # (order key, message id)
        self.told_rejected: set[str] = set()
        self.due_not_recovered: list[str] = []
        self.index_not_visited: list[str] = []
        self.undo_unheard: list[str] = []
        self._sup_starts = self._sup_active = 0
        self.first_entry: dict[tuple[str, int], datetime] = {}  # (order key, attempt) -> entry
        self.index_entry_late: list[str] = []
        self.index_c.on_write = self._on_index_write
        self.state_c.on_write = self._on_state_write
        self.overwritten: list[str] = []
        self.last_write: datetime | None = None
        self.live_entry_deleted: list[str] = []
        self.cursor_passed: list[str] = []
        self.index_c.on_delete = self._on_index_delete
        # Writes per index partition key per simulated second (ADR 019b), and
        # the shard count, fixed per container, from a stream of its own.
        self.index_writes = PartitionWrites(self.index_c)
        self.index_shards = self.o.index_shards or random.Random(f"shards/{seed}").choice(
            (1, 4, 16)
        )
        self.orders_c.on_write = self._on_orders_write
        # Who wrote each orders-DB document last (the lock token of the
        # delivery, when), the lineage and start of every delivery, and the
        # deliveries whose handler ended before it finished (a crash, a raise):
        # to tell an orphan a dead delivery left from one the product kept.
        self.orders_writer: dict[str, tuple[int | None, datetime]] = {}
        self.delivery_of: dict[int, tuple[str, datetime]] = {}
        self.lineage_starts: dict[str, list[datetime]] = {}
        self.unfinished: set[int] = set()
        account = CosmosAccount("https://sim.invalid", None)
        self.settings = Settings(
            state_account=account,
            orders_account=account,
            servicebus=ServiceBusAccess(connection_string="sim"),
            reply_queues=dict(REGISTRY),
            ingress_queues=dict(INGRESS_OF),
            pending_backlog_limit=self.o.backlog_limit,
            step_timeout=self.o.step_timeout,
            supervisor_page_size=self.o.page_size,
            supervisor_scan=self.o.scan,
            retry=self.o.retry,
            # The schedule's own keys, from its seed (its own stream: no other
            # draw moves), as devstack generates a stack's (ADR 017e).
            agent_keys=KeyRing([random.Random(f"keys/agents/{seed}").randbytes(32)]),
            reply_token_keys=KeyRing([random.Random(f"keys/tokens/{seed}").randbytes(32)]),
            # Submit's look-up of a record keyed by the bare OrderID (ADR
            # 017f) in the two-application world; the one-application world
            # is a deployment with no such records, the lookup off.
            legacy_order_keys=self.o.apps > 1,
            # The version new attempts run, as the app reads it (its claim
            # marks the steps from 2.4 on, ADR 021a).
            workflow_version=self.o.version or default_version(),
            progress_apps=self.o.progress_apps,
        )
        # The product's own Service Bus adapters over a simulated client (issue 21).
        self.servicebus = SimServiceBusClient(w, self.bus, set(REGISTRY.values()))
        self.servicebus.on_sent = self._on_sent
        self.servicebus.on_copy_dropped = self._on_copy_dropped
        self.publisher = publisher(self.servicebus)
        # The root's seams: alerts' message ids drawn from the seed (a random
        # uuid4 in the app), settlement inline, the agents' circuit breakers
        # timed on the world's clock.
        ids = random.Random(f"uuid/{seed}")
        self.seams = Seams(
            new_id=lambda: uuid.UUID(int=ids.getrandbits(128), version=4),
            run_sync=_inline,
            breaker_now=lambda: self.world.clock.now,
        )
        self.request_sender: dict[str, tuple[str, int]] = {}
        self.lost_requests: list[str] = []
        self.lost_copies: list[str] = []
        # The agent's delivery being handled, per task: until when its calls may start.
        self._request_limit: dict[Any, datetime | None] = {}
        self.late_calls: list[str] = []
        self.bad_identity: list[str] = []
        # Per instance, the steps its undo requests name, in the order it first sent them.
        self.undo_sent: dict[str, list[str]] = {}
        self.store = CosmosStateStore(self.state_c)
        self.orders_repo = CosmosOrdersRepository(self.orders_c)
        self.index = (
            CosmosRecoveryIndex(self.index_c, shards=self.index_shards)
            if self.o.scan == "index"
            else NoIndex()
        )
        rng = w.data_rng
        # With two applications, order i comes from application i % 2 with
        # OrderID i // 2: every OrderID but the last of an odd count is used by
        # both. With one, every order is the webshop's.
        self.orders: dict[str, tuple[str, str]] = {}  # order key -> (app, OrderID)
        apps = APPS if self.o.apps > 1 else ("webshop",)
        for i in range(self.o.orders):
            app, oid = apps[i % len(apps)], f"ORD-{seed}-{i // len(apps)}"
            self.orders[order_key(app, oid)] = (app, oid)
        # Sometimes the webshop's first order was accepted by the version
        # before keys named the application (ADR 017f): its records are keyed
        # by the bare OrderID, the partner sends an order with the same
        # OrderID, and the webshop's message comes again (a redelivery).
        self.legacy: set[str] = set()
        if self.o.apps > 1 and random.Random(f"legacy/{seed}").random() < 0.3:
            key = order_key("webshop", f"ORD-{seed}-0")
            if key in self.orders:
                self.orders = {
                    (f"ORD-{seed}-0" if k == key else k): v for k, v in self.orders.items()
                }
                self.legacy.add(f"ORD-{seed}-0")
        self.key_of = {v: k for k, v in self.orders.items()}  # (app, OrderID) -> key
        self.order_ids = list(self.orders)  # order keys
        declines = {}
        for oid in self.order_ids:
            if w.faults.draw(self.o.faults.decline, "decline", oid):
                ops = rng.choice(refusals(self.o.steps))
                declines[oid] = (ops, _random_text(rng))
        self.remote = SimRemote(w, declines, self.o.steps)
        self.remote.undo_budget = undo_budget(self.o)
        self.remote.on_call = self._on_remote_call
        self.remote.applied_declines = self.o.applied_declines
        # The product's HTTP adapter over the simulated services (sim/remote.py).
        self.agent = self._new_agent(SimClock(w, "agent"), random.Random(f"agent/{seed}"))
        from activities.policy import ActivityPolicy
        from activities.scheduler_activities import SchedulerActivities

        self.activities = SchedulerActivities(
            ActivityPolicy.from_settings(self.settings),
            self.store,
            self.orders_repo,
            self.publisher,
            self.o.steps.names,
            self.agent,
            {},
            self.index,
            clock=SimClock(w, "activities"),
            alerts=self.alerts(),
        )
        # The host processes (Options.hosts), each with what bootstrap builds
        # once per process; the timers run on the one holding the singleton lock.
        self.hosts = [self._new_host(k) for k in range(self.o.hosts)]
        self.singleton = 0
        self.lease_free_at = START  # until then no host holds the singleton lock
        self._lease_rng = random.Random(f"hosts/lease/{seed}")
        self.host_deliveries: Counter[int] = Counter()
        # The standalone worker's runs (Options.workers), each a process of its own.
        self.workers = [WorkerHost(self, k, run) for k, run in enumerate(self.o.workers)]
        self._host_pick = random.Random(f"hosts/pick/{seed}")
        # The app as production builds it, over what the simulation hands the
        # root: each use case the one of the host the running task is on.
        self.app = build(
            self.settings,
            overrides=Overrides(
                seams=self.seams,
                submit_handler=self._host_submit,
                starter=self._host_starter,
                scheduler_activities=self._activities,
                supervisor=self._supervisor,
                message_gate=self._message_gate,
            ),
        )
        self.catalog = catalog(self.app)
        self.durable = SimDurable(w, self.catalog, self.o.version)
        self.durable.owner_of = self._owner_of
        self.durable.on_gone_answer = self._on_gone_answer
        self.durable.dies = self._compensation_dies
        self._lag_rng = random.Random(f"lagging/reads/{seed}")
        self.state_c.lagging = self.index_c.lagging = self._supervisor_lags
        self.compensation_died: Counter[str] = Counter()
        self.functions = {
            spec.trigger.get("queueName"): spec
            for spec in self.catalog.of_type(SERVICE_BUS_TRIGGER)
        }
        self._sup_n = 0
        self.submitted: set[str] = set()
        self.bad: dict[str, str] = {}
        self.operator_done: set[tuple[str, str]] = set()
        self.operator_pending = 0
        self.hostile = Hostile(self, self.o.faults.hostile) if self.o.faults.hostile else None

    # --- what the root is handed (Overrides): the running task's host's use cases
    def alerts(self) -> Alerts:
        return Alerts(self.publisher, new_id=self.seams.new_id)

    def _new_agent(self, clock: SimClock, rng: random.Random) -> Agent:
        policy = AgentPolicy()
        return Agent(
            http_remote(self.remote),
            clock,
            policy,
            breakers=Breakers(
                policy.breaker_fail_max, policy.breaker_reset_timeout, now=self.seams.breaker_now
            ),
            rng=rng,
            steps=self.o.steps,
        )

    async def _host_submit(self):
        return self.host.submit

    async def _host_starter(self) -> Starter:
        return self.host.starter

    async def _activities(self):
        return self.activities

    async def _supervisor(self):
        return self.new_supervisor()

    async def _message_gate(self, queue: str) -> MessageGate:
        consumer = (
            "submit" if queue in APP_OF_INGRESS else {"agent-responses": "bridge"}.get(queue, queue)
        )
        return MessageGate(
            queue,
            self.alerts(),
            self.publisher,
            BackoffPolicy(max_delivery_count=rules_for(queue).max_delivery),
            clock=SimClock(self.world, consumer),
            run_sync=self.seams.run_sync,
        )

    # --- a host process: what bootstrap builds once per process and loop
    def _new_host(self, k: int, generation: int = 0) -> SimHost:
        """Host k's own Submit handler (its backlog cache), Starter (its
        Processing figure and fast-path window) and agent (its circuit
        breakers); a restarted host (generation > 1) starts with none of what
        the one before had learnt. Host 0's first generation draws what the
        one-host world drew."""
        from submit.handler import BacklogReader, SubmitHandler

        w = self.world
        name = "" if k == 0 else f"@{k}"
        rng = (
            f"agent/{self.seed}"
            if (k, generation) == (0, 0)
            else f"agent/{self.seed}/{k}/{generation}"
        )
        agent = (
            self.agent
            if (k, generation) == (0, 0)
            else self._new_agent(SimClock(w, "agent" + name), random.Random(rng))
        )
        # With its alerts, as bootstrap.request_processor builds it.
        processor = RequestProcessor(
            agent,
            reply_sender(self.servicebus),
            self.alerts(),
            BackoffPolicy(max_delivery_count=rules_for("agent-requests").max_delivery),
            keys=self.settings.scheduler_keys().agents,
            scheduler=self.publisher,
            clock=SimClock(w, "agent" + name),
        )
        submit = SubmitHandler(
            SubmitPolicy.from_settings(self.settings),
            self.store,
            self.orders_repo,
            StatusReporter(self.publisher),
            self.alerts(),
            list(self.o.steps.names),
            backlog=BacklogReader(
                self.store,
                self.settings.backlog_gauge_max_age.total_seconds(),
                clock=SimClock(w, "submit" + name),
            ),
            clock=SimClock(w, "submit" + name),
            # As the root injects it: the fast path through the Starter of the
            # host the delivery is on.
            fast_start=fast_start(self._host_starter),
        )
        starter = Starter(
            StarterPolicy.from_settings(self.settings, self.o.steps.names, {}),
            self.store,
            self.index,
            clock=SimClock(w, "starter" + name),
            publisher=self.publisher,
            alerts=self.alerts(),
        )
        return SimHost(k, generation, submit, starter, processor)

    @property
    def host(self) -> SimHost:
        """The host the running task is on (a delivery's or a timer's)."""
        return self.hosts[_HOST.get()]

    def _pick_host(self) -> None:
        """Put the running task (one delivery) on a host: the one host, or
        any of several, as the Service Bus extension spreads messages."""
        if len(self.hosts) > 1:
            _HOST.set(self._host_pick.randrange(len(self.hosts)))
        self.host_deliveries[_HOST.get()] += 1

    def _restart_host(self, k: int) -> None:
        """Host k's process restarts: its in-memory state is gone. (Invocations
        it was running are the crash fault's; the lock holder's timers move.)"""
        old = self.hosts[k]
        self.hosts[k] = self._new_host(k, old.generation + 1)
        if k == self.singleton and self._lease_rng.random() < 0.5:
            # The singleton lock's lease of the dead process runs out before
            # another host takes it: no Starter or Supervisor run until then,
            # and the runs after it find a backlog of due attempts (older
            # index buckets, a rewind that matters).
            pause = round(self._lease_rng.uniform(15, 45), 3)
            self.lease_free_at = self.world.clock.now + timedelta(seconds=pause)
            self.world.log(f"singleton lock unheld for {pause} s")
        if k == self.singleton and len(self.hosts) > 1:
            self.singleton = (k + 1) % len(self.hosts)
        self.world.log(
            f"host {k} restarted (generation {old.generation + 1}); timers on host {self.singleton}"
        )

    def _lease_lost(self, length: float) -> None:
        """The singleton lock's holder stalls past its lease renewal: no host
        holds the lock for `length` seconds (Options.lease_pauses)."""
        self.lease_free_at = max(
            self.lease_free_at, self.world.clock.now + timedelta(seconds=length)
        )
        self.world.log(f"singleton lock's lease lost: unheld for {length} s")

    # --- the supervisor, as bootstrap builds it (its own charges per run)
    def new_supervisor(self):
        from supervisor.sources import IndexSource, QuerySource
        from supervisor.supervisor import Supervisor

        self._sup_n += 1
        clock = SimClock(self.world, f"supervisor{self._sup_n % 2}")
        charges = RequestCharges()
        store = CosmosStateStore(self.state_c, charges)
        source = (
            IndexSource(CosmosRecoveryIndex(self.index_c, charges, shards=self.index_shards), store)
            if self.o.scan == "index"
            else QuerySource(store)
        )
        sup = Supervisor(
            store,
            source,
            CosmosCheckpointStore(self.state_c, charges, f"supervisor-{self.o.scan}"),
            StatusReporter(self.publisher),
            self.alerts(),
            self.settings.retry,
            self.settings.supervisor_page_size,
            slack=SLACK,
            clock=clock,
            charges=charges,
            max_pages=self.settings.supervisor_max_pages,
            budget=self.settings.supervisor_run_budget,
        )
        run = sup.run

        async def measured():
            quiet = self._quiet_mark()
            now = clock.now()
            processing = {
                key: (doc.get("LockedBy"), doc.get("CompleteBy"))
                for key, doc in self.state_c.docs.items()
                if doc.get("ProcessState") == "Processing"
            }
            checkpoint = f"_checkpoint-supervisor-{self.o.scan}"
            resumed = (self.state_c.docs.get((checkpoint, checkpoint)) or {}).get("Cursor")
            reachable = self._index_reachable(now, resumed) if self.o.scan == "index" else {}
            first = self._sup_starts
            self._sup_starts += 1
            self._sup_active += 1
            try:
                report = await run()
            finally:
                self._sup_active -= 1
            # No other Supervisor run began or ran meanwhile (two Supervisors
            # share one checkpoint: the cursor this run loaded is `resumed`).
            alone = self._sup_active == 0 and self._sup_starts == first + 1
            if (
                reachable
                and alone
                and not report.skipped
                and not report.unreadable
                and self._quiet_mark() == quiet
                # A page that was not full walked to the end of the bucket of
                # its upper bound (only a full page stops the walk early).
                and report.read < report.pages * self.settings.supervisor_page_size
            ):
                self._check_index_visited(now, reachable)
            # A query pass is bounded by the `upper` it began with: only a run
            # that began a pass and finished it saw everything due at its start.
            # (An index run stops at a bucket's first entry not yet due, by
            # design, so entries of the current minute may wait for the next
            # runs; what the index owes is an entry at or before each
            # attempt's deadline: _check_index_entry.)
            whole = self.o.scan == "query" and report.pass_finished and resumed is None
            if whole and not report.skipped and self._quiet_mark() == quiet:
                self._check_due_recovered(now, processing)
            self.supervisor_costs.append((report.requests, report.pages))
            self.world.log(
                f"supervisor pages={report.pages} read={report.read} examined={report.examined} "
                f"recovered={report.recovered} "
                f"long_retry={report.long_retry} failed={report.failed} skipped={report.skipped} "
                f"requests={report.requests}"
            )
            return report

        return _MeasuredRun(measured)

    def _index_reachable(self, now: datetime, resumed: str | None) -> dict:
        """The due attempts an index run starting now from `resumed` must
        reach (issue 21: every due index entry is visited): each live
        attempt (Processing under the entry's attempt) whose deadline and
        entry passed before the run, with the slack and twice the skew, and
        whose entry lies after the cursor, up to the end of the bucket of
        the run's upper bound. Only for a cursor in the bucket of `upper`
        or the one before (a walk of at most two minutes' partitions, far
        inside one page's MAX_BUCKETS_PER_PAGE); a run without a usable
        checkpoint starts elsewhere (cursor rule 4). Partitions sort as
        strings in walk order (a minute's bare partition, then its shards),
        ids within one; `after` is exclusive."""
        from adapters.ports import minute_of

        try:
            bucket, after = json.loads(resumed or "null") or (None, None)
        except (TypeError, ValueError):
            return {}
        if not isinstance(bucket, str) or not isinstance(after, str):
            return {}
        upper = now - SLACK
        last = bucket_of(upper)
        if not bucket_of(upper - timedelta(seconds=60)) <= minute_of(bucket) <= last:
            return {}
        margin = SLACK + timedelta(seconds=2 * self.o.faults.skew)
        out: dict[tuple[str, int], tuple[str, str | None, str]] = {}
        for e in self.index_c.docs.values():
            oid, attempt, at = e.get("OrderID"), e.get("Attempt"), e.get("CompleteBy")
            b, i = e.get("bucket"), e.get("id")
            if not all(isinstance(v, str) for v in (oid, at, b, i)) or not isinstance(attempt, int):
                continue
            if oid in self.junk or minute_of(b) > last or (b, i) <= (bucket, after):
                continue
            doc = self.state_c.docs.get((oid, oid)) or {}
            due = doc.get("CompleteBy")
            if (
                doc.get("ProcessState") != "Processing"
                or doc.get("Attempt") != attempt
                or not isinstance(due, str)
                or datetime.fromisoformat(due) + margin >= now
                or datetime.fromisoformat(at) + margin >= now
            ):
                continue
            out[(oid, attempt)] = (i, doc.get("LockedBy"), due)
        return out

    def _check_index_visited(self, now: datetime, reachable: dict) -> None:
        """A quiet index run whose walk reached the end of the bucket of its
        upper bound read every entry after its cursor, and so recovered
        every attempt `_index_reachable` named (a walk that stops short of
        the minute's shards leaves them until the minute has passed)."""
        for (oid, attempt), (entry, owner, due) in sorted(reachable.items()):
            if self._still_held((oid, oid), owner, due):
                self.index_not_visited.append(
                    f"{oid} attempt {attempt}: entry {entry} due (CompleteBy {due}) at the "
                    f"start of a quiet index run at {now.isoformat()} whose walk reached the "
                    "end of its bucket, still Processing after it"
                )

    def _still_held(self, key: Any, owner: str | None, complete_by: str | None) -> bool:
        """The record is still Processing under `owner` with deadline
        `complete_by`: the attempt a run should have recovered was not."""
        doc = self.state_c.docs.get(key) or {}
        return (
            doc.get("ProcessState") == "Processing"
            and doc.get("LockedBy") == owner
            and doc.get("CompleteBy") == complete_by
        )

    def _quiet_mark(self) -> tuple[int, ...]:
        """Changes whenever a fault is injected, a store call is throttled or
        an actor crashes or raises: equal before and after a run, the run met none."""
        c = self.world.counters
        return (
            len(self.world.faults.injected),
            c["throttled"],
            c["crash"],
            c["raised"],
            c["supervisor_lagged"],
        )

    def _check_due_recovered(
        self, now: datetime, processing: dict[Any, tuple[str | None, str | None]]
    ) -> None:
        """A Supervisor run that met no fault and finished its pass has
        visited every attempt that was past its deadline and slack when it
        started: none is still Processing under the same owner and deadline
        (a due entry visited late, or never, by an index placed too late or a
        cursor that passed it)."""
        for key, (owner, complete_by) in sorted(processing.items()):
            if key[0] in self.junk:
                continue  # a foreign document: skipped with an alert, not recovered
            # An index entry may sit up to twice the clock skew after the
            # record's deadline (the claim's clock against the orchestration's).
            margin = SLACK + timedelta(seconds=2 * self.o.faults.skew)
            if not complete_by or datetime.fromisoformat(complete_by) + margin >= now:
                continue
            if self._still_held(key, owner, complete_by):
                self.due_not_recovered.append(
                    f"{key[0]}: CompleteBy {complete_by}, due at the run's start {now.isoformat()}, "
                    f"still Processing under {owner} after a clean, finished pass"
                )

    def _check_compensation_failed_is_true(self, docs: dict[str, dict | None]) -> None:
        """No false CompensationFailed: a CompensationFailed record whose every
        undo left open (Failed, or Pending: unconfirmed when 2.2's long
        retries ran out, or given up by the Starter's restarts) was in fact
        applied remotely, answered ok or with its answer lost (the ledger
        holds its result: it happened), says the order failed though it did
        not (N3; ADR 005, ADR 019a)."""
        for oid, doc in docs.items():
            if not doc or doc["ProcessState"] != "CompensationFailed":
                continue
            open_steps = [
                c["Step"] for c in doc.get("Compensation") or [] if c.get("Outcome") != "Done"
            ]
            answered = {
                k.split("/", 1)[1]
                for k, op, _, out in self.remote.calls
                if k.startswith(oid + "/") and out == "ok" and op in self.o.steps.undo_paths
            }
            applied = {
                key.split("|")[0].split("/", 1)[1]
                for key in self.remote.ledger.results
                if key.startswith(oid + "/") and key.split("|")[1] in self.o.steps.undo_paths
            }
            if open_steps and all(s in answered | applied for s in open_steps):
                self.fail(
                    "no false CompensationFailed",
                    f"{oid}: undo of {open_steps} succeeded remotely, record says CompensationFailed",
                )

    def _check_compensation_long_retry(self, old: dict, new: dict, actor: str) -> None:
        """The long retry of an unconfirmed undo (2.2, ADR 019a), on the path:
        the Starter restarts a deferred compensation only once its NotBefore
        has passed, and the long retries stay within their bound."""
        waits = old.get("NotBefore")
        if (
            actor == "starter"
            and old.get("ProcessState") == "Compensating"
            and isinstance(waits, str)
            and new.get("LockedBy") != old.get("LockedBy")
            # The Starter reads its own clock, which may run ahead by the skew.
            and datetime.fromisoformat(waits) - timedelta(seconds=self.o.faults.skew)
            > self.world.clock.now
        ):
            self.violations.append(
                (
                    "a compensation's long retry waits for its time",
                    f"starter restarted {new.get('id')} at {self.world.stamp()}, NotBefore {waits}",
                )
            )
        count = new.get("CompensationLongRetries")
        if isinstance(count, int) and count > self.settings.retry.undo_long_retries:
            self.violations.append(
                (
                    "compensation long retries bounded",
                    f"{new.get('id')}: {count} long retries "
                    f"(at most {self.settings.retry.undo_long_retries})",
                )
            )

    # --- bookkeeping of writes: transition rows and the stale-write check
    def _on_state_write(self, old: dict | None, new: dict) -> None:
        if "ProcessState" not in new:
            if self.o.scan == "index" and "Cursor" in new:
                self._check_cursor(new)
            return
        self._check_step_deadline(old, new)
        if self.o.scan == "index":
            self._check_index_entry(old, new)
        self.last_write = self.world.clock.now
        actor = self._actor()
        before = old.get("ProcessState") if old else None
        after = new["ProcessState"]
        row = None
        if before is None and after == "Pending":
            row = "1"
        elif actor in ("starter", "submit") and before == "Pending" and after == "Processing":
            row = "2"  # the Starter's claim, by its timer or by Submit's fast path
        elif actor == "orchestration":
            row = {
                ("Processing", "Processing"): "3",
                ("Processing", "Processed"): "4",
                ("Processing", "Error"): "5",
                ("Processing", "Compensating"): "8a",
                ("Error", "Compensating"): "8a",
                ("Compensating", "Compensated"): "8b",
                ("Compensating", "CompensationFailed"): "8c",
            }.get((before, after))
            if (before, after) == ("Compensating", "Compensating") and new.get("NotBefore"):
                row = None if (old or {}).get("NotBefore") else "8d"
        elif actor == "supervisor" and before == "Processing":
            row = "6" if after == "Pending" and not new.get("NotBefore") else "7"
        elif actor == "operator" and before == "Error" and after == "Pending":
            row = "9"
        elif actor == "starter" and after == "Compensating":
            row = "8a"
        if row:
            self.rows[row] += 1
        if old:
            self._check_compensation_long_retry(old, new, actor)
        restarts = new.get("CompensationRestarts")
        if (
            isinstance(restarts, int)
            and restarts > MAX_COMPENSATION_RESTARTS
            and restarts != (old or {}).get("CompensationRestarts")
        ):
            # On the path, as written (issue 21: every counter by its rule): a
            # restart past the budget is reset by the long retry that follows,
            # so the end state would not show it.
            self.violations.append(
                (
                    "compensation restarts bounded",
                    f"{actor} restarted the compensation of {new.get('id')} for the "
                    f"{restarts}th time at {self.world.stamp()} "
                    f"(at most {MAX_COMPENSATION_RESTARTS})",
                )
            )
        if old and actor == "supervisor" and before == "Processing":
            self._check_recovery(old, new)
        if (
            old
            and actor == "starter"
            and before == "Compensating"
            and old.get("LockedBy")
            and new.get("LockedBy") != old.get("LockedBy")
        ):
            # A restart (or giving up) takes the compensation from its instance:
            # only right when that instance is gone, never on a status blip.
            inst = self.durable.instances.get(old["LockedBy"])
            if inst is not None and inst.status in ("Pending", "Running"):
                self.violations.append(
                    (
                        "a live compensation is never restarted",
                        f"starter took {new['id']} from {old['LockedBy']} ({inst.status})",
                    )
                )
            # A counter by its rule: a restart is spent on an attempt that ran.
            # One written and never started (its writer died before start_new,
            # or the write's answer was lost) is started under its own id, not
            # counted: nothing ran, so nothing was given up (seed 5000250).
            # (The simulated task hub keeps every instance it started.)
            if inst is None and (new.get("CompensationRestarts") or 0) > (
                old.get("CompensationRestarts") or 0
            ):
                self.violations.append(
                    (
                        "a restart is counted only for an attempt that ran",
                        f"starter counted restart {new.get('CompensationRestarts')} of "
                        f"{new['id']} for {old['LockedBy']}, which was never started",
                    )
                )
        if old and actor == "orchestration":
            writer = self._instance()
            if writer and old.get("LockedBy") != writer and not _outbox_only(old, new):
                self.violations.append(
                    (
                        "3 stale attempt wrote",
                        f"{writer} changed {new['id']} locked by {old.get('LockedBy')}",
                    )
                )

    def _check_undo_answers_heard(self) -> None:
        """Every try's answer counts until the undo's deadline (ADR 005), on
        the path: an episode of a compensation that hears an OK answer to any
        try of an undo (the first copy of that try's reply event, which is the
        one the orchestration takes; earlier than the undo's ListenUntil less
        the clocks' skew and a second) whose outcome it has not yet written,
        while no activity of it is outstanding and no timer fired with it,
        schedules that undo's UndoDone write in the same episode. (An undo
        that listens only to its latest try leaves an earlier try's late OK
        unheard, and waits on, or ends the undo unconfirmed.)"""
        tries: dict[str, tuple[str, str, datetime]] = {}  # event -> (instance, step, until)
        for m in self.bus.queue("agent-requests").sent:
            if m.message_id.startswith(FORGED):
                continue  # a forgery (sim.hostile) names real instances and events
            try:
                req = json.loads(m.body)
                own = f"{req.get('InstanceId')}/{req.get('Step')}/undo-"
                event = f"reply-{req.get('Step')}-undo-"
                if not m.message_id.startswith(own) or not req["ReplyEvent"].startswith(event):
                    continue
                if req.get("Action") == "undo" and req.get("ListenUntil"):
                    until = datetime.fromisoformat(req["ListenUntil"])
                    key = f"{req['InstanceId']}/{req['ReplyEvent']}"
                    tries[key] = (req["InstanceId"], req["Step"], until)
            except (ValueError, TypeError, KeyError, AttributeError):
                continue
        if not tries:
            return
        margin = timedelta(seconds=1 + self.o.faults.skew)
        settled = (TASK_COMPLETED, TASK_FAILED)
        for iid, inst in sorted(self.durable.instances.items()):
            outstanding: set[Any] = set()
            written: set[str] = set()  # steps whose undo outcome was scheduled
            heard: set[str] = set()
            retrying = False
            episodes: list[list[dict]] = []
            for e in inst.history:
                if e.get("EventType") == ORCHESTRATOR_STARTED or not episodes:
                    episodes.append([])
                episodes[-1].append(e)
            for episode in episodes:
                due: list[tuple[str, str]] = []  # (step, event) answered OK in time
                fired = False
                for e in episode:
                    kind = e.get("EventType")
                    if kind == TASK_FAILED:
                        # The SDK retries a failed activity after a durable
                        # timer: outstanding until its next scheduling.
                        retrying = True
                    if kind in settled:
                        outstanding.discard(e.get("TaskScheduledId"))
                    elif kind == TIMER_FIRED:
                        fired = True
                    elif kind == EVENT_RAISED:
                        name = str(e.get("Name"))
                        known = tries.get(f"{iid}/{name}")
                        if known is None or name in heard:
                            continue
                        heard.add(name)
                        at = datetime.fromisoformat(e["Timestamp"])
                        step = known[1]
                        if (
                            _outcome_of(e.get("Input")) == "ok"
                            and at + margin < known[2]
                            and step not in written
                        ):
                            due.append((step, name))
                scheduled = [e for e in episode if e.get("EventType") == TASK_SCHEDULED]
                waiting_retry = retrying
                if scheduled:
                    retrying = False
                outcomes = set()
                for e in scheduled:
                    outstanding.add(e.get("EventId"))
                    if e.get("Name") == "write_state":
                        try:
                            cmd = json.loads(e.get("Input") or "null")
                            cmd = json.loads(cmd) if isinstance(cmd, str) else cmd
                        except ValueError:
                            continue
                        if isinstance(cmd, dict) and str(cmd.get("Kind", "")).startswith("undo_"):
                            outcomes.add(cmd.get("Step"))
                pending = outstanding - {e.get("EventId") for e in scheduled}
                for step, name in due:
                    if step not in outcomes and not pending and not fired and not waiting_retry:
                        self.undo_unheard.append(
                            f"{iid} heard {name} answer OK before the undo's deadline, with "
                            f"nothing else outstanding, and did not record the undo of {step} done"
                        )
                written |= {str(s) for s in outcomes}

    def _check_recovery(self, old: dict, new: dict) -> None:
        """A Supervisor's recovery (rows 6 and 7) at its allowed time and by
        the budget's rule, checked as it is written (the path, not only the
        end; issue 21): the attempt's CompleteBy had passed in the world's own
        time (the Supervisor's slack is larger than any actor's skew),
        FailureCount moved by exactly one, and that count says where the
        record goes: a quick retry below the threshold, a long retry
        (NotBefore set) below threshold + long retries, Error at the end."""
        policy = self.settings.retry
        oid = new.get("id")
        complete_by = old.get("CompleteBy")
        # Not before the deadline plus the Supervisor's slack on its own clock
        # (supervisor/supervisor.py: the slack covers the clocks' skew), so in
        # the world's time not before the deadline plus the slack less the
        # largest skew. Earlier, a Supervisor whose clock runs ahead takes an
        # attempt an orchestration whose clock is behind still runs (mutant
        # `sm-expiry-no-slack`: the record re-read for the write has a
        # deadline the scan's lagging read did not show).
        allowed = (
            datetime.fromisoformat(complete_by)
            + SLACK
            - timedelta(seconds=self.o.faults.skew + 0.001)
            if isinstance(complete_by, str)
            else None
        )
        if allowed is None or allowed >= self.world.clock.now:
            self.violations.append(
                (
                    "recovery only after the deadline",
                    f"supervisor recovered {oid} at {self.world.stamp()} "
                    f"with CompleteBy {complete_by} (slack {SLACK.total_seconds():.0f} s, "
                    f"skew up to {self.o.faults.skew} s)",
                )
            )
        counted = old.get("FailureCount")
        if not isinstance(counted, int):
            return  # a foreign document's count: its own alert names it
        failures = counted + 1
        if new.get("FailureCount") != failures:
            self.violations.append(
                (
                    "FailureCount moves by one per recovery",
                    f"{oid}: {counted} -> {new.get('FailureCount')}",
                )
            )
            return
        if failures < policy.threshold:
            expected = ("Pending", False)
        elif failures < policy.max_failures:
            expected = ("Pending", True)
        else:
            expected = ("Error", False)
        got = (new.get("ProcessState"), bool(new.get("NotBefore")))
        if got != expected:
            self.violations.append(
                (
                    "recovery follows the retry budget",
                    f"{oid}: failure {failures} (threshold {policy.threshold}, "
                    f"{policy.long_retries} long) went to {got[0]}"
                    f"{' with NotBefore' if got[1] else ''}, not {expected[0]}"
                    f"{' with NotBefore' if expected[1] else ''}",
                )
            )

    def _on_remote_call(self, call: RemoteCall) -> None:
        """No call starts after its request's deadline (DESIGN.md section 4,
        agents: never start a new side effect after it), nor after the undo's
        ListenUntil when it listens longer (ADR 005), in the world's own time:
        the agent's margin before it is larger than any actor's skew."""
        limit = self._request_limit.get(asyncio.current_task())
        if limit is not None and self.world.clock.now >= limit:
            self.late_calls.append(
                f"{call.service}/{call.operation} for {call.idempotency_key} (token "
                f"{call.fencing_token}) started at {self.world.stamp()}, after its "
                f"request's deadline {limit.isoformat()}"
            )

    def _on_index_delete(self, entry: dict) -> None:
        """An index entry removed while its attempt is still live (the record is
        Processing under the entry's attempt) leaves the attempt with no entry:
        nothing will ever recover it. Not only the entry at the record's own
        deadline: the Starter indexes an attempt at its earliest possible
        deadline, before the record's (the claim's CompleteBy is later), and
        that entry is the attempt's only one until a Supervisor moves it
        (mutant `idx-lagging-read-removed`: the entry removed on a lagging
        read that showed the attempt before)."""
        oid, attempt = entry.get("OrderID"), entry.get("Attempt")
        if not isinstance(oid, str):
            return  # not an entry (the shard-count document, garbage): no attempt's
        doc = self.state_c.docs.get((oid, oid))
        # Another entry of the attempt (a move adds the new one before removing
        # the old) still brings the Supervisor back to it.
        others = [
            e
            for e in self.index_c.docs.values()
            if e.get("OrderID") == oid
            and e.get("id") != entry.get("id")
            and (e.get("Attempt") == attempt or not isinstance(attempt, int))
        ]
        if (
            doc
            and doc.get("ProcessState") == "Processing"
            and (
                doc.get("CompleteBy") == _cosmos(str(entry.get("CompleteBy")))
                or (isinstance(attempt, int) and doc.get("Attempt") == attempt)
            )
            and not others
        ):
            self.live_entry_deleted.append(
                f"{entry.get('id')} (attempt {attempt}) removed at {self.world.stamp()} while "
                f"{doc.get('LockedBy')} is still Processing (CompleteBy {doc.get('CompleteBy')})"
            )

    def _check_cursor(self, checkpoint: dict) -> None:
        """Every due index entry is visited (issue 21, on the path): the
        cursor an index Supervisor saves never passes an entry of a live
        attempt (the record Processing under the entry's attempt) that stays
        in the index, unless the attempt has another entry the cursor has not
        passed. A passed entry is never read again (a cursor only moves on),
        so its attempt would be recovered by nothing; a run that did not
        handle a candidate resumes at it (mutant `sup-no-rewind`: the rewind
        dropped mid-pass). Partitions sort as strings (`<minute>|<shard>`, the
        shard zero-padded; a bare minute first) and ids within one; `after`
        is exclusive."""
        try:
            bucket, after = json.loads(checkpoint.get("Cursor") or "null") or (None, None)
        except (TypeError, ValueError):
            return
        if not isinstance(bucket, str) or not isinstance(after, str):
            return

        def passed(e: dict) -> bool:
            b, i = str(e.get("bucket")), str(e.get("id"))
            return b < bucket or (b == bucket and i <= after)

        live: dict[tuple[str, int], list[dict]] = {}
        for e in self.index_c.docs.values():
            oid, attempt = e.get("OrderID"), e.get("Attempt")
            if not isinstance(oid, str) or not isinstance(attempt, int):
                continue
            doc = self.state_c.docs.get((oid, oid))
            if doc and doc.get("ProcessState") == "Processing" and doc.get("Attempt") == attempt:
                live.setdefault((oid, attempt), []).append(e)
        for (oid, attempt), entries in sorted(live.items()):
            if all(passed(e) for e in entries):
                self.cursor_passed.append(
                    f"{self._actor()} saved cursor {checkpoint.get('Cursor')} at "
                    f"{self.world.stamp()}, past {entries[0].get('id')} (bucket "
                    f"{entries[0].get('bucket')}), the only entry of {oid}'s live attempt {attempt}"
                )

    def _on_orders_write(self, old: dict | None, new: dict) -> None:
        if old:
            self.overwritten.append(new["id"])
        self.orders_writer[new["id"]] = (HANDLING.get(), self.world.clock.now)

    def _orphaned(self, key: str) -> bool:
        """The orders-DB document under `key` was last written by a delivery
        that ended before it finished (its host died, or it raised), and no
        delivery of that message's lineage started after the write: nothing
        in the product knows of it any more until the order is sent again,
        when Submit takes a conflicting copy's document back
        (_unless_in_the_way; seed 3005811: the changed resend's two deliveries
        ran at once, one dead-lettered the message, the other wrote the
        document again and its host died). Garbage, not a kept order."""
        token, at = self.orders_writer.get(key, (None, START))
        if token is None or token not in self.unfinished or token not in self.delivery_of:
            return False
        lineage = self.delivery_of[token][0]
        return not any(start > at for start in self.lineage_starts.get(lineage, ()))

    def _ended_in_dead_letters(self, key: str) -> bool:
        """Every message of the order's own lineages (the client's message and
        its same-data resends, with their back-off copies) that the handler
        did not carry to a settlement ended in a dead letter that no handler
        finished the order with, and none completed: the broker's
        MaxDeliveryCountExceeded after every one of its deliveries faulted
        (the platform's dead-letter rule reports it, infra/app/alerts.bicep),
        or the gate's RetriesExhausted on a last delivery whose back-off copy
        could not be scheduled, with its alert or as the last resort
        (`_unfinished_dead_letter`; seed 894, 3 orders: an ingress queue
        full after deliveries that wrote the Rejected record, or admitted the
        order to the orders DB, and then met failing stores).
        No status went out for the order, and a Rejected record may keep the
        document its dying delivery wrote; the client's next resend, which
        the same-data resend path admits or rejects again, tells it
        (simulation seed 9000535, 50 orders: five deliveries, four crashes
        and a lost abandon, one of which wrote the Rejected record; the
        liveness check excuses the same cases for an order with no record)."""
        app, own = self.orders[key]
        ingress = self.bus.queue(INGRESS_OF[app])
        names = {own, f"{own}/resend"}

        def lineage(m: Msg) -> str:
            return str(m.props.get(ORIGINAL_ID_PROPERTY) or m.message_id)

        members = [m for m in ingress.sent if lineage(m) in names]
        dead = [m for m in ingress.dead if lineage(m) in names]
        if not dead or not all(
            self._unfinished_dead_letter(ingress.name, m, alerted=True) for m in dead
        ):
            return False
        gone = {m.seq for m in ingress.dead} | {m.seq for m in ingress.messages}
        return not any(
            m.seq not in gone and not any(later_copy(m, c) for c in members) for m in members
        )

    def _unfinished_dead_letter(self, queue: str, m: Msg, alerted: bool = False) -> bool:
        """`m` (on `queue`) is a dead letter no handler finished its work
        with, and something reports it. The broker's MaxDeliveryCountExceeded
        after every delivery faulted, which the platform's dead-letter rule
        reports (infra/app/alerts.bicep: any dead letter on any queue); or
        the gate's last resort, RetriesExhausted by a delivery whose back-off
        copy could not be scheduled (Msg.copy_faulted) and whose alert was
        refused too: with nothing left to carry the alert, it goes with only
        its log event (adapters.settlement.MessageGate.run), and the same
        rule reports it (seed 2 with its ingress queue full, in the fault
        surface's targeted pass: four deliveries in 0.3 s, every copy
        refused, and the last one's alert refused by a failing alerts send).
        With `alerted`, also the gate's RetriesExhausted whose alert went out
        (seed 894): a caller that asks no more of it than its alert."""
        if m.dead_letter_reason == "MaxDeliveryCountExceeded":
            return self.bus.every_delivery_faulted(m)
        if m.dead_letter_reason != "RetriesExhausted":
            return False

        def names_m(alert: dict) -> bool:
            return (
                alert.get("Kind") == "RetriesExhausted"
                and alert.get("MessageId") == m.message_id
                and alert.get("Queue") == queue
            )

        if alerted and any(names_m(json.loads(a.body)) for a in self.bus.queue(ALERTS_QUEUE).sent):
            return True
        return m.copy_faulted and any(names_m(a) for a in self.servicebus.refused_alerts)

    def _on_copy_dropped(self, queue: str, copy_id: str, maker: int | None) -> None:
        """A delivery's back-off copy that duplicate detection dropped: right
        only as a repeat of its own schedule (the SDK's retry after a lost
        answer). Dropped as the copy another delivery made, one that has
        already been delivered, nothing comes after this delivery's failure
        though the gate completes it (ADR 021i, seed 5000216)."""
        q = self.bus.queue(queue)
        first = next((m for m in reversed(q.sent) if m.message_id == copy_id), None)
        if first is None or maker is None or first.made_by in (None, maker):
            return
        if first.delivery_count > 0:
            self.lost_copies.append(
                f"{queue} {copy_id}: scheduled by delivery {maker} after its failure, "
                f"dropped as a duplicate of delivery {first.made_by}'s copy, "
                f"already delivered {first.delivery_count} time(s)"
            )

    def _on_sent(self, queue: str, message_id: str, accepted: bool) -> None:
        """An agent request of a restarted orchestration that duplicate detection
        drops was never answered to that execution: it can only wait out its deadline."""
        if accepted and message_id.endswith("/status/Rejected"):
            self._told_rejected(queue, message_id)
        iid = self._instance()
        if queue != "agent-requests" or iid is None or iid not in self.durable.instances:
            return
        step, _, action = message_id.removeprefix(f"{iid}/").partition("/")
        if action.startswith("undo") and step not in self.undo_sent.setdefault(iid, []):
            self.undo_sent[iid].append(step)
        execution = self.durable.instances[iid].execution
        if accepted:
            self.request_sender[message_id] = (iid, execution)
        elif self.request_sender.get(message_id, (iid, execution))[1] != execution:
            self.lost_requests.append(
                f"{message_id}: sent again by execution {execution} of {iid}, "
                f"dropped as a duplicate of execution {self.request_sender[message_id][1]}'s"
            )

    def _supervisor_lags(self, what: str) -> bool:
        """Does this read of a Supervisor come from its lagging replica
        (Options.lagging_supervisor)? Its own stream: no other draw moves."""
        if not self.o.lagging_supervisor or not self.world.faults.active:
            return False
        if self._actor() != "supervisor":
            return False
        if self._lag_rng.random() >= self.o.lagging_supervisor:
            return False
        self.world.counters["supervisor_lagged"] += 1  # a fault the run met (_quiet_mark)
        self.world.faults.hit("session_lag")  # the fault surface's, at the read's call site
        return True

    def _compensation_dies(self, instance_id: str) -> bool:
        """Does this compensation execution die (Options.compensation_deaths)?
        Only while faults last, and only an instance that owns a Compensating
        record (a compensation, not an attempt)."""
        if not self.o.compensation_deaths or not self.world.faults.active:
            return False
        oid = instance_id.rpartition(":")[0]
        doc = self.state_c.docs.get((oid, oid)) or {}
        if doc.get("ProcessState") != "Compensating" or doc.get("LockedBy") != instance_id:
            return False
        if self.compensation_died[oid] >= self.o.compensation_deaths:
            return False
        self.compensation_died[oid] += 1
        return True

    def _on_gone_answer(self, inst: Any, event_name: str) -> None:
        """A reply raised on an attempt that had already failed, on the path:
        an attempt that may have sent its step's request listens for the reply
        until the step's deadline (workflow 2.4: after a send, a begin or an
        advance whose answer was lost), so a reply before that deadline, to
        the step the record still gives the attempt, never finds it Failed.
        Except when it could not go on: the store refused every read of the
        plan it needed to know what was sent (a lost begin's reload whose
        last try the store answered so: the orchestration still ends with the
        begin's own error), or an injected death."""
        if inst.status != "Failed" or str(inst.output).startswith("injected:"):
            return
        if inst.version not in LISTENING_VERSIONS:
            return  # earlier versions fail the attempt there, as they were written to
        iid = inst.instance_id
        oid, _, token = iid.rpartition(":")
        doc = self.state_c.docs.get((oid, oid)) or {}
        if doc.get("ProcessState") != "Processing" or doc.get("LockedBy") != iid:
            return
        running = [
            name
            for name, s in (doc.get("Steps") or {}).items()
            if isinstance(s, dict) and s.get("Status") == "Running"
        ]
        if not token.isdigit() or event_name not in {
            reply_event_name(s, int(token)) for s in running
        }:
            return
        if self.durable.heard.get((iid, event_name)):
            return  # heard before it ended: a redelivered request's second answer
        failed, reason = self.durable.last_failure(inst)
        if failed == "load_plan" and _store_unavailable(reason):
            return
        complete_by = doc.get("CompleteBy")
        margin = timedelta(seconds=self.o.faults.skew + 1)
        if not complete_by or self.world.clock.now + margin >= datetime.fromisoformat(complete_by):
            return
        self.quit_early.append(
            f"{iid} failed ({failed}: {reason[:100]}; ended with {str(inst.output)[:100]}) "
            "with its record still its own, "
            f"step {running} Running until {complete_by}; {event_name} came at {self.world.stamp()}"
        )

    def _owner_of(self, instance_id: str) -> str | None:
        """The attempt that owns the record now (the latest write, not a lagged read)."""
        oid = instance_id.rpartition(":")[0]
        doc = self.state_c.docs.get((oid, oid))
        return doc.get("LockedBy") if doc else None

    def _acted_on(self, order_id: str, step: str, token: int) -> bool:
        """Did attempt `token` own the permanent answer for `step`: its
        orchestration was handed the reply, and it neither lost the race to
        its deadline timer nor had already lost the record to a later attempt.
        Only then must no later attempt ask again; an answer that arrived too
        late (or never) leaves the step failed for that attempt, and a retry
        with the same idempotency key is the protocol."""
        iid = f"{order_id}:{token}"
        heard = self.durable.heard.get((iid, reply_event_name(step, token)), [])
        # The first copy of the reply event is the one the orchestrator takes;
        # it must be the permanent answer (a redelivered request may have been
        # answered differently, e.g. transiently during an outage, and that
        # answer may be the one that reached the attempt).
        if not heard or _outcome_of(heard[0]) != "permanent":
            return False
        status, output, owner = self.durable.finished.get(iid, (None, None, None))
        if status == "Failed" and _store_unavailable(str(output)):
            # The store refused every write for longer than the activity
            # retries (a throttling storm past the SDK's own retries, a Cosmos
            # outage, 503s, lost answers): nothing could record the answer,
            # and the next attempt asks again under the same idempotency key.
            # Any other failure still counts.
            return False
        if status == "Completed" and isinstance(output, dict):
            if (
                output.get("Outcome") == "timed_out"
                and output.get("Step") == step
                and output.get("Detail") == "deadline passed"
            ):
                return False
            if output.get("Outcome") == "stale" and owner != iid:
                return False
        return True

    def _instance(self) -> str | None:
        name = self.world._names.get(asyncio.current_task(), "")
        return name.split(":", 2)[2] if name.startswith("act:") else None

    def _actor(self) -> str:
        task = asyncio.current_task()
        name = self.world._names.get(task, "")
        if name.startswith("act:"):
            return "orchestration"
        return name.split(":")[0].rstrip("0123456789")

    # --- actors
    def _order_body(self, key: str, total: str = "20.00", oid: str | None = None) -> bytes:
        app, own = self.orders[key]
        payload = {
            "OrderID": oid or own,
            "AppId": app,
            "ReplyTo": REGISTRY[app],
            "Customer": {"CustomerId": "C-7", "Name": "Ada"},
            "Lines": [
                {"Sku": "SKU-1", "Quantity": 2, "UnitPrice": str(int(float(total)) // 2) + ".00"}
            ],
            "Total": total,
            "Currency": "EUR",
            "PaymentReference": "pay-ref-42",
        }
        return json.dumps(payload).encode()

    def _bad_message(self, key: str) -> None:
        """A conflicting copy of an order (by its own application), a
        malformed body, or a body sent as an AMQP value instead of data
        sections: each must be dead-lettered with a reason and alerted, and
        never overwrite anything. Message ids: `{order key}/{kind}`."""
        app, oid = self.orders[key]
        queue = INGRESS_OF[app]
        kind = self.world.data_rng.choice(("conflict", "malformed", "amqp-value"))
        self.bad[f"{key}/{kind}"] = kind
        if kind == "conflict":
            self.bus.send(queue, self._order_body(key, "40.00"), f"{key}/{kind}")
        elif kind == "malformed":
            self.bus.send(
                queue, b'{"OrderID": "' + oid.encode() + b'", "Lines": "x"', f"{key}/{kind}"
            )
        else:
            self.bus.send(queue, json.loads(self._order_body(key, oid=f"{oid}-V")), f"{key}/{kind}")

    def _told_rejected(self, queue: str, message_id: str) -> None:
        """A client told Rejected ("try later", docs/client-guide.md) sends
        the order again a while later, sometimes changed (the customer edited
        the cart): in the worlds after several hosts, from a stream of its own."""
        if not (self.o.impersonation or self.o.applied_declines):
            return
        app = next((a for a, q in REGISTRY.items() if q == queue), None)
        key = self.key_of.get((app, message_id.split("/")[0])) if app else None
        if key is None or key in self.told_rejected:
            return
        self.told_rejected.add(key)
        rng = random.Random(f"rejected/{self.seed}/{key}")
        later = self.world.clock.now + timedelta(seconds=rng.uniform(20, 200))
        self.operator_pending += 1  # the schedule waits for it, as for an operator

        def resend() -> None:
            self.operator_pending -= 1
            self._resend(key, changed=rng.random() < 0.5)

        self.world.at(later, "client resend after Rejected", resend)

    def _resend(self, key: str, changed: bool = True) -> None:
        """The client sends its order again (a new message id). One told
        Rejected ("try later") may change it first, in the worlds after
        several hosts (Options.impersonation's): a conflict, which must be
        dead-lettered, never admitted over the first."""
        app, own = self.orders[key]
        doc = self.state_c.docs.get((key, key)) or {}
        new_world = self.o.impersonation or self.o.applied_declines
        if changed and new_world and doc.get("ProcessState") == "Rejected":
            mid = f"{own}/resend-changed"
            self.changed_resends.append((key, mid))
            self.bus.send(INGRESS_OF[app], self._order_body(key, CHANGED_TOTAL), mid)
            return
        self.bus.send(INGRESS_OF[app], self._order_body(key), f"{own}/resend")

    def _check_changed_resends(self) -> None:
        for key, mid in self.changed_resends:
            stored = self.orders_c.docs.get((key, key)) or {}
            # The order first accepted: the client's (Total 20.00), or its
            # conflicting copy (40.00, `_bad_message`) when that one came
            # first and was the order Rejected (seeds 58 and 71, 50 orders:
            # then a resend with the copy's content is no change at all, so
            # the changed resend carries a total of its own, CHANGED_TOTAL).
            first = {20.0, 40.0} if f"{key}/conflict" in self.bad else {20.0}
            if stored and float(stored.get("Total") or 0) not in first and not self._orphaned(key):
                self.fail(
                    "a changed resend of a Rejected order is a conflict",
                    f"{key}: the orders DB holds the changed copy (Total {stored.get('Total')}), "
                    "not the order first accepted",
                )
                break
            ingress = self.bus.queue(INGRESS_OF[self.orders[key][0]])

            def mine(m: Msg, mid: str = mid) -> bool:
                return str(m.props.get(ORIGINAL_ID_PROPERTY) or m.message_id) == mid

            # The lineage's verdict, as for the bad submissions (check 4): an
            # OrderConflict on any of its messages. A member dead-lettered
            # otherwise is explained when the broker did it (every delivery
            # faulted at settlement) or when the lineage went on in a later
            # copy (seed 5000218, 50 orders: the last delivery's schedule was
            # accepted with its answer lost, so the gate dead-lettered
            # RetriesExhausted, and the next copy but one was the conflict).
            dead = [m for m in ingress.dead if mine(m)]
            if any(m.dead_letter_reason == "OrderConflict" for m in dead):
                continue
            unexplained = [
                m
                for m in dead
                if not self.bus.every_delivery_faulted(m)  # the broker's verdict
                and not any(later_copy(m, c) for c in ingress.sent)
            ]
            if unexplained:
                self.fail(
                    "a changed resend of a Rejected order is a conflict",
                    f"{mid} ({key}) dead-lettered {unexplained[0].dead_letter_reason}, "
                    "not OrderConflict",
                )
                break
            broker = any(self.bus.every_delivery_faulted(m) for m in dead)
            if not broker and not any(mine(m) for m in ingress.messages):
                self.fail(
                    "a changed resend of a Rejected order is a conflict",
                    f"{mid} ({key}, Total changed) was completed as if valid",
                )
                break

    def _impersonate(self) -> None:
        """The second application's client sends an order in the first's
        name (its AppId) with its own reply queue, on its own ingress queue."""
        victim, sender = APPS
        payload = json.loads(self._order_body(self.order_ids[0]))
        payload.update(OrderID=f"ORD-{self.seed}-IMP", AppId=victim, ReplyTo=REGISTRY[sender])
        self.bus.send(INGRESS_OF[sender], json.dumps(payload).encode(), IMPERSONATION)
        self.impersonated = True

    def _check_impersonation(self) -> None:
        victim, sender = APPS
        key = order_key(victim, f"ORD-{self.seed}-IMP")
        if (key, key) in self.state_c.docs or (key, key) in self.orders_c.docs:
            self.fail(
                "an application cannot order in another's name",
                f"{sender}'s client created {key} with a body naming AppId {victim}",
            )
            return
        ingress = self.bus.queue(INGRESS_OF[sender])

        def mine(m: Msg) -> bool:
            return str(m.props.get(ORIGINAL_ID_PROPERTY) or m.message_id) == IMPERSONATION

        if not any(mine(m) for m in ingress.dead) and not any(mine(m) for m in ingress.messages):
            self.fail(
                "an application cannot order in another's name",
                f"{IMPERSONATION} on {ingress.name} completed as if valid",
            )

    def _pump(self, queue: str) -> None:
        while True:
            if queue == "agent-requests" and any(w.takes() for w in self.workers):
                break  # left to a running standalone worker, which receives it
            msg = self.bus.receivable(queue)
            if msg is None:
                break
            delivery = Delivery(self.bus, queue, msg)
            self.world.log(f"deliver {queue} {msg.message_id} #{msg.delivery_count}")
            faults = self.world.faults
            if faults.draw(self.o.faults.lock_expiry, "lock_expiry", f"{queue} {msg.message_id}"):
                token = msg.lock_token
                self.world.at(
                    self.world.clock.now
                    + timedelta(seconds=round(self.world.rng.uniform(0.01, 1.0), 3)),
                    "lock expiry",
                    lambda m=msg, t=token, q=queue: (
                        self.bus.release(q, m, t, "lock expired"),
                        self._pump(q),
                    ),
                )

            def lost(m=msg, t=msg.lock_token, q=queue) -> None:
                if t is not None:
                    self.unfinished.add(t)
                when = self.world.clock.now + timedelta(seconds=30)
                self.world.at(
                    when,
                    "lock timeout",
                    lambda: (self.bus.release(q, m, t, "lock timed out"), self._pump(q)),
                )

            self.world.spawn(
                f"{self._consumer_name(queue)}:{msg.message_id}",
                lambda d=delivery: self._handle(d),
                on_crash=lost,
            )

    def _consumer_name(self, queue: str) -> str:
        if queue in APP_OF_INGRESS:
            return "submit"
        return {"agent-requests": "agent", "agent-responses": "bridge"}[queue]

    async def _handle(self, d: Delivery) -> None:
        self._pick_host()
        HANDLING.set(d.token)  # this task's: the back-off copies it schedules name it
        if d.token is not None:
            origin = (d.application_properties or {}).get(ORIGINAL_ID_PROPERTY) or d.message_id
            lineage = f"{d.queue} {origin}"
            self.delivery_of[d.token] = (lineage, self.world.clock.now)
            self.lineage_starts.setdefault(lineage, []).append(self.world.clock.now)
        try:
            if d.queue == "agent-requests":
                # As the trigger hands it over: the received message (its
                # body, delivery count, sequence number and properties).
                await self._agent_request(d, self.host.processor, _agent_settlement(d))
            elif d.queue == "agent-responses":
                await self.app.on_reply(d, SimActions(d), self.durable)
            elif d.queue in APP_OF_INGRESS:
                # Submit's function body (triggers/submit.py): its durable client
                # binding cannot be passed in-process, so the use case runs with
                # the simulation's Durable as the client (the fast path). The
                # application is the one whose ingress queue it came on.
                handler = await self.app.submit_handler()
                gate = await self.app.message_gate(d.queue)
                app = APP_OF_INGRESS[d.queue]
                await gate.run(
                    d, SimActions(d), lambda body: handler.handle(body, app, self.durable)
                )
            else:
                spec = self.functions[d.queue]
                kwargs = {spec.trigger["name"]: d}
                for name, annotation in spec.params.items():
                    if "MessageActions" in str(annotation):
                        kwargs[name] = SimActions(d)
                await call_function(spec, kwargs)
        except Crash:
            raise
        except Exception:
            # The host: a function that raised leaves the message to its lock
            # (abandon); a settlement on a lost lock raised on its own.
            self.bus.release(d.queue, d.msg, d.token, "function raised")
            raise
        finally:
            self.world.at(self.world.clock.now, "pump", lambda: self._pump(d.queue))

    async def _agent_request(self, d: Delivery, processor: Any, settlement: Any) -> Any:
        """One agent request handled by `processor` (the Functions agent's
        or a standalone worker's), with the per-request checks around it."""
        HANDLING.set(d.token)  # a standalone worker's delivery too
        # A forgery's deadline is its own (so is a delayed copy of one).
        origin = (d.application_properties or {}).get(ORIGINAL_ID_PROPERTY)
        task = asyncio.current_task()
        if not str(origin or d.message_id).startswith(FORGED):
            self._check_deadline(d)
            self._check_identity(d)
            self._request_limit[task] = _call_limit(d.body)
        try:
            return await processor.process_message(d, settlement)
        finally:
            self._request_limit.pop(task, None)

    def _check_identity(self, d: Delivery) -> None:
        """A real request carries its attempt as the fencing token and the
        idempotency key `{order key}/{step}`, the same for every attempt and
        for do and undo (DESIGN.md section 4, fencing)."""
        try:
            req = json.loads(d.body)
            _, _, attempt = str(req["InstanceId"]).rpartition(":")
            wanted = (int(attempt), f"{req['OrderID']}/{req['Step']}")
        except (ValueError, TypeError, KeyError):
            return
        got = (req.get("FencingToken"), req.get("IdempotencyKey"))
        if got != wanted:
            self.bad_identity.append(
                f"{d.message_id}: FencingToken {got[0]!r}, IdempotencyKey {got[1]!r}; "
                f"the attempt and order step say {wanted[0]}, {wanted[1]!r}"
            )

    def _check_deadline(self, d: Delivery) -> None:
        """Defect-7 check: the agent's deadline is the record's CompleteBy for that step."""
        try:
            req = json.loads(d.body)
        except ValueError:
            return
        if req.get("Action") != "do":
            return
        doc = self.state_c.docs.get((req["OrderID"], req["OrderID"]))
        if (
            not doc
            or doc.get("LockedBy") != req["InstanceId"]
            or doc.get("ProcessState") != "Processing"
        ):
            return
        step = (doc.get("Steps") or {}).get(req["Step"]) or {}
        deadline = datetime.fromisoformat(req["Deadline"])
        complete_by = doc.get("CompleteBy")
        if (
            complete_by
            and step.get("Status") == "Running"
            and datetime.fromisoformat(complete_by) != deadline
        ):
            self.deadline_mismatch.append(
                f"{req['InstanceId']} {req['Step']}: request deadline {deadline.isoformat()} but record "
                f"CompleteBy {complete_by}"
            )

    def _on_index_write(self, old: dict | None, new: dict) -> None:
        try:
            key = (str(new["OrderID"]), int(new["Attempt"]))
            at = datetime.fromisoformat(new["CompleteBy"])
        except (KeyError, TypeError, ValueError):
            return  # garbage (foreign_docs): the product's to skip
        if key not in self.first_entry or at < self.first_entry[key]:
            self.first_entry[key] = at

    def _check_index_entry(self, old: dict | None, new: dict) -> None:
        """The recovery index holds an entry of each attempt at or before its
        deadline (up to the skew of the clocks that wrote the two), so the
        Supervisor visits the attempt when it expires, not later."""
        if not old or new.get("ProcessState") != "Processing" or not new.get("CompleteBy"):
            return
        if old.get("LockedBy") != new.get("LockedBy") or old.get("ProcessState") != "Processing":
            return  # the claim itself: its entry may be written just after
        first = self.first_entry.get((str(new.get("id")), int(new.get("Attempt") or 0)))
        due = datetime.fromisoformat(new["CompleteBy"])
        if first is not None and first > due + timedelta(seconds=2 * self.o.faults.skew + 0.001):
            self.index_entry_late.append(
                f"{new.get('id')} attempt {new.get('Attempt')}: CompleteBy {new['CompleteBy']} "
                f"but its first index entry is at {first.isoformat()}"
            )

    def _check_step_deadline(self, old: dict | None, new: dict) -> None:
        """Each step gets its own deadline (DESIGN.md section 4): a write that
        starts a step gives it a CompleteBy later than that of every step the
        same attempt started before it (a step that reuses the previous step's
        deadline times out while its agent still has time)."""
        if not old or new.get("ProcessState") != "Processing":
            return
        steps, before = new.get("Steps") or {}, old.get("Steps") or {}
        for name, step in steps.items():
            started = step.get("StartedAt")
            if step.get("Status") != "Running" or not started:
                continue
            if started == (before.get(name) or {}).get("StartedAt") or not step.get("CompleteBy"):
                continue  # not started by this write
            due = datetime.fromisoformat(step["CompleteBy"])
            for other, prior in steps.items():
                if (
                    other != name
                    and prior.get("Attempt") == step.get("Attempt")
                    and prior.get("StartedAt")
                    and prior.get("CompleteBy")
                    and datetime.fromisoformat(prior["StartedAt"]) < datetime.fromisoformat(started)
                    and datetime.fromisoformat(prior["CompleteBy"]) >= due
                ):
                    self.step_deadline_reused.append(
                        f"{new.get('id')} attempt {step.get('Attempt')}: step {name} started "
                        f"{started} with CompleteBy {step['CompleteBy']}, not after step "
                        f"{other}'s {prior['CompleteBy']}"
                    )

    # --- documents this version did not write
    def _foreign_documents(self, until: datetime) -> None:
        """Garbage a portal edit or another program leaves: a Compensating and a
        long-expired Processing document with values no version writes (the
        latter also in the recovery index), and a malformed index entry; and, at
        random moments, a newer version's write adding a field this version does
        not know to a live record, which must survive this version's writes."""
        w = self.world
        past = START - timedelta(minutes=5)
        self.junk = [f"JUNK-{self.seed}-c", f"JUNK-{self.seed}-p"]
        garbage = [
            {"id": self.junk[0], "ProcessState": "Compensating", "LockedBy": "x:1", "Attempt": "1"},
            {
                "id": self.junk[1],
                "ProcessState": "Processing",
                "LockedBy": f"{self.junk[1]}:1",
                "CompleteBy": _cosmos(past.isoformat()),
                "Attempt": 1,
                "FailureCount": None,
            },
        ]
        for doc in garbage:
            self.state_c.docs[(doc["id"], doc["id"])] = self.state_c._stamp(doc)
        at = past.astimezone(UTC).isoformat()
        for doc in (
            {
                "id": entry_id(self.junk[1], past),
                "bucket": bucket_of(past),
                "OrderID": self.junk[1],
                "CompleteBy": at,
                "Attempt": 1,
            },
            {"id": "junk-entry", "bucket": bucket_of(past), "OrderID": 7, "CompleteBy": "soon"},
        ):
            self.index_c.docs[(doc["bucket"], doc["id"])] = self.index_c._stamp(doc)
        if self.o.scan == "index":
            self.junk.append("recoveryIndex/junk-entry")

        def newer_version_write() -> None:
            live = [
                key
                for key, doc in self.state_c.docs.items()
                if doc.get("ProcessState") in ("Pending", "Processing")
                and key[0] not in self.junk
                and "NewerVersionField" not in doc
            ]
            if not live:
                return
            key = w.data_rng.choice(sorted(live))
            doc = dict(self.state_c.docs[key])
            doc["NewerVersionField"] = {"Since": "3.0", "Value": key[0]}
            self.state_c.previous[key] = self.state_c.docs[key]
            self.state_c.docs[key] = self.state_c._stamp(doc)
            self.newer_fields.add(key[0])
            w.log(f"foreign write: NewerVersionField on {key[0]}")

        for _ in range(3):
            when = START + timedelta(seconds=w.data_rng.uniform(0, (until - START).total_seconds()))
            w.at(when, "newer version write", newer_version_write)

    def _fallible_world(self, fault_end: datetime) -> None:
        """The fallible world's setup (issue 21): a Cosmos outage window, and
        a host instance starting (scale-out or restart) that creates its
        containers as bootstrap does on the local stack, retrying its start
        as the Functions host restarts a worker that failed to start."""
        w, f = self.world, self.o.faults
        if f.cosmos_outage and w.faults.draw(1.0, "cosmos_outage"):
            # Now and then from the start: the hosts come up during the outage.
            early = w.data_rng.random() < 0.3
            s = START + timedelta(
                seconds=0.0 if early else w.data_rng.uniform(0, self.o.fault_window - 60)
            )
            w.faults.cosmos.begin(s, w.data_rng.uniform(5, 60))
        for _ in range(f.cosmos_blips):
            if w.faults.draw(1.0, "cosmos_blip"):
                at_call = w.data_rng.randint(1, 600)
                w.faults.cosmos.blips[at_call] = round(w.data_rng.uniform(0.5, 3), 3)
        # Service Bus outages, each from a bus call on (its own stream: the
        # other draws of the seed stay where they were).
        blips = random.Random(f"bus-blips/{self.seed}")
        for _ in range(f.bus_blips):
            if w.faults.draw(1.0, "bus_outage"):
                w.faults.bus.blips[blips.randint(1, 400 * self.o.orders)] = round(
                    blips.uniform(1, 8), 3
                )
        # Full queues, each on one queue the product sends to, from a stream
        # of their own (the faults' draw keeps them droppable when shrinking).
        full = random.Random(f"entity-full/windows/{self.seed}")
        queues = sorted(
            {
                ALERTS_QUEUE,
                AGENT_REQUESTS_QUEUE,
                AGENT_RESPONSES_QUEUE,
                *REGISTRY.values(),
                *INGRESS_OF.values(),
            }
        )
        for _ in range(f.entity_full):
            queue = full.choice(queues)
            start = START + timedelta(seconds=full.uniform(0, self.o.fault_window - 20))
            seconds = round(full.uniform(20, 240), 3)
            if w.faults.draw(1.0, "entity_full", f"{queue} for {seconds}s"):
                w.faults.full.setdefault(queue, Outages(f"queue {queue} full")).begin(
                    start, seconds
                )
                w.log(f"queue {queue} full for {seconds}s from {start.isoformat()}")
        if not f.host_start:
            return

        async def start(tries: int = 20) -> None:
            from adapters.cosmos_client import ensure_orders_container, ensure_state_container
            from adapters.recovery_index import ensure_index_container, ensure_shard_count

            cfg = self.settings
            client = SimCosmosClient(
                w,
                {
                    cfg.state_container: self.state_c,
                    cfg.orders_container: self.orders_c,
                    cfg.recovery_index_container: self.index_c,
                },
            )
            for _ in range(tries):
                try:
                    await ensure_state_container(client, cfg.state_database, cfg.state_container)  # type: ignore[arg-type]
                    await ensure_orders_container(client, cfg.orders_database, cfg.orders_container)  # type: ignore[arg-type]
                    index = await ensure_index_container(
                        client,  # type: ignore[arg-type]
                        cfg.state_database,
                        cfg.recovery_index_container,
                    )
                    if self.o.scan == "index":
                        # As bootstrap does, before any entry is written or
                        # read: the container's shard count, recorded by the
                        # first process (a `~config` document in the index).
                        await ensure_shard_count(index, self.index_shards)  # type: ignore[arg-type]
                    w.log("host started")
                    return
                except Exception as exc:  # noqa: BLE001 - the host logs a failed start and restarts
                    w.log(f"host start failed: {type(exc).__name__}: {str(exc)[:120]}")
                    await w.point("host restart", delay=5.0)

        first = START + timedelta(seconds=w.data_rng.uniform(0, 60))
        w.at(first, "host start", lambda: w.spawn("host", start))
        # A scale-out adds instances together: now and then a second starts
        # within the first's seconds, so both set up the containers at once
        # (the shard count's create race, a read of a `~config` document
        # created moments ago). Its own stream, so the seed's other draws stay.
        pair = random.Random(f"host-starts/{self.seed}")
        if pair.random() < 0.3:
            second = first + timedelta(seconds=round(pair.uniform(0, 3), 3))
            w.at(second, "host start", lambda: w.spawn("host-2", start))

    async def _console_look(self, action: str) -> None:
        """What an operator reads in the console before acting (the fallible
        world): one page of the orders in the state the action is for."""
        from adapters.console_reads import ConsoleReads

        state = {"resubmit": "Error", "compensate": "Processing"}[action]
        rows, _ = await ConsoleReads(self.state_c).list_orders(state, 20)
        self.world.log(f"operator console: {len(rows)} {state}")

    async def _starter_run(self) -> None:
        if self.world.clock.now < self.lease_free_at:
            return  # no host holds the singleton lock yet (_restart_host)
        _HOST.set(self.singleton)
        await self.host.starter.run(self.durable)

    async def _supervisor_run(self) -> None:
        if self.world.clock.now < self.lease_free_at:
            return
        _HOST.set(self.singleton)
        spec = next(s for s in self.catalog.of_type("timerTrigger") if s.name == "supervisor")
        await call_function(spec, {spec.trigger["name"]: None})

    async def _operator(self, oid: str, action: str, tries: int = 6) -> None:
        """An operator acts at a random moment; one who is refused (the order
        is not in a state the action applies to yet) looks again a minute later."""
        now = self.world.now_for("operator")()
        transition = {
            "resubmit": lambda r: sm.resubmit(r, now),
            "compensate": lambda r: sm.request_compensation(r, now),
        }[action]
        history = self._operator_entries(oid, action)
        try:
            if self.o.faults.host_start:
                await self._console_look(action)
            await self.store.update(oid, transition, ANY_OWNER)
            self.world.log(f"operator {action} {oid}")
            self.operator_done.add((oid, action))
        except (sm.IllegalTransition, DomainError) as exc:
            if self._operator_entries(oid, action) > history:
                # The write was applied and its answer lost (the fallible
                # world): the action took effect though the operator saw an error.
                self.world.log(f"operator {action} {oid} applied, answer lost")
                self.operator_done.add((oid, action))
                return
            self.world.log(f"operator {action} {oid} refused: {type(exc).__name__}")
            if tries > 1:
                self.operator_pending += 1
                self.world.at(
                    self.world.clock.now + timedelta(seconds=60),
                    "operator",
                    lambda: self.world.spawn(
                        f"operator:{oid}", lambda: self._operator(oid, action, tries - 1)
                    ),
                )
        finally:
            self.operator_pending -= 1

    def _operator_entries(self, oid: str, action: str) -> int:
        """How many History entries of the record an operator's `action` wrote
        (more after a refusal: its write landed, the answer was lost)."""
        entries = (self.state_c.docs.get((oid, oid)) or {}).get("History") or []
        reason = {"resubmit": "resubmitted", "compensate": "compensation requested"}[action]
        return sum(1 for e in entries if e.get("By") == "operator" and e.get("Reason") == reason)

    def _ticks(self, name: str, period: float, fn, until: datetime, copies: int = 1) -> None:
        """A timer trigger: every `period`; after the host was down, it fires
        once on return and goes on from there (as a missed timer does)."""

        def tick(t: datetime) -> None:
            for c in range(copies):
                self.world.spawn(f"{name}{c}", fn)
            nxt = max(t + timedelta(seconds=period), self.world.clock.now)
            if nxt <= self.until:
                self.world.at(nxt, name, lambda: tick(nxt))

        first = START + timedelta(seconds=self.world.data_rng.uniform(0, period))
        self.world.at(first, name, lambda: tick(first))

    # --- the schedule
    def idle(self) -> bool:
        if len(self.submitted) < len(self.order_ids) or self.operator_pending:
            return False
        if self.o.impersonation and not self.impersonated:
            return False  # the impersonator's order is still to come
        if self._junk_unalerted():
            return False  # a bad document is not done with until an operator hears of it
        if self.hostile is not None and self.hostile.pending:
            return False  # a forgery still to come: it may arrive after every order ended
        for oid in self.order_ids:
            doc = self.state_c.docs.get((oid, oid))
            if doc is None:
                app, own = self.orders[oid]
                if any(
                    m.message_id.startswith(oid) or own.encode() in m.body
                    for m in self.bus.queue(INGRESS_OF[app]).messages
                ):
                    return False
                continue
            if doc["ProcessState"] not in TERMINAL_STATUS or (
                doc.get("CompensationRequested")
                and doc["ProcessState"] in ("Error", "CompensationFailed")
            ):
                return False
            if doc.get("PendingStatus"):
                return False  # a terminal status still in the outbox: the Starter delivers it
        return self._quiet()

    def _junk_unalerted(self) -> list[str]:
        if not self.junk:
            return []
        said = " ".join(
            json.loads(m.body).get("Reason") or ""
            for m in self.bus.queue("alerts").sent
            if b"UnreadableRecord" in m.body
        )
        return [junk for junk in self.junk if junk not in said]

    def _quiet(self) -> bool:
        for q in (*APP_OF_INGRESS, "agent-requests", "agent-responses"):
            if self.bus.queue(q).messages:
                return False
        return not any(i.status in ("Pending", "Running") for i in self.durable.instances.values())

    def fixed_point(self) -> bool:
        """Nothing can change any more: no message, instance or operator is
        pending, no write happened for three Supervisor periods, and every
        deadline in the store (CompleteBy, NotBefore) passed long enough ago for
        the Starter and the Supervisor to have acted on it. Then waiting out the
        rest of the liveness bound would only repeat the same empty runs."""
        if len(self.submitted) < len(self.order_ids) or self.operator_pending or not self._quiet():
            return False
        now = self.world.clock.now
        settle = timedelta(seconds=3 * SUPERVISOR_PERIOD + STARTER_PERIOD) + SLACK
        if self.last_write is not None and now - self.last_write < settle:
            return False
        if now - max(self.faults_stopped, self.lease_free_at) < settle:
            # Until faults stop, a Starter or Supervisor run may fail on every
            # try (a Cosmos outage, 503s): a deadline long past proves nothing.
            # Nor while no host holds the singleton lock (a lease lost just
            # before faults stop outlasts them): no Starter or Supervisor runs
            # at all (seed 2004759, one order: the Failed status and its alert
            # stayed in the outbox until the lease came back, 41 s after
            # faults stopped, and the schedule was called done before the
            # Starter's next run).
            return False
        for doc in self.state_c.docs.values():
            for name in ("CompleteBy", "NotBefore"):
                if doc.get(name) and datetime.fromisoformat(doc[name]) + settle > now:
                    return False
            pending = doc.get("PendingStatus")
            if pending and datetime.fromisoformat(pending["At"]) + STATUS_GRACE + settle > now:
                return False
        # The index Supervisor works through its entries a page per run: while
        # one of a Processing record is left, it still has work (a small page
        # and many entries can take longer than the settle time).
        for entry in self.index_c.docs.values():
            # Not every document is an entry: the shard-count document
            # (`~config`, ensure_shard_count), garbage (foreign_docs).
            oid = entry.get("OrderID")
            doc = self.state_c.docs.get((oid, oid)) if isinstance(oid, str) else None
            if doc and doc.get("ProcessState") == "Processing":
                return False
        return True

    def _previous_version_wrote(self) -> None:
        """What the previous version's Submit left for a legacy order: its
        order and a Pending record under the bare OrderID, Received sent."""
        from adapters.orders_db import to_document as order_document
        from adapters.state_store import to_document as state_document
        from domain.models import OrderSubmitted

        for key in self.legacy:
            order = OrderSubmitted.model_validate_json(self._order_body(key))
            record = sm.mark_received_sent(
                sm.new_record(order, START, list(self.o.steps.names), key), START
            )
            self.orders_c.docs[(key, key)] = self.orders_c._stamp(order_document(order, key))
            self.state_c.docs[(key, key)] = self.state_c._stamp(state_document(record))

    async def run(self) -> None:
        w, o = self.world, self.o
        f = o.faults
        self._previous_version_wrote()
        fault_end = START + timedelta(seconds=o.fault_window)
        self.bound = liveness_bound(o)
        end = fault_end + self.bound
        if f.host_outage and w.faults.draw(1.0, "host_outage"):
            # The whole app is down for 8 days (a region outage, a lost
            # deployment): nothing runs, then everything resumes at once.
            at = START + timedelta(seconds=w.data_rng.uniform(30, 120))
            w.at(
                at,
                "host outage",
                lambda: (
                    setattr(w.clock, "now", w.clock.now + HOST_OUTAGE),
                    w.log(f"host back after {HOST_OUTAGE}"),
                ),
            )
            end += HOST_OUTAGE
        # Host restarts, from a stream of their own (dropping one moves no other).
        restarts = random.Random(f"hosts/restarts/{self.seed}")
        for _ in range(f.host_restarts):
            when = START + timedelta(seconds=restarts.uniform(0, o.fault_window))
            k = restarts.randrange(len(self.hosts))
            if w.faults.draw(1.0, "host_restart", f"host {k}"):
                w.at(when, "host restart", lambda k=k: self._restart_host(k))
        # Lost leases of the singleton lock, from a stream of their own.
        pauses = random.Random(f"lease/pauses/{self.seed}")
        for _ in range(o.lease_pauses):
            when = START + timedelta(seconds=pauses.uniform(0, o.fault_window))
            length = round(pauses.uniform(15, 45), 3)
            w.at(when, "lease lost", lambda length=length: self._lease_lost(length))
        self.until = end
        if self.hostile is not None:
            self.hostile.install()
        for worker in self.workers:
            worker.install(START)
        for i, oid in enumerate(self.order_ids):
            at = w.data_rng.uniform(0, 3 if f.burst else 60)
            if f.minute_edges:
                at = (
                    60 * (i % 3 + 1)
                    - w.data_rng.uniform(0.001, 1.0)
                    - o.step_timeout.total_seconds() % 60
                )
            w.at(
                START + timedelta(seconds=at),
                "client",
                lambda oid=oid: (
                    self.submitted.add(oid),
                    # The client's message id is its OrderID (docs/client-guide.md).
                    self.bus.send(
                        INGRESS_OF[self.orders[oid][0]], self._order_body(oid), self.orders[oid][1]
                    ),
                ),
            )
            if w.faults.draw(f.resend, "resend", oid):
                later = at + w.data_rng.uniform(1, o.fault_window + 300)
                # The schedule waits for it, as for an operator: a resend after
                # the order's terminal state, when every other actor is quiet, is
                # one of the moments a client resends (issue 21), and ending the
                # schedule at that quiet dropped it.
                self.operator_pending += 1

                def resend(oid: str = oid) -> None:
                    self.operator_pending -= 1
                    self._resend(oid)

                w.at(START + timedelta(seconds=later), "client resend", resend)
            if i == 0 and o.impersonation:
                w.at(
                    START
                    + timedelta(
                        seconds=random.Random(f"impersonate/at/{self.seed}").uniform(0, 60)
                    ),
                    "impersonator",
                    self._impersonate,
                )
            if w.faults.draw(f.bad_messages, "bad_message", oid):
                w.at(
                    START + timedelta(seconds=at + w.data_rng.uniform(0, 30)),
                    "client",
                    lambda oid=oid: self._bad_message(oid),
                )
            if w.faults.draw(f.operator, "operator", oid):
                when = START + timedelta(seconds=w.data_rng.uniform(0, o.fault_window))
                action = w.data_rng.choice(("resubmit", "compensate"))
                self.operator_pending += 1
                w.at(
                    when,
                    "operator",
                    lambda oid=oid, a=action: w.spawn(
                        f"operator:{oid}", lambda: self._operator(oid, a)
                    ),
                )
        if f.throttle_storm and w.faults.draw(1.0, "throttle_storm"):
            s = START + timedelta(seconds=w.data_rng.uniform(0, o.fault_window - 90))
            w.faults.storms.append((s, s + timedelta(seconds=w.data_rng.uniform(30, 90))))
        for _ in range(f.throttle_bursts):
            if w.faults.draw(1.0, "throttle_burst"):
                s = START + timedelta(seconds=w.data_rng.uniform(0, o.fault_window))
                w.faults.storms.append((s, s + timedelta(seconds=w.data_rng.uniform(2, 6))))
        if f.outage and w.faults.draw(1.0, "outage"):
            s = START + timedelta(seconds=w.data_rng.uniform(0, 30))
            length = o.fault_window - 31
            w.faults.outage = (
                s,
                s + timedelta(seconds=length),
                w.data_rng.choice(self.o.steps.services),
            )
        if f.foreign_docs and w.faults.draw(1.0, "foreign_docs"):
            self._foreign_documents(fault_end)
        self._fallible_world(fault_end)
        self._ticks("starter", STARTER_PERIOD, self._starter_run, end)
        self._ticks(
            "supervisor",
            SUPERVISOR_PERIOD,
            self._supervisor_run,
            end,
            copies=2 if f.two_supervisors and w.faults.draw(1.0, "two_supervisors") else 1,
        )
        consumed = (*APP_OF_INGRESS, "agent-requests", "agent-responses")
        self.bus.after_send = lambda q, when: (
            w.at(when, "pump", lambda: self._pump(q)) if q in consumed else None
        )
        await w.run(fault_end, idle=self.idle)
        # Faults stop here; from now on the world may also stop early at a fixed point.
        w.faults.active = False
        self.faults_stopped = w.clock.now
        w.log("faults stop")
        await w.run(end, idle=lambda: self.idle() or self.fixed_point())
        # let actors still parked finish (no new ticks matter past the end)
        self.end = w.clock.now
        self.check()

    # --- checks
    def _statuses(self) -> dict[str, list[dict]]:
        """Statuses by order key, each read from its application's reply queue
        (a status names the client's OrderID only: the queue names the app)."""
        out: dict[str, list[dict]] = {}
        for app, queue in REGISTRY.items():
            for m in self.bus.queue(queue).sent:
                body = json.loads(m.body)
                key = self.key_of.get((app, body["OrderID"]), order_key(app, body["OrderID"]))
                out.setdefault(key, []).append({"Status": body["Status"], "id": m.message_id})
        return out

    def _alerted(self) -> set[str | None]:
        """Orders an alert named; an alert about a forgery that named an order
        is not an alert about that order's fate (sim.hostile checks those)."""
        bodies = (json.loads(m.body) for m in self.bus.queue("alerts").sent)
        return {b.get("OrderID") for b in bodies if b.get("Kind") not in FORGERY_ALERTS}

    def fail(self, check: str, detail: str) -> None:
        self.violations.append((check, detail))

    def check(self) -> None:
        statuses = self._statuses()
        alerted = self._alerted()
        docs = {oid: self.state_c.docs.get((oid, oid)) for oid in self.order_ids}
        # index entries that outlive their attempt unseen
        if self.o.scan == "index":
            for (_, _), entry in sorted(self.index_c.docs.items()):
                if not isinstance(entry.get("OrderID"), str):
                    continue  # not an entry: the shard-count document, garbage
                doc = docs.get(entry["OrderID"])
                if (
                    doc
                    and doc["ProcessState"] == "Processing"
                    and doc.get("CompleteBy") == _cosmos(entry["CompleteBy"])
                    and datetime.fromisoformat(entry["CompleteBy"])
                    < self.end - timedelta(seconds=3 * SUPERVISOR_PERIOD) - SLACK
                ):
                    self.fail(
                        "index entry outlived its attempt unseen",
                        f"{entry['id']} (bucket {entry['bucket']}) never recovered",
                    )
        for detail in self.live_entry_deleted[:1]:
            self.fail("index entry of a live attempt kept", detail)
        for detail in self.cursor_passed[:1]:
            self.fail("the index cursor never passes a live attempt's entry", detail)
        # 8 liveness
        for oid, doc in docs.items():
            if doc is None:
                ingress = self.bus.queue(INGRESS_OF[self.orders[oid][0]])
                client_id = self.orders[oid][1]
                # The original or a back-off copy of it (which names it): seeds
                # 700163 and 700179, 50 orders, whose copies ran out of retries
                # while the stores failed for minutes.
                dead = [
                    m
                    for m in ingress.dead
                    if client_id in (m.message_id, str(m.props.get(ORIGINAL_ID_PROPERTY) or ""))
                ]
                # Service Bus's own MaxDeliveryCountExceeded on a message whose
                # every delivery a fault ended (crash, lock expiry, a failed
                # settlement, an abandon forced by its next copy's refused
                # send) left no handler to alert: the platform's dead-letter
                # rule reports it (infra/app/alerts.bicep), and an order never
                # accepted gets no status (seed 4004254, two orders; the
                # other dead-letter checks excuse the same case); and the
                # gate's last resort, its alert and copy both refused (seed 2).
                judged = [m for m in dead if not self._unfinished_dead_letter(ingress.name, m)]
                if dead and not judged:
                    continue
                dead = judged
                if dead:
                    # The alert names the order by its key, or (a message the
                    # handler could not take apart) by the OrderID it carried.
                    # An order the gate gave up on (RetriesExhausted: a transient
                    # failure outlasted the back-off) was never accepted: the
                    # client gets no status for it, the operators the alert
                    # (docs/client-guide.md, "When an order is refused").
                    given_up = any(m.dead_letter_reason == "RetriesExhausted" for m in dead)
                    if not ({oid, client_id} & alerted) or not (given_up or statuses.get(oid)):
                        self.fail(
                            "dead-lettered silently",
                            f"{oid}: {dead[0].dead_letter_reason}, alert={bool({oid, client_id} & alerted)}, "
                            f"statuses={[s['Status'] for s in statuses.get(oid, [])]}",
                        )
                elif any(m.message_id == client_id for m in ingress.sent):
                    self.fail(
                        "liveness", f"{oid}: submitted but no record after the bound {self.bound}"
                    )
                continue
            state = doc["ProcessState"]
            if state not in TERMINAL_STATUS:
                self.fail(
                    "liveness",
                    f"{oid} still {state} (FailureCount {doc.get('FailureCount')}) at "
                    f"{self.world.stamp()}: nothing changes any more, and the bound is "
                    f"{self.bound} after faults stop",
                )
                continue
            want = TERMINAL_STATUS[state]
            got = [s for s in statuses.get(oid, []) if s["Status"] == want]
            ids = sorted({s["id"] for s in got})
            if len(ids) > 1 and not any(o == oid for o, _ in self.operator_done):
                self.fail(
                    "terminal status sent once (one message id)", f"{oid}: {want} sent as {ids}"
                )
            if not got and not (state == "Rejected" and self._ended_in_dead_letters(oid)):
                self.fail(
                    "terminal status reaches the reply queue",
                    f"{oid} is {state} but no {want} status was sent "
                    f"(sent: {[s['Status'] for s in statuses.get(oid, [])]})",
                )
        # 5 bounded retries
        for oid, doc in docs.items():
            if doc and doc.get("FailureCount", 0) > self.o.retry.max_failures:
                self.fail(
                    "5 FailureCount bounded",
                    f"{oid}: {doc['FailureCount']} > {self.o.retry.max_failures}",
                )
        # 2 no side effect twice
        for key, count in sorted(self.remote.ledger.effects.items()):
            if count > 1:
                self.fail("2 side effect applied once", f"{key} applied {count} times")
        # 7 side effects kept / undone / named with an alert
        net: Counter[tuple[str, str]] = Counter()
        for key, count in self.remote.ledger.effects.items():
            order, step, op = key.split("|")
            forward = op in self.o.steps.do_paths
            net[(order, step)] += count if forward else -count
        for (order, step), n in sorted(net.items()):
            if n <= 0:
                continue
            doc = docs.get(order)
            state = doc["ProcessState"] if doc else None
            if state == "Processed" or state not in TERMINAL_STATUS:
                continue
            if state == "Compensated":
                self.fail(
                    "7 side effects undone by compensation",
                    f"{order}: {step} still applied on a Compensated order",
                )
            elif state in ("Error", "CompensationFailed"):
                named = (
                    step in (doc.get("Steps") or {})
                    and (doc["Steps"][step].get("Status") != "NotStarted")
                ) or any(c.get("Step") == step for c in doc.get("Compensation") or [])
                if not named or order not in alerted:
                    self.fail(
                        "7 side effect named on the record with an alert",
                        f"{order}: {step} applied; named={named} alerted={order in alerted}",
                    )
            else:
                self.fail(
                    "7 side effects kept only by Processed",
                    f"{order}: {step} applied, order {state}",
                )
        # a permanent answer is never asked again by a later attempt (defect 3)
        permanent = {}
        for key, op, token, outcome in self.remote.calls:
            resubmitted = (key.partition("/")[0], "resubmit") in self.operator_done
            if (key, op) in permanent and token > permanent[(key, op)] and not resubmitted:
                self.fail(
                    "permanent failure not retried",
                    f"{op} {key} answered permanently to attempt {permanent[(key, op)]}, "
                    f"called again by attempt {token}",
                )
                permanent[(key, op)] = 10**9
            if (
                outcome == "permanent"
                and op not in self.o.steps.undo_paths
                and self._acted_on(key.partition("/")[0], key.partition("/")[2], token)
            ):
                permanent.setdefault((key, op), token)
        for detail in self.lost_requests[:1]:
            self.fail("a restarted orchestration's requests are delivered", detail)
        for detail in self.lost_copies[:1]:
            self.fail("a failed delivery's back-off copy comes after it", detail)
        # A schedule without faults (about one seed in seven; forgeries
        # change nothing) ends every order Processed, unless admission control
        # may reject: a system that only ever ended orders Error (every reply
        # lost, say) would otherwise break no other check.
        if replace(self.o.faults, hostile=0) == FaultConfig() and self.o.backlog_limit > 0:
            for oid, doc in sorted(docs.items()):
                if not doc or doc.get("ProcessState") != "Processed":
                    state = doc.get("ProcessState") if doc else "no record"
                    self.fail("a fault-free schedule processes every order", f"{oid}: {state}")
                    break
        for detail in self.bad_identity[:1]:
            self.fail("a request carries its attempt's token and its step's key", detail)
        for detail in self.late_calls[:1]:
            self.fail("no call starts after its request's deadline", detail)
        # Compensation undoes in reverse order (DESIGN.md section 4): every
        # instance's first undo request of each step comes after the undo of
        # every later step, whatever was completed, failed or resumed.
        for iid, undone in sorted(self.undo_sent.items()):
            names = self.o.steps.names
            order = [names.index(s) for s in undone if s in names]
            if order != sorted(order, reverse=True):
                self.fail(
                    "compensation undoes in reverse order", f"{iid} undid {', '.join(undone)}"
                )
                break
        for detail in self.deadline_mismatch[:1]:
            self.fail("one deadline travels everywhere", detail)
        for detail in self.quit_early[:1]:
            self.fail("an attempt listens for its step's reply until the deadline", detail)
        for detail in self.step_deadline_reused[:1]:
            self.fail("each step gets its own deadline", detail)
        for detail in self.due_not_recovered[:1]:
            self.fail("a clean Supervisor pass recovers every due attempt", detail)
        for detail in self.index_not_visited[:1]:
            self.fail("an index run visits every due entry after its cursor", detail)
        self._check_undo_answers_heard()
        for detail in self.undo_unheard[:1]:
            self.fail("an undo hears every try's answer until its deadline", detail)
        for detail in self.index_entry_late[:1]:
            self.fail("an attempt's index entry is at or before its deadline", detail)
        for detail in self.durable.invalid_own_data[:1]:
            self.fail("the product's own writes are valid", detail)
        self._check_compensation_failed_is_true(docs)
        # An honest CompensationFailed tried every undo it did not finish: each
        # step the log leaves undone had an undo request sent for it.
        for oid, doc in sorted(docs.items()):
            if not doc or doc["ProcessState"] != "CompensationFailed":
                continue
            tried = {
                step
                for iid, steps in self.undo_sent.items()
                if iid.rpartition(":")[0] == oid
                for step in steps
            }
            untried = [
                c["Step"]
                for c in doc.get("Compensation") or []
                if c.get("Outcome") != "Done" and c["Step"] not in tried
            ]
            if untried:
                self.fail(
                    "CompensationFailed only after each undo was tried",
                    f"{oid}: no undo request was ever sent for {untried}",
                )
                break
        # rejected orders are not written to the orders DB
        for oid, doc in docs.items():
            if (
                doc
                and doc["ProcessState"] == "Rejected"
                and (oid, oid) in self.orders_c.docs
                and not self._orphaned(oid)
                and not self._ended_in_dead_letters(oid)
            ):
                self.fail("rejected order not kept", f"{oid} is Rejected but in the orders DB")
        # 6 supervisor cost bounded by its page size and page count, per run
        per_page = (
            4 * self.o.page_size + MAX_BUCKETS_PER_PAGE + 12
        )  # the index walks empty buckets too
        for cost, pages in self.supervisor_costs:
            if pages > self.settings.supervisor_max_pages or cost > per_page * pages:
                self.fail(
                    "6 supervisor cost bounded by page size",
                    f"a run made {cost} requests in {pages} pages > {per_page} per page "
                    f"(at most {self.settings.supervisor_max_pages} pages)",
                )
                break
        # no Starter or Supervisor run is stopped by one document it cannot read
        for name, exc in self.world.raised:
            if name.startswith(("starter", "supervisor")) and not isinstance(exc, TransientError):
                self.fail(
                    "no run is stopped by one bad document",
                    f"{name} raised {type(exc).__name__}: {str(exc)[:160]}",
                )
                break
        # a newer version's field survives this version's writes (tolerant reader)
        for oid in sorted(self.newer_fields):
            doc = self.state_c.docs.get((oid, oid))
            if doc is not None and "NewerVersionField" not in doc:
                self.fail("foreign fields are kept", f"{oid} lost NewerVersionField")
                break
        # every garbage document is named by an alert
        for junk in self._junk_unalerted()[:1]:
            self.fail("a bad document is alerted", f"{junk}: no UnreadableRecord alert")
        # one alert per incident: an alert raised again under its own stable id (a
        # retried outbox entry, a redelivered dead letter) must reach operators once
        # (an incident that lasts days may page again once a day: ALERT_REPEAT)
        sent_at: dict[str, list[datetime]] = {}
        for m in self.bus.queue("alerts").sent:
            sent_at.setdefault(m.message_id, []).append(m.visible_at)
        for mid, times in sorted(sent_at.items()):
            gaps = [b - a for a, b in itertools.pairwise(sorted(times))]
            if any(gap < ALERT_REPEAT for gap in gaps):
                self.fail(
                    "one alert per incident",
                    f"{mid} reached the alerts queue {len(times)} times within {ALERT_REPEAT}",
                )
                break
        if self.o.impersonation:
            self._check_impersonation()
        self._check_changed_resends()
        # A real reply (not a forgery, nor a delayed copy of one) that comes
        # too late (its instance gone) is completed, never retried into the
        # dead-letter queue; one whose instance still waits may end there only
        # as the gate's last resort (RetriesExhausted: its event could not be
        # raised on any delivery and no retry could be scheduled), or by the
        # broker when every delivery met an injected fault
        # (sim.bus.Bus.every_delivery_faulted).
        # The broker may also dead-letter (MaxDeliveryCountExceeded) a message
        # whose back-off copy the queue already accepted: the reply goes on in
        # that copy, and the dead letter is a leftover of its lineage (seed
        # 209, 50 orders: the copy's complete failed after it scheduled the
        # next copy, and its redeliveries met faults or a refused schedule).
        responses = self.bus.queue("agent-responses")
        for m in responses.dead:
            origin = str(m.props.get(ORIGINAL_ID_PROPERTY) or m.message_id)
            if origin.startswith(FORGED):
                continue
            said = m.dead_letter_description or ""
            # The bridge's own markers of an instance that is gone (a late reply).
            late = any(marker in said for marker in GONE_MARKERS)
            last_resort = m.dead_letter_reason == "RetriesExhausted" and not late
            carried_on = m.dead_letter_reason == "MaxDeliveryCountExceeded" and any(
                later_copy(m, c) for c in responses.sent
            )
            if not (last_resort or carried_on or self.bus.every_delivery_faulted(m)):
                self.fail(
                    "a real reply is never dead-lettered",
                    f"{m.message_id} {m.dead_letter_reason}"
                    + (" (its instance was gone: a late reply)" if late else "")
                    + f": {said}",
                )
                break
        # 4 every dead-lettered message has a reason; a bad submission is alerted, nothing overwritten
        kinds = Counter(json.loads(m.body).get("Kind") for m in self.bus.queue("alerts").sent)
        for q in self.bus.queues.values():
            for m in q.dead:
                if not m.dead_letter_reason:
                    self.fail("4 dead-lettered with a reason", f"{q.name} {m.message_id}")
        for mid, kind in sorted(self.bad.items()):
            oid = mid.split("/")[0]
            ingress = self.bus.queue(INGRESS_OF[self.orders[oid][0]])
            # The gate may carry a message on as a delayed copy, which names it.
            origin = {
                m.message_id: str(m.props.get(ORIGINAL_ID_PROPERTY) or m.message_id)
                for m in ingress.sent
            }
            dead = [m for m in ingress.dead if origin.get(m.message_id, m.message_id) == mid]
            # The lineage's verdict: the handler's dead letter on any of its
            # messages (the original or a back-off copy). A lineage can go on
            # past a member the broker dead-lettered once each of its
            # deliveries faulted at settlement, or once the gate had carried it
            # on in a later copy the queue accepted (its schedule's answer
            # lost, so the gate also abandoned the delivery), as the
            # forgeries' check allows (sim.hostile). Seed 700077, 50 orders:
            # retry/seq-156/2 MaxDeliveryCountExceeded while its copies went
            # on, and the last one, arriving before its original was written,
            # was accepted as the order.
            verdicts = [m for m in dead if m.dead_letter_reason != "MaxDeliveryCountExceeded"]
            unexplained = [
                m
                for m in dead
                if m.dead_letter_reason == "MaxDeliveryCountExceeded"
                and not self.bus.every_delivery_faulted(m)
                and not any(later_copy(m, c) for c in ingress.sent)
            ]
            if dead and not verdicts and not unexplained:
                dead = []  # the broker's, explained: judged by where the lineage went
            if not dead:
                live = any(origin.get(m.message_id, m.message_id) == mid for m in ingress.messages)
                # Where the lineage went: a member completed with no later
                # copy to carry it on was taken as valid. One the broker
                # dead-lettered after every delivery faulted, with no copy
                # after it, ended there (seed 2006810: crashes, a dropped link
                # and a lost lock on each of its five deliveries).
                gone = {m.seq for m in ingress.dead} | {m.seq for m in ingress.messages}
                members = [m for m in ingress.sent if origin.get(m.message_id, m.message_id) == mid]
                completed = [
                    m
                    for m in members
                    if m.seq not in gone and not any(later_copy(m, c) for c in members)
                ]
                # A conflicting copy that arrives first is the order, and the
                # original is the conflict; nothing else is ever valid.
                if live or ((completed or not members) and kind != "conflict"):
                    self.fail(
                        "4 bad submission dead-lettered",
                        f"{mid} ({kind}) "
                        + ("still on the queue" if live else "completed as if valid"),
                    )
                continue
            # (A conflict's alert names it by its key, or, when the gate gave
            # up on it before its handler could read the record, by the
            # OrderID its body carries: seed 700163 on the merged world.)
            reason = (verdicts or dead)[0].dead_letter_reason
            if not verdicts or unexplained:
                self.fail(
                    "4 bad submission dead-lettered with a reason",
                    f"{mid} ({kind}) dead-lettered only by the delivery count, not by its handler",
                )
            elif (kind == "conflict" and not ({oid, self.orders[oid][1]} & alerted)) or (
                kind != "conflict" and not kinds["InvalidMessage"]
            ):
                self.fail(
                    "4 bad submission alerted",
                    f"{mid} ({kind}) dead-lettered with {reason}, no alert",
                )
        for oid in self.overwritten[:1]:
            self.fail("4 nothing overwritten", f"the orders DB document of {oid} was written twice")
        # a compensation is restarted at most MAX_COMPENSATION_RESTARTS times
        for oid, doc in docs.items():
            if doc and (doc.get("CompensationRestarts") or 0) > MAX_COMPENSATION_RESTARTS:
                self.fail(
                    "compensation restarts bounded",
                    f"{oid} restarted its compensation {doc['CompensationRestarts']} times "
                    f"(at most {MAX_COMPENSATION_RESTARTS})",
                )
                break
        # a Processed order has every step's effect, once and not undone (a
        # forged ok or a lost one would leave a step without it)
        for oid, doc in docs.items():
            if doc and doc["ProcessState"] == "Processed":
                missing = [s for s in self.o.steps.names if net[(oid, s)] != 1]
                if missing:
                    self.fail(
                        "Processed order applied every step",
                        f"{oid} is Processed but the remote service has no effect of {missing}",
                    )
        if self.hostile is not None:
            self.hostile.check()
        self._check_applications_apart(docs, statuses)

    def _check_applications_apart(
        self, docs: dict[str, dict | None], statuses: dict[str, list[dict]]
    ) -> None:
        """OrderIDs belong to their application: two applications posting one
        OrderID get two orders, and nothing of one (record, order document,
        status, conflict) reaches the other."""
        for key, (app, oid) in self.orders.items():
            doc = docs.get(key)
            if doc is not None and (doc.get("AppId") != app or doc.get("ReplyTo") != REGISTRY[app]):
                self.fail(
                    "order crossed applications",
                    f"{key}: record of {doc.get('AppId')} (reply queue {doc.get('ReplyTo')})",
                )
            stored = self.orders_c.docs.get((key, key))
            if stored is not None and (stored.get("AppId"), stored.get("OrderID")) != (app, oid):
                self.fail(
                    "order crossed applications",
                    f"{key}: orders DB holds {stored.get('AppId')}'s {stored.get('OrderID')}",
                )
            # Terminal statuses on an application's queue are those of its own
            # record (an operator's action may add a second one).
            if doc is None or any(o == key for o, _ in self.operator_done):
                continue
            want = TERMINAL_STATUS.get(doc["ProcessState"])
            readmitted = any(
                h.get("From") == "Rejected" and h.get("To") == "Pending"
                for h in doc.get("History") or []
            )
            other = {
                s["Status"]
                for s in statuses.get(key, [])
                if s["Status"] in TERMINAL_STATUS.values()
                and s["Status"] != want
                # Rejected, then sent again with room: the same order, admitted
                and not (readmitted and s["Status"] == "Rejected")
            }
            if want and other:
                self.fail(
                    "status crossed applications",
                    f"{key} is {doc['ProcessState']} but {REGISTRY[app]} got {sorted(other)}",
                )
        # An order the previous version accepted keeps its bare key: never a
        # second order under its application's key.
        for key in sorted(self.legacy):
            app, oid = self.orders[key]
            if (order_key(app, oid), order_key(app, oid)) in self.state_c.docs:
                self.fail(
                    "previous version's order duplicated", f"{key} also as {order_key(app, oid)}"
                )
        # Every status names an order its queue's application sent.
        sent = {(app, oid) for app, oid in self.orders.values()}
        for app, queue in REGISTRY.items():
            for m in self.bus.queue(queue).sent:
                own = json.loads(m.body)["OrderID"]
                if (app, own) not in sent and not own.endswith("-V"):
                    self.fail("status crossed applications", f"{queue} got a status of {own}")
        # A conflict is only ever an application's own second order under one
        # OrderID: the orders whose application also sent a conflicting copy
        # (either of the two may be the one refused, whichever came second).
        deliberate = {mid.split("/")[0] for mid, kind in self.bad.items() if kind == "conflict"}
        deliberate |= {key for key, _ in self.changed_resends}
        for queue, app in APP_OF_INGRESS.items():
            for m in self.bus.queue(queue).dead:
                if m.dead_letter_reason != "OrderConflict":
                    continue
                own = json.loads(m.body)["OrderID"]
                key = self.key_of.get((app, own), order_key(app, own))
                if key not in deliberate:
                    self.fail(
                        "conflict crossed applications",
                        f"{queue} {m.message_id} ({key}) dead-lettered OrderConflict: "
                        f"{m.dead_letter_description}",
                    )
        for m in self.bus.queue("alerts").sent:
            alert = json.loads(m.body)
            if alert.get("Kind") == "OrderConflict" and alert.get("OrderID") not in deliberate:
                self.fail(
                    "conflict crossed applications",
                    f"OrderConflict alert for {alert.get('OrderID')}: {alert.get('Reason')}",
                )


_BOOKKEEPING = frozenset(
    {"PendingStatus", "UpdatedAt", "_etag", "_ts", "_rid", "_self", "_attachments"}
)


# What a Cosmos call the store could not answer looks like in an orchestration's
# failure (adapters.cosmos_client.translate_error's transient texts).
_STORE_UNAVAILABLE = (
    "Cosmos DB answered 429",
    "Cosmos DB answered 503",
    "Cosmos DB answered 408",
    "ServiceRequestError",
    "ServiceResponseError",
    "CosmosClientTimeoutError",
)


def _store_unavailable(failure: str) -> bool:
    return any(text in failure for text in _STORE_UNAVAILABLE)


def _agent_settlement(d: Delivery):
    """The agents' Settlement over one delivery, as the product builds it:
    the queue-triggered agent's FunctionsSettlement over the binding's
    actions, or (every other delivery, by its sequence number) the
    standalone worker's ReceiverSettlement over its receiver."""
    from agents.messaging import ReceiverSettlement
    from triggers.agents import FunctionsSettlement

    if d.sequence_number % 2:
        return FunctionsSettlement(SimActions(d), d, run_sync=_inline)
    return ReceiverSettlement(SimReceiver(d), d)  # type: ignore[arg-type]


def _call_limit(body: bytes) -> datetime | None:
    """Until when a request's calls may start: its Deadline, or its
    ListenUntil when that is later (an undo, ADR 005); None when unreadable."""
    try:
        req = json.loads(body)
        limits = [datetime.fromisoformat(req[k]) for k in ("Deadline", "ListenUntil") if req.get(k)]
    except (ValueError, TypeError, KeyError):
        return None
    return max(limits) if limits else None


def _outbox_only(old: dict, new: dict) -> bool:
    """A write that only clears (or counts a failed send of) the status
    outbox: anyone who sent the status may make it (ADR 001), owner or not,
    and it changes nothing an attempt owns."""
    keys = (set(old) | set(new)) - _BOOKKEEPING
    if any(old.get(k) != new.get(k) for k in keys):
        return False
    was, now = old.get("PendingStatus"), new.get("PendingStatus")
    return now is None or (was is not None and now.get("MessageId") == was.get("MessageId"))


def _outcome_of(event_input: str | None) -> str | None:
    try:
        value = json.loads(event_input or "null")
        if isinstance(value, str):
            value = json.loads(value)
        return value.get("Outcome") if isinstance(value, dict) else None
    except ValueError:
        return None


def _cosmos(iso_text: str) -> str:
    from adapters.state_store import cosmos_time

    return cosmos_time(datetime.fromisoformat(iso_text))


@dataclass
class Result:
    seed: int
    violations: list[tuple[str, str]]
    faults: list
    trace: list[str]
    rows: Counter
    counters: Counter
    bound: timedelta
    options: Options


def simulate(sim: Simulation) -> Simulation:
    """Run `sim` to its end on an event loop of its own (its checks not run:
    `sim.check()` does that); the tests' way in, as run_schedule's."""
    logging.disable(logging.CRITICAL)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(sim.run())
    finally:
        loop.close()
    return sim


# The workflow versions that listen for a step's reply until the deadline
# after a send, begin or advance whose answer was lost (2.4's
# _hear_unconfirmed); attempts in flight on the frozen earlier versions fail
# there and leave the attempt to the Supervisor, their own contract.
LISTENING_VERSIONS = frozenset({"2.4"})


def run_schedule(
    seed: int,
    orders: int = 3,
    drop: frozenset[int] = frozenset(),
    version: str | None = None,
    hostile: int | None = None,
    apps: int = 2,
    wider: bool = True,
    scan: str | None = None,
    hosts: int | None = None,
    fallible: bool = True,
    *,
    steps: StepCatalog | None = None,
    mutation_world: bool = True,
    bus_outages: bool = True,
    link_drops: bool = True,
    entity_full: bool = True,
) -> Result:
    """`steps`: run this step catalog instead of domain/steps.json (the
    seed's other choices stay what they are)."""
    logging.disable(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="Potential duplicate Task completion")
    options = options_for(
        seed,
        orders,
        version,
        hostile,
        apps,
        wider,
        hosts=hosts,
        fallible=fallible,
        mutation_world=mutation_world,
        bus_outages=bus_outages,
        link_drops=link_drops,
        entity_full=entity_full,
    )
    if steps is not None:
        options = replace(options, steps=steps)
    sim = simulate(Simulation(seed, orders, drop, options=options, scan=scan))
    sim.world.counters["index partition-second peak"] = sim.index_writes.peak()
    return Result(
        seed,
        sim.violations,
        sim.world.faults.injected,
        sim.world.trace,
        sim.rows,
        sim.world.counters,
        sim.bound,
        sim.o,
    )


__all__ = [
    "ROWS",
    "Options",
    "Result",
    "Simulation",
    "liveness_bound",
    "options_for",
    "refusals",
    "replace",
    "run_schedule",
    "simulate",
]
