"""The standalone agent worker in the simulation (issue 21): the product's own
`AgentWorker` loop (agents/worker) run as a host of its own beside the
queue-triggered agent, over a simulated receiver of the bus's
`agent-requests` queue.

- `SimQueueReceiver` is the azure.servicebus.aio receiver: `receive_messages`
  takes up to `max_message_count` messages in peek-lock (sim/bus.py's locks,
  redelivery, max delivery count), waiting up to `max_wait_time` of world time
  for the first; it fails as the SDK does (`receive_fail`): the link dropped
  (ServiceBusConnectionError), no answer in time (OperationTimeoutError), or
  no answer in time after the broker had locked messages to the dead link
  (they come back when their lock expires). It settles any message it handed
  out; the worker sees the SDK's 0-based delivery count.
- `SimRuntime` is the worker's `WorkerRuntime` seam: each handler is an actor
  of the world (its awaits are scheduling points, a crash can end it), waits
  poll at world points (virtual time: a stop, a finished handler, a timeout),
  and `SimLockRenewer` keeps a registered message's lock until its renewal
  duration ends or the renewer closes, then lets it expire (LOCK_DURATION).
- `WorkerHost` is one run of the worker process: started and stopped (SIGTERM:
  the drain) at moments drawn from the seed, with its own agent (circuit
  breakers), processor, concurrency limit and grace period. When its run ends
  it checks what the worker promises (`check`): a failed receive pauses and
  the loop goes on, every message received is registered with the renewer,
  handled and settled, and on a stop the requests in flight finish or are
  abandoned within the grace period."""

from __future__ import annotations

import asyncio
import itertools
import random
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusConnectionError

from adapters.settings import Settings
from adapters.settlement import BackoffPolicy
from agents.config import AgentSettings
from agents.messaging import RequestProcessor
from agents.worker import RECEIVE_RETRY_SECONDS, RECEIVE_WAIT_SECONDS, AgentWorker, WorkerRuntime
from reporting import Alerts

from .bus import LOCK_DURATION, Bus, Delivery, Msg, SimActions, reply_sender, rules_for
from .world import START, SimClock, World


class WorkerSchedule(Protocol):
    """What a worker run uses of its schedule (sim.drive.Simulation, which
    imports this module through sim.options: hence a protocol)."""

    seed: int
    world: World
    bus: Bus
    o: Any  # sim.options.Options
    settings: Settings
    servicebus: Any  # sim.bus.SimServiceBusClient
    publisher: Any

    def alerts(self) -> Alerts: ...

    def fail(self, check: str, detail: str) -> None: ...

    def _pump(self, queue: str) -> None: ...

    def _new_agent(self, clock: SimClock, rng: random.Random) -> Any: ...

    async def _agent_request(self, d: Delivery, processor: Any, settlement: Any) -> Any: ...


QUEUE = "agent-requests"
POLL = 0.25  # seconds of world time between two looks of a waiting worker
CHECK = "standalone worker"


@dataclass(frozen=True)
class WorkerRun:
    """One run of the standalone worker process: from `start` to its stop
    (seconds after the schedule's start), `concurrency` requests at once,
    `grace` seconds for those in flight at the stop; `share` is the part of
    the requests it takes while it runs (the Functions agent takes the rest)."""

    start: float
    stop: float
    concurrency: int
    grace: float
    share: float


def draw_workers(seed: int, fault_window: float) -> tuple[tuple[WorkerRun, ...], float]:
    """The worker runs of a schedule and its `receive_fail` probability, from
    a stream of their own (no other draw of the seed moves): half the
    schedules run one or two, each stopped within the fault window."""
    rng = random.Random(f"worker/{seed}")
    if rng.random() >= 0.5:
        return (), 0.0
    runs = []
    for _ in range(rng.choice((1, 1, 2))):
        start = round(rng.uniform(0, fault_window * 0.5), 3)
        stop = round(rng.uniform(start + 20, fault_window), 3)
        runs.append(
            WorkerRun(
                start,
                stop,
                concurrency=rng.choice((1, 2, 8)),
                grace=rng.choice((0.5, 5.0, 30.0)),
                share=rng.choice((0.5, 0.9)),
            )
        )
    return tuple(runs), rng.choice((0.0, 0.05, 0.2, 0.5))


class ReceivedMessage(Delivery):
    """A message as the worker's receiver hands it out: the SDK's delivery
    count is 0-based on the wire (the Functions binding's is 1-based)."""

    def __init__(self, bus: Any, queue: str, msg: Msg) -> None:
        super().__init__(bus, queue, msg)
        self.delivery_count = msg.delivery_count - 1


@dataclass
class _Handling:
    delivery: ReceivedMessage
    task: asyncio.Task | None = None
    settled: list[str] = field(default_factory=list)  # settlements it tried
    crashed: bool = False
    ended: datetime | None = None  # when its handler ended


class SimQueueReceiver:
    """`ServiceBusClient.get_queue_receiver(queue, PEEK_LOCK, prefetch_count=0)`."""

    def __init__(self, host: WorkerHost) -> None:
        self.host = host

    async def __aenter__(self) -> SimQueueReceiver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[ReceivedMessage]:
        host, world = self.host, self.host.world
        faults = world.faults
        host.receive_calls.append(world.clock.now)
        await world.point(f"bus.receive.{QUEUE}")
        count = max_message_count or 1
        if faults.draw(faults.config.receive_fail, "receive_fail", f"{QUEUE} {host.name}"):
            host.receive_failed.append(world.clock.now)
            variant = faults._variant(("dropped", "timeout", "locked"))
            world.log(f"{host.name} receive from {QUEUE} failed ({variant})")
            if variant == "dropped":
                raise ServiceBusConnectionError(message=f"receiving from {QUEUE}: link detached")
            if variant == "locked":
                for d in host.take(count, handed_out=False):
                    host.expire(d, LOCK_DURATION.total_seconds(), "lock expired (receive lost)")
            raise OperationTimeoutError(message=f"receiving from {QUEUE}: no answer in time")
        end = world.clock.now + timedelta(seconds=max_wait_time or 0.0)
        while True:
            got = host.take(count)
            left = (end - world.clock.now).total_seconds()
            if got or left <= 0:
                return got
            await world.point(f"bus.receive.{QUEUE}.wait", delay=min(POLL, left))

    # --- settlements (ReceiverSettlement's), of any message it handed out
    async def complete_message(self, message: ReceivedMessage) -> None:
        self.host.settling(message, "complete")
        SimActions(message).complete(message)

    async def abandon_message(self, message: ReceivedMessage) -> None:
        self.host.settling(message, "abandon")
        SimActions(message).abandon(message)

    async def dead_letter_message(
        self,
        message: ReceivedMessage,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        self.host.settling(message, "deadletter")
        SimActions(message).deadletter(message, reason, error_description)


class _SimClient:
    """What AgentWorker.run needs of the ServiceBusClient."""

    def __init__(self, host: WorkerHost) -> None:
        self.host = host

    def get_queue_receiver(self, queue: str, **_: Any) -> SimQueueReceiver:
        assert queue == QUEUE, queue
        return SimQueueReceiver(self.host)


class SimLockRenewer:
    """AutoLockRenewer: a registered message keeps its lock (the bus's locks
    do not run out on their own) until its renewal duration ends or the
    renewer is closed; then it expires LOCK_DURATION later unless settled."""

    def __init__(self, host: WorkerHost) -> None:
        self.host = host
        self.closed = False

    def register(
        self,
        receiver: Any,
        renewable: ReceivedMessage,
        max_lock_renewal_duration: float | None = None,
        on_lock_renew_failure: Any = None,
    ) -> None:
        host = self.host
        host.to_spawn.append(renewable)
        host.registered.add(renewable.token)
        duration = (max_lock_renewal_duration or 0.0) + LOCK_DURATION.total_seconds()
        host.expire(renewable, duration, "lock expired (renewal ended)")

    async def close(self) -> None:
        self.closed = True
        for h in self.host.handlings.values():
            self.host.expire(
                h.delivery, LOCK_DURATION.total_seconds(), "lock expired (renewer closed)"
            )


class SimRuntime(WorkerRuntime):
    def __init__(self, host: WorkerHost) -> None:
        self.host = host

    def spawn(self, handling: Any) -> asyncio.Task[None]:
        host, world = self.host, self.host.world
        if not host.to_spawn:
            raise AssertionError("the worker started a handler for a message it did not register")
        d = host.to_spawn.pop(0)
        h = host.handlings[d.token]

        async def run() -> None:
            try:
                await handling
            finally:
                h.ended = world.clock.now
                world.at(world.clock.now, "pump", lambda: host.sim._pump(QUEUE))
                host.wake()  # as asyncio.wait would, at once

        def crashed() -> None:
            h.crashed = True
            host.expire(d, LOCK_DURATION.total_seconds(), "lock timed out")

        world.spawn(f"agent:{d.message_id}", run, on_crash=crashed)
        task = world._new[-1]  # the actor's task (World.spawn keeps it there until it starts)
        assert world._names.get(task) == f"agent:{d.message_id}"
        h.task = task
        _SPAWNED[task] = next(_SPAWNS)
        if host.stop_when_busy and host.full():
            host.stop_when_busy = False
            world.at(world.clock.now, f"{host.name} stop", lambda: host._stop(force=True))
        return task

    async def wait(
        self, tasks: set[asyncio.Task[Any]], timeout: float | None = None, first: bool = False
    ) -> set[asyncio.Task[Any]]:
        world = self.host.world
        _forget_cancelled(world)
        end = None if timeout is None else world.clock.now + timedelta(seconds=timeout)
        while True:
            pending = _Ordered(t for t in tasks if not t.done())
            if not pending or (first and len(pending) < len(tasks)):
                return pending
            left = None if end is None else (end - world.clock.now).total_seconds()
            if left is not None and left <= 0:
                return pending
            await world.point(
                f"{self.host.name}.wait", delay=POLL if left is None else min(POLL, left)
            )

    def renewer(self) -> Any:
        return SimLockRenewer(self.host)


class _Ordered(set):
    """The pending tasks a wait returns, iterated in the order the worker
    started them: a set of tasks iterates by their ids (memory addresses),
    and the drain cancels them in that order, which would make a schedule
    differ from one process to the next."""

    def __init__(self, tasks: Any) -> None:
        self._order = sorted(tasks, key=_started)
        super().__init__(self._order)

    def __iter__(self) -> Any:
        return iter([t for t in self._order if t in self])


def _started(task: asyncio.Task[Any]) -> int:
    return _SPAWNED.get(task, -1)


_SPAWNED: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
_SPAWNS = itertools.count()


def _forget_cancelled(world: Any) -> None:
    """A handler cancelled by the drain was parked at a world point: its
    parked entry (a cancelled future) must not be resumed by the world."""
    stale = [p for p in world._parked if p.future.cancelled()]
    for p in stale:
        world._parked.remove(p)
        world._parked_tasks.discard(p.task)


class WorkerHost:
    """One run of the standalone worker process (`WorkerRun`)."""

    def __init__(self, sim: WorkerSchedule, k: int, run: WorkerRun) -> None:
        self.sim = sim
        self.world = sim.world
        self.run = run
        self.name = f"worker{k}"
        self.rng = random.Random(f"worker/share/{sim.seed}/{k}")
        self.started = False
        self.stopped_at: datetime | None = None
        self.ended: datetime | None = None
        self.receive_calls: list[datetime] = []
        self.receive_failed: list[datetime] = []
        self.registered: set[int | None] = set()
        self.to_spawn: list[ReceivedMessage] = []
        self.handlings: dict[int | None, _Handling] = {}
        self.stop = asyncio.Event()
        self.task: asyncio.Task | None = None  # the loop's actor
        # Half the runs with a limit of 1 or 2 are stopped while they are at
        # their limit (the loop then waits on its handlers or the stop, and
        # drains them at once): a stop that finds it below waits for that,
        # until the end of the fault window. From a stream of its own.
        self.busy_stop = (
            run.concurrency <= 2 and random.Random(f"worker/busy/{sim.seed}/{k}").random() < 0.5
        )
        self.stop_when_busy = False
        w = self.world
        clock = SimClock(w, self.name)
        self.agent = sim._new_agent(clock, random.Random(f"agent/{sim.seed}/{self.name}"))
        self.processor = RequestProcessor(
            self.agent,
            reply_sender(sim.servicebus),
            sim.alerts(),
            BackoffPolicy(max_delivery_count=rules_for(QUEUE).max_delivery),
            keys=sim.settings.scheduler_keys().agents,
            scheduler=sim.publisher,
            clock=clock,
        )
        self.settings = AgentSettings(
            max_concurrency=run.concurrency, shutdown_grace=run.grace, keys=sim.settings.agent_keys
        )
        self.clock = clock

    @property
    def live(self) -> bool:
        """Receiving: started and not told to stop."""
        return self.started and not self.stop.is_set()

    def takes(self) -> bool:
        """Whether it takes the next request (instead of the Functions agent)."""
        return self.live and self.rng.random() < self.run.share

    def wake(self) -> None:
        """A wait of the worker loop (a free slot, the pause, the drain) ends
        now, not at its next look: asyncio.wait returns when a task is done,
        the stop's wait when it is set. It looks again and goes on or waits."""
        now = self.world.clock.now
        for p in self.world._parked:
            if p.task is self.task and p.label == f"{self.name}.wait" and p.ready_at > now:
                p.ready_at = now

    def full(self) -> bool:
        running = [h for h in self.handlings.values() if h.task is not None and not h.task.done()]
        return len(running) >= self.run.concurrency

    def install(self, start: datetime) -> None:
        w = self.world
        w.at(start + timedelta(seconds=self.run.start), f"{self.name} start", self._start)
        w.at(start + timedelta(seconds=self.run.stop), f"{self.name} stop", self._stop)
        latest = start + timedelta(seconds=self.sim.o.fault_window)
        w.at(latest, f"{self.name} stop", lambda: self._stop(force=True))

    def _start(self) -> None:
        self.started = True
        self.world.log(f"{self.name} starts")
        self.world.spawn(self.name, self._serve, crashable=False)

    def _stop(self, force: bool = False) -> None:
        if self.stop.is_set() or not self.started:
            return
        if self.busy_stop and not force and not self.full():
            self.stop_when_busy = True
            self.world.log(f"{self.name} stop deferred until it is at its limit")
            return
        self.stopped_at = self.world.clock.now
        self.world.log(f"{self.name} stop (SIGTERM)")
        self.stop.set()
        self.wake()

    async def _serve(self) -> None:
        worker = AgentWorker(
            _SimClient(self),  # type: ignore[arg-type]
            _Checked(self.sim, self.processor),  # type: ignore[arg-type]
            self.settings,
            clock=self.clock,
            runtime=SimRuntime(self),
        )
        self.task = asyncio.current_task()
        try:
            await worker.run(self.stop)
        finally:
            self.ended = self.world.clock.now
            self.world.log(f"{self.name} ended")
            self.world.at(self.ended, "pump", lambda: self.sim._pump(QUEUE))
            self.check()

    # --- the bus side
    def take(self, count: int, handed_out: bool = True) -> list[ReceivedMessage]:
        sim, w = self.sim, self.world
        got: list[ReceivedMessage] = []
        while len(got) < count:
            msg = sim.bus.receivable(QUEUE)
            if msg is None:
                break
            d = ReceivedMessage(sim.bus, QUEUE, msg)
            w.log(f"{self.name} receive {QUEUE} {msg.message_id} #{msg.delivery_count}")
            faults = w.faults
            if faults.draw(faults.config.lock_expiry, "lock_expiry", f"{QUEUE} {msg.message_id}"):
                self.expire(d, round(w.rng.uniform(0.01, 1.0), 3), "lock expired")
            if handed_out:
                w.counters["worker received"] += 1
                self.handlings[d.token] = _Handling(d)
            got.append(d)
        return got

    def expire(self, d: Delivery, seconds: float, why: str) -> None:
        """The lock of `d` ends `seconds` from now unless it was settled."""

        def end() -> None:
            self.sim.bus.release(QUEUE, d.msg, d.token, why)  # a no-op once settled
            self.sim._pump(QUEUE)

        self.world.at(self.world.clock.now + timedelta(seconds=seconds), why, end)

    def settling(self, message: ReceivedMessage, kind: str) -> None:
        h = self.handlings.get(message.token)
        if h is not None:
            h.settled.append(kind)

    # --- what the worker promises
    def check(self) -> None:
        """When its run ended: the first breach of each promise, if any."""
        found: dict[str, str] = {}

        def fail(what: str, detail: str) -> None:
            found.setdefault(what, f"{self.name} {detail}")

        run, stop, ended = self.run, self.stopped_at, self.ended
        assert ended is not None
        if stop is None or ended < stop:
            fail("ended", f"ended its receive loop at {_t(ended)}, before its stop")
        elif not self.sim.o.faults.host_outage:
            # the receive under way (not cut short), the grace, the cancelled
            # handlers' abandons: each a few of the world's points
            bound = RECEIVE_WAIT_SECONDS + run.grace + 4 * POLL + 1.0
            if (ended - stop).total_seconds() > bound:
                fail("grace", f"stopped at {_t(stop)}, ended at {_t(ended)}: past its grace")
        for failed in self.receive_failed:
            after = [t for t in self.receive_calls if t > failed]
            resumed = failed + timedelta(seconds=RECEIVE_RETRY_SECONDS)
            if after and after[0] < resumed and (stop is None or stop > resumed):
                fail(
                    "pause",
                    f"received again at {_t(after[0])}, less than {RECEIVE_RETRY_SECONDS} s "
                    f"after its receive failed at {_t(failed)}: no pause",
                )
        for token, h in self.handlings.items():
            what = f"{h.delivery.message_id} (token {token})"
            if token not in self.registered:
                fail("renewer", f"never registered {what} with the lock renewer")
            if h.task is None:
                fail("handled", f"received {what} and never handled it")
            elif not h.task.done():
                fail("drained", f"ended with the handler of {what} still running")
            elif h.task.cancelled():
                self.world.counters["worker cancelled at stop"] += 1
                if "abandon" not in h.settled:
                    fail("abandoned", f"cancelled the handler of {what} without abandoning it")
            elif not h.crashed and not h.settled:
                fail("settled", f"handled {what} and never settled it")
        for detail in found.values():
            self.sim.fail(CHECK, detail)


def _t(at: datetime) -> str:
    return f"t+{(at - START).total_seconds():.3f}"


class _Checked:
    """The worker's RequestProcessor with the simulation's per-delivery checks
    around it, as `Simulation._handle` has them for the Functions agent."""

    def __init__(self, sim: WorkerSchedule, processor: Any) -> None:
        self.sim = sim
        self.processor = processor

    async def process_message(self, message: ReceivedMessage, settlement: Any) -> Any:
        return await self.sim._agent_request(message, self.processor, settlement)
