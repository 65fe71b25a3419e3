"""What a schedule is made of, drawn from its seed: the client applications
and the periods of the app's timers (the settings the checks' bounds follow
from), `Options` (every fault and world choice of one schedule) and
`options_for`, which draws them; the liveness bound and the providers'
refusals follow from them."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from datetime import timedelta

from adapters.settings import ingress_queues
from domain import state_machine as sm
from domain.steps import DEFAULT_CATALOG, StepCatalog

from .worker import WorkerRun, draw_workers
from .world import FaultConfig

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


@dataclass
class Options:
    orders: int = 3
    scan: str = "query"  # or "index"
    page_size: int = 100
    backlog_limit: int = 5000
    max_processing: int = 500  # MAX_PROCESSING; the admission world lowers it until it binds
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
    # Senders the app must refuse though they hold what a sender needs (the
    # foreign-senders world, sim.options._foreign_senders): a registered
    # application's client naming the other application's reply queue in
    # its own order (section 4, reply queues are access-controlled); a
    # client whose JSON library writes lax types ("2" for a Quantity, ADR
    # 013: types are not coerced); so many forged replies from a holder of
    # the agents' signing key, signed but with no reply token (ADR 017e:
    # not even an agent can answer a request never made).
    reply_thief: bool = False
    lax_client: bool = False
    insider_replies: int = 0


def options_for(
    seed: int,
    orders: int,
    hostile: int | None = None,
    apps: int = 2,
    wider: bool = True,
    hosts: int | None = None,
    fallible: bool = True,
    mutation_world: bool = True,
    bus_outages: bool = True,
    link_drops: bool = True,
    entity_full: bool = True,
    slow_world: bool = True,
    rare_faults: bool = True,
    admission_world: bool = True,
    foreign_senders: bool = True,
    long_refusals: bool = True,
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
    False the full queues (FaultConfig.entity_full; seeds recorded before them);
    `slow_world` False issue 43's worlds (overload, rate limits, a reply
    queue refusing for hours: `_slow_world`; seeds recorded before them);
    `rare_faults` False the faults of calls no seed failed (FaultConfig.lost_404,
    start_lag; seeds recorded before them); `admission_world` False the
    MAX_PROCESSING that binds; `foreign_senders` False the senders the app
    must refuse (`_foreign_senders`), `long_refusals` False the long
    refusals (`_long_refusals`; seeds recorded before them)."""
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
    if slow_world and newer:
        _slow_world(seed, options, quiet)
    if rare_faults and newer and not quiet:
        # The fault surface's last gaps (issue 42), from a stream of their own.
        rare = random.Random(f"rare-faults/options/{seed}")
        f.lost_404 = rare.choice((0.0, 0.03, 0.1, 0.3))
        f.start_lag = rare.choice((0.0, 0.5, 1.0))
    if admission_world and newer:
        options.max_processing = _admission_cap(seed, orders)
    if foreign_senders and newer and apps > 1:
        _foreign_senders(seed, options)
    if long_refusals and newer:
        _long_refusals(seed, options, quiet)
    return options


def _foreign_senders(seed: int, o: Options) -> None:
    """The foreign-senders world (Options.reply_thief, lax_client,
    insider_replies), from a stream of its own so that no other draw of
    the seed moves: each sender in about one schedule in three."""
    rng = random.Random(f"foreign-senders/{seed}")
    o.reply_thief = rng.random() < 1 / 3
    o.lax_client = rng.random() < 1 / 3
    o.insider_replies = rng.choice((0, 0, 0, 1, 3, 6))


def _long_refusals(seed: int, o: Options, quiet: bool) -> None:
    """Refusals that last, each from a stream of its own so that no other
    draw of the seed moves:

    - in one schedule in five, the `alerts` queue refuses every send for
      15-45 minutes from a moment in the first minute (nobody drains it and
      it is full, an operator disabled it, or the app's Sender role on it
      was removed), faults or not: longer than the message gate's whole
      back-off schedule, so a dead letter's alert is carried on in its
      copies until they are spent and then held by the process (ADR 014,
      design section 4 "Alerts stay readable");
    - in one schedule in four with faults, a provider throttles the whole
      tenant for 20-60 s (another client's load, or a quota of the
      subscription): every call to one service is answered 429 with a
      Retry-After of 1-2 s, however few we make (pacing, section 4);
    - in one schedule in two of those with a standalone worker, the agents'
      reply queue is full for 20-60 s while the worker runs: every reply it
      sends is refused, so a request is delivered again and again to its
      last delivery (ADR 014: then dead-lettered, never left to the count)."""
    f = o.faults
    alerts = random.Random(f"refusing-alerts/{seed}")
    if alerts.random() < 1 / 5:
        f.refusing_alerts = alerts.choice(("disabled", "forbidden", "full"))
        f.refusing_alerts_seconds = round(alerts.uniform(900, 2700), 3)
    throttle = random.Random(f"tenant-throttle/{seed}")
    if not quiet and throttle.random() < 1 / 4:
        f.tenant_throttle = round(throttle.uniform(20, 60), 3)
    replies = random.Random(f"replies-full/{seed}")
    if o.workers and replies.random() < 1 / 2:
        f.replies_full_in_worker = round(replies.uniform(20, 60), 3)


def _admission_cap(seed: int, orders: int) -> int:
    """MAX_PROCESSING low enough to bind in one schedule in three (the
    admission world), from a stream of its own: 1 or 2 for a few orders, a
    tenth of the orders for more; 500 (as deployed, never reached) otherwise."""
    rng = random.Random(f"admission/{seed}")
    if rng.random() >= 1 / 3:
        return 500
    return rng.choice((1, 2)) if orders <= 5 else max(2, orders // 10)


def _slow_world(seed: int, o: Options, quiet: bool) -> None:
    """Issue 43's worlds, from streams of their own (no other draw of a seed
    moves), drawn last:

    - overload alone, in one quiet schedule in two: every order in the first
      3 s against services that serve all the schedule's calls of one step in
      20-90 s (`rate_limit` = orders / that) and an orchestration's episodes
      waiting up to 10-60 s in the task hub's backed-up queues
      (`episode_wait`), with no other fault, so that check (e), goodput
      under overload, can judge it;
    - rate limits among the other faults, in one other schedule in five, half
      of them with the burst of orders too (overload), with one
      orchestration episode in twenty stalled 60-240 s (`episode_stalls`: a
      worker that froze, so an attempt's finishing write may come after its
      deadline, the Supervisor and another attempt's whole run);
    - a client's reply queue refusing every send (disabled, deleted, its
      Sender role removed, or full) for 1-3 hours from a moment in the
      fault window, in one other schedule in eight."""
    f = o.faults
    rng = random.Random(f"slow-world/{seed}")
    if quiet:
        if rng.random() < 0.5:
            f.overload = f.burst = True
            f.rate_limit = o.orders / rng.uniform(20, 90)
            f.episode_wait = rng.uniform(10, 60)
        return
    if rng.random() < 0.2:
        f.rate_limit = o.orders / rng.uniform(20, 90)
        if rng.random() < 0.5:
            f.overload = f.burst = True
            f.episode_wait = rng.uniform(10, 60)
        f.episode_stalls = 0.05
    refusing = random.Random(f"refusing-reply/{seed}")
    if refusing.random() < 1 / 8:
        f.refusing_reply = refusing.choice(("disabled", "deleted", "forbidden", "full"))
        f.refusing_seconds = round(refusing.uniform(3600, 3 * 3600), 3)


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
    refusing = [s for s in steps.steps if s.refusal is not None]
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
