"""The simulated world: one virtual clock, a deterministic scheduler of actor
tasks, the fault plan drawn from the seed, and the trace.

Every call the product makes into a simulated world (a Cosmos operation, a
Service Bus send, a remote call, an agent's sleep) is an await point: the actor
parks there and the scheduler, using the seed's random stream, picks which
parked actor runs next, when virtual time moves, and whether the actor crashes
at that point instead (`Crash`, a BaseException, so product code cannot catch it
as it could not catch a `kill -9`)."""

from __future__ import annotations

import asyncio
import heapq
import os
import random
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any


class Crash(BaseException):
    """The actor's process died at this await point."""


class SimulatorError(Exception):
    """A bug in the simulator, not in the product: the run stops."""


_SIM_DIR = os.path.dirname(os.path.abspath(__file__))


def _raised_in_simulator(exc: BaseException) -> bool:
    """The innermost frame of the traceback is simulator code (a fake's own
    bug), not product code that the fake made fail on purpose: fakes raise
    their faults as the real SDK exceptions from a raise statement inside sim/,
    so only errors other than the ones a fake raises on purpose count."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return False
    in_sim = os.path.dirname(os.path.abspath(last.tb_frame.f_code.co_filename)) == _SIM_DIR
    return in_sim and isinstance(
        exc, AttributeError | TypeError | KeyError | NameError | IndexError | ValueError
    )


START = datetime(2026, 11, 30, 8, 0, 0, tzinfo=UTC)

# The fault surface (`python -m sim --fault-surface`, sim/surface.py): when set,
# every fault injected at a call is attributed to the product frame on the stack.
# None (off) unless the flag is on; the hooks below cost one comparison then.
SURFACE: Any = None
TARGETED_OUTAGE_SECONDS = 2.0  # a failover's length (the seed's blips: 0.5-3 s)


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def at(self, skew: float) -> datetime:
        return self.now + timedelta(seconds=skew)


@dataclass
class FaultConfig:
    """Which faults a schedule draws, and how often (all from the seed)."""

    crash: float = 0.0  # per await point
    duplicate: float = 0.0  # per message sent
    delay: float = 0.0  # per message sent: delivered up to 20 s late (reorders)
    lock_expiry: float = 0.0  # per delivery: lock lost while the handler runs
    throttle_storm: bool = False  # one 30-90 s storm of 429s on the stores
    throttle_bursts: int = 0  # short bursts (2-6 s) of 429s at random moments
    host_outage: bool = False  # the whole app down for 8 days (longer than the query's look-back)
    send_fail: float = 0.0  # per status / alert / reply send
    decline: float = 0.0  # per order: payment declined permanently, message 0-4 KB
    outage: bool = False  # one downstream outage longer than the retry budget
    # one outage that begins with the schedule's first undo call and outlasts
    # the whole undo budget (UndoTries x step timeout), every call in it
    # applied and its answer lost (N3's worst case, ADR 019a)
    undo_blackout: bool = False
    lag: float = 0.0  # per read of a document with a previous version
    duplicate_activity: float = 0.0  # per activity: delivered twice
    two_supervisors: bool = False
    operator: float = 0.0  # per order: an operator action at a random moment
    skew: float = 0.0  # max per-actor clock skew, seconds
    minute_edges: bool = False  # orders submitted just before minute boundaries
    burst: bool = False  # every order submitted within 3 s (admission control)
    bad_messages: float = (
        0.0  # per order: a conflicting copy, a malformed body or an AMQP value body
    )
    # per Durable client call (start_new, raise_event, get_status): fails as the
    # SDK does on a 5xx or a dropped connection, before its effect or after it
    durable_fail: float = 0.0
    # per successful remote answer: its Reference is hostile (long, empty,
    # non-text, control characters, card-like)
    odd_answers: float = 0.0
    # documents this version did not write: garbage in the state and index
    # containers, and a newer version's unknown field on live records
    foreign_docs: bool = False
    # per order: the client sends it again (a new message id) at a random moment
    # after acceptance: while Pending, Processing, in a long retry, Compensating,
    # after a terminal state or a Rejected status
    resend: float = 0.0
    hostile: int = 0  # forged replies and requests on the internal queues (sim.hostile)
    # host processes that restart during the fault window, losing their
    # in-memory state (a scale-in, a new instance, an out-of-memory kill)
    host_restarts: int = 0
    # The fallible world (issue 21: every external call can fail), each raised
    # as the real SDK raises it so the product's own classification runs:
    # per Cosmos call: a 429 past the SDK's own retries, a 503, a refused connection
    cosmos_fail: float = 0.0
    # per Cosmos write: applied, its answer lost (reset connection, client timeout, 408)
    cosmos_lost: float = 0.0
    # one window (5-60 s) in which every Cosmos call of the account fails, and
    # short ones (0.5-3 s: a failover, a gateway restart), each from a random call on
    cosmos_outage: bool = False
    cosmos_blips: int = 0
    # per query: read on a lagging replica (every document's previous version,
    # but none older than the querying session wrote or read: sim.cosmos)
    query_lag: float = 0.0
    # per settlement: the link drops before it, the lock is found lost, or it is
    # applied and its answer lost
    settle_fail: float = 0.0
    # per send (every queue, scheduled sends too): refused by a dropped link, or
    # accepted by the broker and its answer lost
    send_lost: float = 0.0
    # per remote call: the answer comes after the client's timeout (applied or not)
    slow_answers: float = 0.0
    # Service Bus outages (a namespace failover, a gateway restart, a long
    # ServerBusy): short windows (1-8 s), each from a random bus call on, in
    # which every send, schedule and settlement fails: refused, or for a share
    # of them accepted with the answer lost
    bus_blips: int = 0
    # the first so many sends accepted with their answer lost are each the
    # start of a dropped connection: the link stays down for a reconnect
    # (1.5-6 s), so every retry of that send (and every other bus call) fails
    # in it, refused or for a share accepted with the answer lost again. A few
    # per schedule: one after every lost answer would chain into an outage
    # that never ends in a schedule of 50 orders (seed 900021)
    link_drops: int = 0
    # per receive of the standalone worker (sim/worker.py): the link dropped, or
    # no answer in time (with or without messages locked to the dead link)
    receive_fail: float = 0.0
    # One queue at a time full or throttled while the others work (the
    # broker's QuotaExceeded at the queue's maximum size, an entity-level
    # ServerBusy): a window (20-240 s) in which every send and schedule to
    # that queue is refused with ServiceBusQuotaExceededError, while its
    # receives and settlements go on. So many windows, each on a queue the
    # product sends to (alerts, a reply queue, an ingress queue, the agents').
    # The simulated clients' own orders still land on a full ingress queue: a
    # real client retries its refused send, which the world's late and
    # resent orders already cover.
    entity_full: int = 0
    # the host's start (container setup) and the operator's console reads run
    # as actors, under the same faults
    host_start: bool = False
    # Issue 43's worlds, slow or refusing for long (sim.options._slow_world):
    # every remote service serves at most this many calls a second while
    # faults last; a call above it is answered 429 with a Retry-After (whole
    # seconds until its next free slot), applying nothing (0: no limit)
    rate_limit: float = 0.0
    # overload: arrivals far above what the services serve (every order in
    # the first seconds, `burst`, against the rate limit) for minutes; alone
    # (no other fault) in the schedules check (e) judges: sim.checks
    overload: bool = False
    # under overload, the task hub's control queues back up: each orchestration
    # episode waits up to so many seconds before it runs (sim.durable), while faults last
    episode_wait: float = 0.0
    # per orchestration episode while faults last: its worker stalls (a frozen
    # VM, a long pause) and the episode runs 60-240 s late, so an attempt
    # that has its reply may reach its finishing write after its deadline,
    # the Supervisor's recovery and another attempt's whole run
    episode_stalls: float = 0.0
    # one client's reply queue refusing every send for hours, faults or not:
    # "disabled", "deleted", "forbidden" or "full", for so many seconds
    refusing_reply: str = ""
    refusing_seconds: float = 0.0
    # the `alerts` queue refusing every send for so long, faults or not:
    # "disabled", "forbidden" or "full" (sim.options._refusing_alerts)
    refusing_alerts: str = ""
    refusing_alerts_seconds: float = 0.0
    # a provider throttling the whole tenant for so many seconds (0: never):
    # every call to one service answered 429 with a Retry-After of 1-2 s
    tenant_throttle: float = 0.0
    # the agents' reply queue full for so many seconds while the first
    # standalone worker run receives (0: never)
    replies_full_in_worker: float = 0.0
    # Calls the fault surface found no seed to fail (issue 42), each from a
    # stream of its own (Faults.rare_rng): per delete of a document that is
    # not there, its 404 lost on the way back (reset, timeout, 408), as any
    # answer may be; per read by a host's start of a document created moments
    # ago by the other start of a pair (two instances setting up the
    # containers at once), a replica that has not seen the create (a 404)
    lost_404: float = 0.0
    start_lag: float = 0.0


@dataclass
class Fault:
    index: int
    kind: str
    at: str
    detail: str = ""

    def line(self) -> str:
        return f"#{self.index} {self.at} {self.kind} {self.detail}".rstrip()


@dataclass
class Outages:
    """One service's outage windows (Cosmos DB, Service Bus): windows drawn in
    time, and short ones that begin at a call (its number among the service's
    calls in the schedule) and last so many seconds. An outage starts at any
    instant, also between two calls of one actor, which a start drawn in time
    almost never is (an actor's calls are milliseconds apart)."""

    name: str
    windows: list[tuple[datetime, datetime]] = field(default_factory=list)
    blips: dict[int, float] = field(default_factory=dict)
    calls: int = 0

    def call(self, now: datetime, log: Callable[[str], None], active: bool) -> None:
        """Count a call; an outage drawn to begin at it opens now."""
        self.calls += 1
        blip = self.blips.pop(self.calls, None)
        if blip is not None and active:
            self.begin(now, blip)
            log(f"{self.name} outage for {blip}s from call {self.calls}")

    def begin(self, now: datetime, seconds: float) -> None:
        self.windows.append((now, now + timedelta(seconds=seconds)))

    def down(self, now: datetime) -> bool:
        return any(a <= now < b for a, b in self.windows)

    def until(self, now: datetime) -> datetime | None:
        """The end of the outage under way at `now`, if one is."""
        ends = [b for a, b in self.windows if a <= now < b]
        return max(ends) if ends else None


class Faults:
    """Every fault decision goes through `draw`, which consumes the fault RNG
    the same way whether or not the fault is dropped (shrinking), so dropping
    one fault leaves the others where they were."""

    def __init__(
        self, world: World, rng: random.Random, config: FaultConfig, drop: frozenset[int]
    ) -> None:
        self.world = world
        self.rng = rng
        self.config = config
        self.drop = drop
        self.injected: list[Fault] = []
        self.count = 0
        self.active = True
        self.storms: list[tuple[datetime, datetime]] = []
        self.outage: tuple[datetime, datetime, str] | None = None
        self.cosmos = Outages("cosmos")
        self.bus = Outages("bus")  # sends, schedules, settlements
        self.full: dict[str, Outages] = {}  # per queue: sends refused (entity_full)
        # per queue: (from, until, kind) a refusing entity (refusing_reply),
        # which outlasts the fault window: refused whether faults are on or not
        self.refusing: dict[str, tuple[datetime, datetime, str]] = {}
        # (from, until, service) a provider throttling the tenant (tenant_throttle)
        self.throttled: tuple[datetime, datetime, str] | None = None
        self.bus_outage_lost = 0.3
        self.link_drops_left = config.link_drops
        # The share of calls during the outage that are applied and answered
        # with a lost answer (a gateway timeout); 1.0 in an undo blackout.
        self.outage_lost = 0.3
        self._throttle_runs: dict[asyncio.Task | None, int] = {}  # the fault surface's
        self._forced_variant: str | None = None  # the targeted pass's, for _variant
        # The draws of the faults added last (FaultConfig.lost_404, start_lag):
        # a stream of their own, so that no other draw of a seed moves.
        self.rare_rng = random.Random(f"rare-faults/{world.seed}")

    def draw(
        self, probability: float, kind: str, detail: str = "", rng: random.Random | None = None
    ) -> bool:
        rng = rng or self.rng
        forced = None
        if SURFACE is not None and SURFACE.target is not None and self.active:
            # the fault surface's targeted pass: this call is the target's
            forced = SURFACE.force(kind, sys._getframe(1))
        if forced is not None:
            if probability > 0:
                rng.random()  # the draw it replaces
            self._forced_variant = SURFACE.variant(kind, forced)
            detail = f"{detail} (targeted {forced})".lstrip()
        else:
            if probability <= 0:
                return False
            hit = rng.random() < probability
            if not hit or not self.active:
                return False
        index = self.count
        self.count += 1
        if index in self.drop:
            self._forced_variant = None
            return False
        self.injected.append(Fault(index, kind, self.world.stamp(), detail))
        if SURFACE is not None:
            SURFACE.attribute_draw(kind, sys._getframe(1))
        return True

    def record(self, kind: str, detail: str) -> None:
        """A fault the targeted pass forced outside a draw (in the trace, not droppable)."""
        self.injected.append(Fault(self.count, kind, self.world.stamp(), detail))
        self.count += 1

    def hit(self, kind: str) -> None:
        """A fault that answers a call without a draw of its own (an outage or
        a decline met by a remote call, a lock found lost at a settlement):
        attributed to the call on the stack when the fault surface is on."""
        if SURFACE is not None:
            SURFACE.attribute(kind, sys._getframe(1))

    def cosmos_throttle(self, container: str) -> int | None:
        now = self.world.clock.now
        if self.active and any(a <= now < b for a, b in self.storms):
            self.world.counters["throttled"] += 1
            if SURFACE is not None:
                self._throttled_call(True)
            return 1000
        if SURFACE is not None:
            self._throttled_call(False)
        return None

    def _throttled_call(self, throttled: bool) -> None:
        """Count one request's consecutive 429s (per actor): the one that the
        SDK's retries no longer absorb reaches the product (sim/cosmos.py)."""
        from adapters.cosmos_client import DEFAULT_THROTTLE_RETRIES

        task = asyncio.current_task()
        runs = self._throttle_runs
        if not throttled:
            runs.pop(task, None)
            return
        runs[task] = runs.get(task, 0) + 1
        if runs[task] >= DEFAULT_THROTTLE_RETRIES + 1:
            runs.pop(task, None)
            SURFACE.attribute("throttle_429", sys._getframe(2))

    def session_lag(self, container: str) -> bool:
        return self.draw(self.config.lag, "session_lag", container)

    # --- the fallible world (issue 21). Each returns the fault kind to raise
    # (the fake builds the SDK's exception) and attributes it to the call.
    def _variant(self, kinds: tuple[str, ...]) -> str:
        """Which of `kinds` the fault just drawn is: by its index, so that no
        randomness is consumed only when a fault is kept (shrinking)."""
        forced, self._forced_variant = self._forced_variant, None
        if forced is not None:
            return forced
        return kinds[self.injected[-1].index % len(kinds)]

    def cosmos_call(self, container: str, op: str) -> str | None:
        """Before a Cosmos call's effect: None, or "outage" (every call fails
        for a window), "throttle_429" (past the SDK's own retries),
        "cosmos_503" or "refused" (no connection: a 503 to the caller)."""
        now = self.world.clock.now
        self.cosmos.call(now, self.world.log, self.active)
        if (
            SURFACE is not None
            and SURFACE.target is not None
            and self.active
            and SURFACE.force_outage(sys._getframe(1))
        ):
            # the targeted pass: an outage (a failover) that begins at this call
            self.cosmos.begin(now, TARGETED_OUTAGE_SECONDS)
            self.record("cosmos_outage", f"{container} {op} (targeted, {TARGETED_OUTAGE_SECONDS}s)")
        if self.active and self.cosmos.down(now):
            self.world.counters["cosmos_outage"] += 1
            self.hit("cosmos_outage")
            return "outage"
        if self.draw(self.config.cosmos_fail, "cosmos_fail", f"{container} {op}"):
            kind = self._variant(("throttle_429", "cosmos_503", "refused"))
            self.hit("throttle_429" if kind == "throttle_429" else "cosmos_503")
            return kind
        return None

    def cosmos_answer_lost(self, container: str, op: str, missing: bool = False) -> str | None:
        """After a Cosmos write's effect, or its 404 (`missing`: a delete of
        a document that is not there): None, or how its answer was lost
        ("reset", "client_timeout", "408")."""
        if missing:
            lost = self.draw(
                self.config.lost_404,
                "cosmos_answer_lost",
                f"{container} {op} (404)",
                rng=self.rare_rng,
            )
        else:
            lost = self.draw(self.config.cosmos_lost, "cosmos_answer_lost", f"{container} {op}")
        if lost:
            self.hit("cosmos_timeout_after")
            return self._variant(("reset", "client_timeout", "408"))
        return None

    def query_lag(self, container: str) -> bool:
        if self.draw(self.config.query_lag, "query_lag", container):
            self.hit("session_lag")
            return True
        return False

    def new_document_lag(self, container: str) -> bool:
        """A point read of a document created moments ago, on a replica that
        has not seen the create yet (a 404)."""
        if self.draw(self.config.query_lag, "new_document_lag", container):
            self.hit("session_lag")
            return True
        task = asyncio.current_task()
        if task is None or self.world._names.get(task, "") not in ("host", "host-2"):
            return False
        # A host's start, the other of a pair having just created it
        # (FaultConfig.start_lag): its own stream, drawn only there.
        if self.draw(
            self.config.start_lag, "new_document_lag", f"{container} (start)", rng=self.rare_rng
        ):
            self.hit("session_lag")
            return True
        return False

    def bus_outage(self, frame: Any = None) -> bool:
        """Whether this Service Bus call (its fake's frame) falls in an outage
        window (one may begin at this very call, also as the targeted pass's)."""
        now = self.world.clock.now
        self.bus.call(now, self.world.log, self.active)
        if (
            SURFACE is not None
            and SURFACE.target is not None
            and self.active
            and SURFACE.force_outage(frame, "servicebus_outage")
        ):
            self.bus.begin(now, TARGETED_OUTAGE_SECONDS)
            self.record("servicebus_outage", f"(targeted, {TARGETED_OUTAGE_SECONDS}s)")
        if self.active and self.bus.down(now):
            self.world.counters["bus_outage"] += 1
            return True
        return False

    def queue_full(self, queue: str) -> bool:
        """Whether a send or schedule to `queue` meets the queue full
        (FaultConfig.entity_full): refused, nothing sent."""
        window = self.full.get(queue)
        if self.active and window is not None and window.down(self.world.clock.now):
            self.world.counters["queue_full"] += 1
            self.hit("send_fail")
            return True
        return False

    def queue_refuses(self, queue: str) -> str | None:
        """How `queue` refuses a send now (FaultConfig.refusing_reply), or None."""
        window = self.refusing.get(queue)
        if window is None or not window[0] <= self.world.clock.now < window[1]:
            return None
        self.world.counters["queue_refused"] += 1
        self.hit("send_fail")
        return window[2]

    def bus_down_until(self) -> datetime | None:
        """The end of the Service Bus outage under way, if one is (no call
        counted: a receive that finds the namespace down)."""
        return self.bus.until(self.world.clock.now) if self.active else None

    def _lost_in_outage(self) -> bool:
        """A call during an outage applied with its answer lost (a gateway
        that forwarded it and timed out), from the world's own stream."""
        return self.world.data_rng.random() < self.bus_outage_lost

    def settle_fault(self, queue: str, kind: str) -> str | None:
        """A settlement (complete/abandon/dead-letter): None, or "dropped"
        (the link dropped before it: ServiceBusConnectionError), "lock_lost"
        (MessageLockLostError; the message is released), "after" (applied,
        its answer lost: OperationTimeoutError)."""
        if self.bus_outage(sys._getframe(1)):
            self.hit("servicebus_outage")
            return "after" if self._lost_in_outage() else "dropped"
        if self.draw(self.config.settle_fail, "settle_fail", f"{queue} {kind}"):
            variant = self._variant(("dropped", "lock_lost", "after"))
            self.hit(
                {"dropped": "settle_fail", "lock_lost": "lock_lost"}.get(
                    variant, "settle_timeout_after"
                )
            )
            return variant
        return None

    def send_fault(self, queue: str, message_id: str) -> str | None:
        """A send on any queue: None, or "refused" (ServiceBusConnectionError,
        nothing sent) or "after" (the broker took it, the answer was lost:
        OperationTimeoutError)."""
        if self.bus_outage(sys._getframe(1)):
            self.hit("servicebus_outage")
            return "after" if self._lost_in_outage() else "refused"
        if self.draw(self.config.send_lost, "send_lost", f"{queue} {message_id}"):
            variant = self._variant(("after", "refused"))
            self.hit("send_timeout_after" if variant == "after" else "send_fail")
            if variant == "after" and self.link_drops_left > 0 and self.active:
                self.link_drops_left -= 1
                seconds = round(self.world.data_rng.uniform(1.5, 6.0), 3)
                self.bus.begin(self.world.clock.now, seconds)
                self.world.log(f"bus link dropped after {queue} {message_id}: down {seconds}s")
            return variant
        return None

    def slow_answer(self, what: str) -> str | None:
        """A remote call whose answer comes after the client's timeout: None,
        or "applied" (the service did it) or "lost" (the request never got there)."""
        if self.draw(self.config.slow_answers, "slow_answer", what):
            self.hit("http_timeout")
            return self._variant(("applied", "lost"))
        return None


@dataclass(order=True)
class _Parked:
    ready_at: datetime
    seq: int
    name: str = field(compare=False)
    label: str = field(compare=False)
    future: asyncio.Future = field(compare=False)
    task: asyncio.Task = field(compare=False)
    # the fault surface: the product call parked here, and this actor's call before it
    site: Any = field(default=None, compare=False)
    previous: Any = field(default=None, compare=False)


class World:
    def __init__(self, seed: int, config: FaultConfig, drop: frozenset[int] = frozenset()) -> None:
        self.seed = seed
        self.rng = random.Random(f"sched/{seed}")
        self.data_rng = random.Random(f"data/{seed}")
        self.clock = Clock(START)
        self.faults = Faults(self, random.Random(f"faults/{seed}"), config, drop)
        self.trace: list[str] = []
        self.counters: Counter[str] = Counter()
        self.raised: list[
            tuple[str, Exception]
        ] = []  # (actor, exception) of every actor that raised
        self._parked: list[_Parked] = []
        self._names: dict[asyncio.Task, str] = {}
        self._events: list[tuple[datetime, int, str, Callable[[], None]]] = []
        self._seq = 0
        self.skews: dict[str, float] = {}
        self._crash_ok: dict[asyncio.Task, bool] = {}
        self._new: list[asyncio.Task] = []
        self._parked_tasks: set[asyncio.Task] = set()
        self.error: SimulatorError | None = None
        self._sites: dict[asyncio.Task, Any] = {}  # the fault surface's last call per actor

    # --- time and trace
    def stamp(self) -> str:
        return f"t+{(self.clock.now - START).total_seconds():.3f}"

    def log(self, text: str) -> None:
        self.trace.append(f"{self.stamp()} {text}")

    def skew(self, actor: str) -> float:
        if actor not in self.skews:
            bound = self.faults.config.skew
            self.skews[actor] = round(self.data_rng.uniform(-bound, bound), 3) if bound else 0.0
        return self.skews[actor]

    def now_for(self, actor: str) -> Callable[[], datetime]:
        return lambda: self.clock.at(self.skew(actor))

    # --- events (timers of the world)
    def at(self, when: datetime, label: str, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, label, fn))

    # --- actors
    def spawn(
        self,
        name: str,
        make: Callable[[], Awaitable[None]],
        on_crash: Callable[[], None] | None = None,
        crashable: bool = True,
    ) -> None:
        async def actor() -> None:
            await asyncio.sleep(0)
            try:
                await make()
            except Crash:
                self.log(f"CRASH {name}")
                self.counters["crash"] += 1
                if on_crash is not None:
                    on_crash()
            except Exception as exc:  # the host logs a function's exception and goes on
                if _raised_in_simulator(exc):
                    self.error = SimulatorError(f"{name}: the simulator itself raised {exc!r}")
                    self.error.__cause__ = exc
                    return
                self.log(f"{name} raised {type(exc).__name__}: {str(exc)[:120]}")
                self.counters["raised"] += 1
                self.raised.append((name, exc))
                if on_crash is not None:
                    on_crash()

        task = asyncio.get_running_loop().create_task(actor())
        self._names[task] = name
        self._crash_ok[task] = crashable
        self._new.append(task)

    async def point(self, label: str, delay: float | None = None) -> None:
        task = asyncio.current_task()
        name = self._names.get(task)
        if name is None:
            return  # setup and checks run outside the actors
        if delay is None:
            delay = self.rng.choice((0.0, 0.0, 0.005, 0.02, 0.1))
        fut = asyncio.get_running_loop().create_future()
        self._seq += 1
        parked = _Parked(
            self.clock.now + timedelta(seconds=delay), self._seq, name, label, fut, task
        )
        if SURFACE is not None and task is not None:
            parked.site = SURFACE.where(sys._getframe(1))
            parked.previous = self._sites.get(task)
            self._sites[task] = parked.site
        self._parked.append(parked)
        self._parked_tasks.add(task)
        await fut

    async def _settle(self, task: asyncio.Task) -> None:
        for _ in range(10_000):
            if self.error is not None:
                raise self.error
            if task.done() or task in self._parked_tasks:
                if self.error is not None:
                    raise self.error
                return
            await asyncio.sleep(0)
        raise RuntimeError(f"actor {self._names.get(task)} neither parked nor finished")

    async def run(self, until: datetime, idle: Callable[[], bool] | None = None) -> None:
        """Run actors and events until `until`, or until nothing is left to do
        and `idle()` says the world is quiet."""
        while True:
            while self._new:
                task = self._new.pop(0)
                await self._settle(task)
            now = self.clock.now
            ready = [p for p in self._parked if p.ready_at <= now]
            if ready:
                if len(ready) > 1:
                    ready.sort()
                chosen = ready[self.rng.randrange(len(ready))] if len(ready) > 1 else ready[0]
                self._parked.remove(chosen)
                self._parked_tasks.discard(chosen.task)
                forced = (
                    SURFACE is not None
                    and SURFACE.target is not None
                    and self.faults.active
                    and self._crash_ok.get(chosen.task)
                    and SURFACE.force_crash(chosen.site, chosen.previous, chosen.label)
                )
                if forced:
                    self.faults.record("crash", f"{chosen.name} at {chosen.label} (targeted)")
                if forced or (
                    self._crash_ok.get(chosen.task)
                    and self.faults.draw(
                        self.faults.config.crash, "crash", f"{chosen.name} at {chosen.label}"
                    )
                ):
                    if SURFACE is not None:
                        # died at this call (before its effect), and after its last one
                        SURFACE.at(chosen.site, "crash")
                        if chosen.previous is not None and not chosen.label.endswith("throttled"):
                            SURFACE.at(chosen.previous, "crash_after")
                    chosen.future.set_exception(Crash())
                else:
                    chosen.future.set_result(None)
                await self._settle(chosen.task)
                if chosen.task.done():
                    self._sites.pop(chosen.task, None)
                    self._names.pop(chosen.task, None)
                    self._crash_ok.pop(chosen.task, None)
                continue
            if self._events and self._events[0][0] <= self.clock.now:
                _, _, _label, fn = heapq.heappop(self._events)
                fn()
                continue
            nexts = [p.ready_at for p in self._parked]
            if self._events:
                nexts.append(self._events[0][0])
            if not nexts:
                return
            upcoming = min(nexts)
            if upcoming > until:
                self.clock.now = max(self.clock.now, until)
                return
            if not self._parked and idle is not None and idle():
                return
            self.clock.now = max(self.clock.now, upcoming)

    def pending_actors(self) -> int:
        return len(self._parked)


def utc(ts: datetime) -> datetime:
    return ts.astimezone(UTC)


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

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        """The event looked at every 20 ms of world time: an actor must park at
        a world point, never on a future another actor resolves."""
        waited = 0.0
        while not event.is_set():
            if waited >= seconds:
                return False
            await self.sleep(0.02)
            waited += 0.02
        return True


__all__ = ["START", "Clock", "Crash", "Fault", "FaultConfig", "Faults", "SimClock", "World", "utc"]
