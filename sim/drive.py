"""The drive of one schedule: the product's own code wired to the simulated
world, run from a seed (its clients, operators, timers, host processes and
queue deliveries), then checked (sim.path_checks on the way, sim.checks at
the end).

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
import json
import logging
import random
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pybreaker

from adapters.checkpoints import CosmosCheckpointStore
from adapters.cosmos_client import RequestCharges
from adapters.orders_db import CosmosOrdersRepository
from adapters.ports import NoIndex
from adapters.recovery_index import CosmosRecoveryIndex
from adapters.servicebus import ALERTS_QUEUE
from adapters.settings import CosmosAccount, ServiceBusAccess, Settings
from adapters.settlement import ORIGINAL_ID_PROPERTY, BackoffPolicy, MessageGate
from adapters.state_store import CosmosStateStore
from agents.agent import Agent, AgentPolicy, Breakers
from agents.messaging import RequestProcessor
from bootstrap import App, Overrides, Seams, build
from devstack.host.app import SERVICE_BUS_TRIGGER, index_app
from devstack.host.invoke import call_function
from domain.codec import encode
from domain.ids import order_key, status_message_id
from domain.signing import KeyRing
from domain.steps import StepCatalog
from orchestrators.policy import StarterPolicy
from orchestrators.requests import AgentRequests
from orchestrators.starter import STATUS_BACKOFF_MAX, STATUS_GRACE, Starter, fast_start
from reporting import Alerts, StatusReporter
from submit.policy import SubmitPolicy

from .bus import (
    HANDLING,
    Bus,
    Delivery,
    SimActions,
    SimReceiver,
    SimServiceBusClient,
    copy_root,
    publisher,
    reply_sender,
    rules_for,
)
from .checks import EndChecks
from .clients import Clients
from .cosmos import SimContainer
from .durable import SimDurable
from .faults import WorldFaults
from .hostile import PREFIX as FORGED
from .hostile import Hostile
from .options import (
    APP_OF_INGRESS,
    APPS,
    INGRESS_OF,
    REGISTRY,
    SLACK,
    STARTER_PERIOD,
    SUPERVISOR_PERIOD,
    TERMINAL_STATUS,
    Options,
    liveness_bound,
    options_for,
    refusals,
    undo_budget,
)
from .partitions import PartitionWrites
from .path_checks import PathChecks
from .remote import SimRemote, http_remote, random_text
from .worker import WorkerHost
from .world import START, Crash, SimClock, World


def catalog(root: App):
    """The functions of the Functions app over `root`, as the host indexes them."""
    import function_app

    return index_app(function_app.create_app(root))


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


class Simulation(Clients, PathChecks, EndChecks, WorldFaults):
    """One schedule: the world and the app built over it (`__init__`), its
    host processes and deliveries, the Starter's and the Supervisor's
    timers, the schedule itself (`run`); its clients and operators are
    sim.clients', its faults sim.faults', and its checks sim.path_checks'
    (hooked on the stores, the bus, the remote services and the task hub
    here) and sim.checks' (`check`, at the end of `run`)."""

    def __init__(
        self,
        seed: int,
        orders: int = 3,
        drop: frozenset[int] = frozenset(),
        options: Options | None = None,
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
            seed, orders, hostile, apps, wider, hosts=hosts, fallible=fallible
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
        # The issue-43 path checks' findings and bookkeeping (sim.path_checks).
        self.reply_misrouted: list[str] = []
        self.timer_off_deadline: list[str] = []
        self.landed_not_written: list[str] = []
        self.stopped_reading: list[str] = []
        self.replying: dict[Any, bytes] = {}
        self.wrote_states: dict[str, set[str]] = {}
        self.sup_pages: dict[Any, list[int]] = {}
        self.status_refused: dict[str, str] = {}
        self.starter_refused: dict[str, list[datetime]] = {}
        self.starter_spans: dict[int, list[datetime]] = {}
        self.processed_at: dict[str, datetime] = {}
        self.alerting_entries: dict[str, list[tuple[str, datetime]]] = {}
        self.refused_sends: dict[str, int] = {}
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
        self.delivery_root: dict[int, str] = {}
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
            max_processing=self.o.max_processing,
            step_timeout=self.o.step_timeout,
            supervisor_page_size=self.o.page_size,
            supervisor_scan=self.o.scan,
            retry=self.o.retry,
            # The schedule's own keys, from its seed (its own stream: no other
            # draw moves), as devstack generates a stack's (ADR 017e).
            agent_keys=KeyRing([random.Random(f"keys/agents/{seed}").randbytes(32)]),
            reply_token_keys=KeyRing([random.Random(f"keys/tokens/{seed}").randbytes(32)]),
            progress_apps=self.o.progress_apps,
        )
        # The product's own Service Bus adapters over a simulated client (issue 21).
        self.servicebus = SimServiceBusClient(w, self.bus, set(REGISTRY.values()))
        self.servicebus.on_sent = self._on_sent
        self.servicebus.on_refused = self._on_refused
        self.servicebus.on_reply = lambda body: self._reply_of.__setitem__(
            asyncio.current_task(), body
        )
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
        # The process's one Alerts, as bootstrap keeps one per publisher (the
        # schedule's hosts share it: a restart is taken as a clean shutdown,
        # which flushes); its windows flushed on the world's clock, and what
        # each aggregate counted kept for the checks (MessageChecks.alert_messages).
        self.alert_ledger: dict[str, list[tuple[str | None, bytes]]] = {}
        self._alerts = Alerts(
            self.publisher,
            new_id=self.seams.new_id,
            clock=SimClock(w, "alerts"),
            wake=lambda delay, flush: w.at(
                w.clock.now + timedelta(seconds=delay),
                "alerts flush",
                lambda: w.spawn("alerts", flush, crashable=False),
            ),
            on_counted=lambda aggregate, alert, alert_id: self.alert_ledger.setdefault(
                aggregate, []
            ).append((alert_id, encode(alert))),
        )
        self.request_sender: dict[str, tuple[str, int]] = {}
        self.lost_requests: list[str] = []
        self.lost_copies: list[str] = []
        # The agent's delivery being handled, per task: until when its calls may start.
        self._request_limit: dict[Any, datetime | None] = {}
        self.late_calls: list[str] = []
        # Per task, the calls a service answered with a refusal (a 4xx but 408
        # and 429) while the task handled a request; the replies on
        # agent-responses (instance, reply event) and how many of its sends
        # are indexed; calls whose timeout ran past their request's limit.
        self._refused_here: dict[Any, set[tuple[str, str]]] = {}
        self.retried_refusals: list[str] = []
        self.wrong_payloads: list[str] = []
        self._replies_seen: set[tuple[str, str]] = set()
        self._replies_indexed = 0
        self.unanswered: list[str] = []
        self.long_calls: list[str] = []
        # Per task, its last remote call as it ended (and whether its breaker
        # judged it); the reply each task sent; what the checks on them found.
        self._last_outcome: dict[Any, Any] = {}
        self._reply_of: dict[Any, bytes] = {}
        self.uncounted_failures: list[str] = []
        self.paced_given_up: list[str] = []
        self.count_run_out: list[str] = []
        self.bad_identity: list[str] = []
        # Per instance, the steps its undo requests name, in the order it first sent them.
        self.undo_sent: dict[str, list[str]] = {}
        self.store = CosmosStateStore(self.state_c)
        self.orders_repo = CosmosOrdersRepository(self.orders_c)
        # The activities' index (one for the schedule's hosts, like Alerts): its
        # waiting discards flushed on the world's clock, a crash losing them.
        self.index = (
            CosmosRecoveryIndex(
                self.index_c,
                shards=self.index_shards,
                wake=lambda delay, flush: w.at(
                    w.clock.now + timedelta(seconds=delay),
                    "index flush",
                    lambda: w.spawn("index flush", flush),
                ),
            )
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
        self.key_of = {v: k for k, v in self.orders.items()}  # (app, OrderID) -> key
        self.order_ids = list(self.orders)  # order keys
        declines = {}
        for oid in self.order_ids:
            if w.faults.draw(self.o.faults.decline, "decline", oid):
                ops = rng.choice(refusals(self.o.steps))
                declines[oid] = (ops, random_text(rng))
        self.remote = SimRemote(w, declines, self.o.steps)
        self.remote.undo_budget = undo_budget(self.o)
        self.remote.on_call = self._on_remote_call
        self.remote.on_answer = self._on_remote_answer
        self.remote.on_outcome = self._on_remote_outcome
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
            steps=self.o.steps,
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
                steps=self.o.steps,
            ),
        )
        self.catalog = catalog(self.app)
        self.durable = SimDurable(w, self.catalog)
        self.durable.owner_of = self._owner_of
        self.durable.on_gone_answer = self._on_gone_answer
        self.durable.on_raise = self._on_raise
        self.durable.on_timer = self._on_timer
        self.durable.on_activity_result = self._on_activity_result
        self.durable.dies = self._compensation_dies
        self._lag_rng = random.Random(f"lagging/reads/{seed}")
        self.state_c.lagging = self.index_c.lagging = self._supervisor_lags
        self.state_c.session = self.index_c.session = self.orders_c.session = self._session
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
        self.hostile = (
            Hostile(self, self.o.faults.hostile, self.o.insider_replies)
            if self.o.faults.hostile or self.o.insider_replies
            else None
        )

    def alerts(self) -> Alerts:
        return self._alerts

    def _new_agent(self, clock: SimClock, rng: random.Random) -> Agent:
        policy = AgentPolicy()
        return Agent(
            http_remote(self.remote),
            clock,
            policy,
            breakers=_WatchedBreakers(
                self._on_breaker,
                policy.breaker_fail_max,
                policy.breaker_reset_timeout,
                now=self.seams.breaker_now,
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
            orders=self.orders_repo,
            # As bootstrap builds it: the Starter sends each attempt's first request.
            requests=AgentRequests(
                self.settings.scheduler_keys, self.publisher, self.orders_repo, self.o.steps
            ),
        )
        return SimHost(k, generation, submit, starter, processor)

    @property
    def host(self) -> SimHost:
        """The host the running task is on (a delivery's or a timer's)."""
        return self.hosts[_HOST.get()]

    def _session(self) -> tuple[int, int] | None:
        """The Cosmos session of the running task (sim.cosmos): its host
        process's client, one per process generation; an operator's command
        opens a client of its own (None)."""
        task = asyncio.current_task()
        if task is None or self.world._names.get(task, "").startswith("operator"):
            return None
        k = _HOST.get()
        return (k, self.hosts[k].generation) if k < len(self.hosts) else None

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
            task = asyncio.current_task()
            self.sup_pages[task] = [0]
            try:
                report = await run()
            finally:
                self._sup_active -= 1
                pages = self.sup_pages.pop(task, [0])
            self._check_read_on(report, pages[:-1], clock.now() - now)
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

    def _owner_of(self, instance_id: str) -> str | None:
        """The attempt that owns the record now (the latest write, not a lagged read)."""
        oid = instance_id.rpartition(":")[0]
        doc = self.state_c.docs.get((oid, oid))
        return doc.get("LockedBy") if doc else None

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
            self.delivery_root[d.token] = copy_root(d.message_id, d.sequence_number)
            self.lineage_starts.setdefault(lineage, []).append(self.world.clock.now)
        count = d.broker_count  # the broker's, 1-based (this delivery's)
        try:
            if d.queue == "agent-requests":
                # As the trigger hands it over: the received message (its
                # body, delivery count, sequence number and properties).
                await self._agent_request(d, self.host.processor, _agent_settlement(d))
            elif d.queue == "agent-responses":
                self.replying[asyncio.current_task()] = d.body
                try:
                    settled = await self.app.on_reply(d, SimActions(d), self.durable)
                    self._check_count_kept(d, count, settled.kind)
                finally:
                    self.replying.pop(asyncio.current_task(), None)
            elif d.queue in APP_OF_INGRESS:
                # Submit's function body (triggers/submit.py): its durable client
                # binding cannot be passed in-process, so the use case runs with
                # the simulation's Durable as the client (the fast path). The
                # application is the one whose ingress queue it came on.
                handler = await self.app.submit_handler()
                gate = await self.app.message_gate(d.queue)
                app = APP_OF_INGRESS[d.queue]
                settled = await gate.run(
                    d, SimActions(d), lambda body: handler.handle(body, app, self.durable)
                )
                self._check_count_kept(d, count, settled.kind)
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
        genuine = not str(origin or d.message_id).startswith(FORGED)
        count = d.broker_count  # the broker's, 1-based (this delivery's)
        if genuine:
            self._check_deadline(d)
            self._check_identity(d)
            self._request_limit[task] = _call_limit(d.body)
        try:
            settled = await processor.process_message(d, settlement)
            self._check_count_kept(d, count, settled)
            if genuine and settled == "complete":
                self._check_answered(d)
            if genuine:
                self._check_pacing_not_given_up(d, self._reply_of.get(task))
            return settled
        finally:
            self._request_limit.pop(task, None)
            self._refused_here.pop(task, None)
            self._last_outcome.pop(task, None)
            self._reply_of.pop(task, None)

    async def _starter_run(self) -> None:
        if self.world.clock.now < self.lease_free_at:
            return  # no host holds the singleton lock yet (_restart_host)
        _HOST.set(self.singleton)
        starter = self.host.starter
        now = self.world.clock.now
        self.starter_spans.setdefault(id(starter), [now, now])[1] = now
        await starter.run(self.durable)

    async def _supervisor_run(self) -> None:
        if self.world.clock.now < self.lease_free_at:
            return
        _HOST.set(self.singleton)
        spec = next(s for s in self.catalog.of_type("timerTrigger") if s.name == "supervisor")
        await call_function(spec, {spec.trigger["name"]: None})

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

    def idle(self) -> bool:
        if len(self.submitted) < len(self.order_ids) or self.operator_pending:
            return False
        if self.o.impersonation and not self.impersonated:
            return False  # the impersonator's order is still to come
        if self._junk_unalerted():
            return False  # a bad document is not done with until an operator hears of it
        if self.hostile is not None and self.hostile.pending:
            return False  # a forgery still to come: it may arrive after every order ended
        spell = self.world.faults.refusing.get(ALERTS_QUEUE)
        if spell is not None and self.world.clock.now < spell[1]:
            # The alerts queue refusing for long (FaultConfig.refusing_alerts):
            # the alerts held meanwhile are owed once it takes them again.
            return False
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
        return self._quiet() and not self._processed_unheard()

    def _processed_unheard(self) -> bool:
        """A Processed record whose status, out of its outbox (ADR 021k), its
        client has not heard: the activity's retry or the index Supervisor owes it."""
        for oid in self.order_ids:
            doc = self.state_c.docs.get((oid, oid)) or {}
            if doc.get("ProcessState") == "Processed" and not doc.get("PendingStatus"):
                key = status_message_id(oid, "Processed")
                if not any(m.message_id == key for m in self.bus.queue(doc["ReplyTo"]).sent):
                    return True
        return False

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
        if self._processed_unheard():
            return False
        now = self.world.clock.now
        settle = timedelta(seconds=3 * SUPERVISOR_PERIOD + STARTER_PERIOD) + SLACK
        if self.last_write is not None and now - self.last_write < settle:
            return False
        ended = self.durable.last_ended
        if ended is not None and now - ended < settle:
            # The Starter acts on an instance's end only at its next run: a
            # deferred compensation whose NotBefore passed while its instance
            # still ran (a stalled episode) is restarted after it ends (seed
            # 100036: the instance ended 66 s after its NotBefore, and the
            # schedule was called done before the Starter ran).
            return False
        refused_until = self._refusals_end()
        # The last refusal of a status send (a fault, a refusing entity): the
        # Starter probes a queue that refused again within STATUS_BACKOFF_MAX.
        last_refusal = max(self.faults_stopped, refused_until or self.faults_stopped)
        if refused_until is not None and now < refused_until + settle + STATUS_GRACE:
            return False  # the statuses a refusing reply queue owes are still to come
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
            if pending and (
                datetime.fromisoformat(pending["At"]) + STATUS_GRACE + settle > now
                or last_refusal + STATUS_BACKOFF_MAX + settle > now
            ):
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

    def _refusals_end(self) -> datetime | None:
        """When the last refusing entity (FaultConfig.refusing_reply) works again."""
        ends = [until for _, until, _ in self.world.faults.refusing.values()]
        return max(ends) if ends else None

    async def run(self) -> None:
        """The schedule: the faults, the clients and operators, the timers; run until faults stop, then until
        the liveness bound or a fixed point; then the end's checks."""
        w, o = self.world, self.o
        f = o.faults
        fault_end = START + timedelta(seconds=o.fault_window)
        self.bound = liveness_bound(o)
        end = self._schedule_host_faults(fault_end + self.bound)
        self.until = end
        if self.hostile is not None:
            self.hostile.install()
        for worker in self.workers:
            worker.install(START)
        for i, oid in enumerate(self.order_ids):
            self._schedule_order(i, oid)
        self._install_faults(fault_end)
        refused_until = self._refusals_end()
        if refused_until is not None:
            # A reply queue refusing for hours: the statuses it refused are
            # owed once it works again, within the bound after that.
            end = max(end, refused_until + self.bound)
            self.until = end
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
        await self._alerts.close()  # the process's shutdown: open windows sent
        self.check()


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


class _WatchedBreakers(Breakers):
    """The product's Breakers, each breaker telling the simulation its verdict
    on every call (pybreaker's listener: a failure counted, or a success,
    which is also what an excluded error counts as): `on_verdict(service,
    counted)`, in the task that made the call (PathChecks._on_breaker)."""

    def __init__(self, on_verdict: Callable[[str, bool], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_verdict = on_verdict

    def for_service(self, service: str) -> pybreaker.CircuitBreaker:
        breaker = super().for_service(service)
        if not breaker.listeners:
            breaker.add_listener(_Verdicts(self._on_verdict))
        return breaker


class _Verdicts(pybreaker.CircuitBreakerListener):
    def __init__(self, on_verdict: Callable[[str, bool], None]) -> None:
        self._on_verdict = on_verdict

    def failure(self, cb: pybreaker.CircuitBreaker, exc: BaseException) -> None:
        self._on_verdict(str(cb.name), True)

    def success(self, cb: pybreaker.CircuitBreaker) -> None:
        self._on_verdict(str(cb.name), False)


def _call_limit(body: bytes) -> datetime | None:
    """Until when a request's calls may start: its Deadline, or its
    ListenUntil when that is later (an undo, ADR 005); None when unreadable."""
    try:
        req = json.loads(body)
        limits = [datetime.fromisoformat(req[k]) for k in ("Deadline", "ListenUntil") if req.get(k)]
    except (ValueError, TypeError, KeyError):
        return None
    return max(limits) if limits else None


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


def run_schedule(
    seed: int,
    orders: int = 3,
    drop: frozenset[int] = frozenset(),
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
    slow_world: bool = True,
    rare_faults: bool = True,
    admission_world: bool = True,
    foreign_senders: bool = True,
    long_refusals: bool = True,
) -> Result:
    """`steps`: run this step catalog instead of domain/steps.json (the
    seed's other choices stay what they are)."""
    logging.disable(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="Potential duplicate Task completion")
    options = options_for(
        seed,
        orders,
        hostile,
        apps,
        wider,
        hosts=hosts,
        fallible=fallible,
        mutation_world=mutation_world,
        bus_outages=bus_outages,
        link_drops=link_drops,
        entity_full=entity_full,
        slow_world=slow_world,
        rare_faults=rare_faults,
        admission_world=admission_world,
        foreign_senders=foreign_senders,
        long_refusals=long_refusals,
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


__all__ = ["Result", "Simulation", "catalog", "run_schedule", "simulate"]
