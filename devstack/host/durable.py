"""The Durable extension's work: orchestration episodes, activities, and the client operations.

Two dispatchers run on the host's loop:

* orchestrations: claim an instance that has visible control messages, replay it with
  the past history plus the new events (`replay.run_episode`), and commit the new
  history, the activities and timers it scheduled, its status and the consumed
  messages in one transaction;
* activities: claim a work item, run the activity, and in one transaction delete the
  item and enqueue its TaskCompleted/TaskFailed. A host killed mid-activity leaves the
  item to be claimed again: activities run at least once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from azure.functions import meta
from azure.functions.durable_functions import ActivityTriggerConverter

from .app import AppCatalog
from .clock import ACTIVITIES, ENTITIES, ORCHESTRATIONS, Clock
from .config import DurableOptions
from .durable_http import run_http_activity
from .entities import EntityEngine
from .errors import NonDeterminismError
from .invoke import call_function
from .replay import HTTP_ACTIVITY, SCHEDULING_EVENTS, run_episode
from .store import TERMINAL, Claim, EpisodeRead, Instance, Store, TurnWrites, TurnWritten

log = logging.getLogger("devstack.host.durable")

EXECUTION_STARTED = 0
EXECUTION_COMPLETED = 1
EXECUTION_TERMINATED = 3
TASK_SCHEDULED = 4
TASK_COMPLETED = 5
TASK_FAILED = 6
SUB_ORCHESTRATION_CREATED = 7
SUB_ORCHESTRATION_COMPLETED = 8
SUB_ORCHESTRATION_FAILED = 9
TIMER_CREATED = 10
TIMER_FIRED = 11
ORCHESTRATOR_STARTED = 12
ORCHESTRATOR_COMPLETED = 13
EVENT_SENT = 14
EVENT_RAISED = 15
GENERIC_EVENT = 17
EXECUTION_SUSPENDED = 19
EXECUTION_RESUMED = 20


@functools.lru_cache(maxsize=4096)
def iso(dt: datetime) -> str:
    """The host's timestamp text, `%Y-%m-%dT%H:%M:%S.%fZ`. Remembered: an episode stamps all
    its events with one `now`; and `isoformat` of the naive UTC time, not strftime (which was
    3-5 % of the host's CPU in bench/host_bench.py, half of it again as `isoformat`)."""
    if dt.tzinfo is not UTC:
        dt = dt.astimezone(UTC)
    return dt.isoformat(timespec="microseconds")[:-6] + "Z"  # "+00:00" becomes "Z"


@functools.lru_cache(maxsize=256)
def _version_key(version: str) -> tuple[Any, ...]:
    """Compare versions numerically when they look like 1.2.3, else as text. Remembered:
    every episode compares its instance's version with the host's, and an app has few."""
    parts = version.split(".")
    if all(p.isdigit() for p in parts if p) and version:
        return (0, *[int(p) for p in parts])
    return (1, version)


def _event(event_type: int, when: datetime, EventId: int = -1, **fields: Any) -> dict[str, Any]:
    return {
        "EventType": event_type,
        "EventId": EventId,
        "IsPlayed": False,
        "Timestamp": iso(when),
        **fields,
    }


# Parsed histories kept per instance (the most recently used); a few thousand short
# histories are a few MB.
HISTORY_CACHE_SIZE = 2000

# How often a write of this host may search the inbox for ready instances (`_next_claim`).
SEARCH_EVERY = 0.05


def _played(rows: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The events of history rows just decoded (dicts of their own), marked played."""
    events = [e for _, e in rows]
    for e in events:
        e["IsPlayed"] = True
    return events


@dataclass
class _CachedHistory:
    execution_id: str
    max_seq: int | None
    events: list[dict[str, Any]]


@dataclass
class StartResult:
    ok: bool
    instance_id: str
    error: str | None = None
    not_found: bool = False


@dataclass
class _Turn:
    """What reached the loop in one turn to be written besides episodes: HTTP starts and
    raised events, each with the future its caller awaits, and finished activities'
    results (work item row, result event)."""

    starts: list[tuple[dict[str, Any], asyncio.Future[StartResult]]] = field(default_factory=list)
    raises: list[tuple[tuple[str, dict[str, Any]], asyncio.Future[str | None]]] = field(
        default_factory=list
    )
    results: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.starts or self.raises or self.results)

    def __str__(self) -> str:
        return f"{len(self.starts)} starts, {len(self.raises)} events and {len(self.results)} activity results"

    def writes(self) -> TurnWrites:
        return TurnWrites(
            starts=[start for start, _ in self.starts],
            raises=[raised for raised, _ in self.raises],
            results=[
                (row["id"], row["instance_id"], row["execution_id"], event)
                for row, event in self.results
            ],
        )

    def put_back(self, into: _Turn) -> None:
        """Ahead of what reached `into` since (a batch of episodes took them, then failed)."""
        into.starts[:0] = self.starts
        into.raises[:0] = self.raises
        into.results[:0] = self.results


class DurableEngine:
    def __init__(
        self,
        store: Store,
        catalog: AppCatalog,
        clock: Clock,
        options: DurableOptions,
        client_binding: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.clock = clock
        self.options = options
        self.client_binding = client_binding or {}
        self._activity_tasks: set[asyncio.Task[None]] = set()
        # Episodes' writes, committed together when a batch of episodes has run
        # (`_run_episodes`), and the turn's other writes, written at its end (`_flush_writes`)
        # or with a batch of episodes written before it.
        self._episode_writes: list[dict[str, Any]] = []
        self._turn = _Turn()
        self._flush_scheduled = False
        self._activities_full = False
        # Instances a write of this host locked for it on the way (`Claim`), run next.
        self._claimed: list[str] = []
        self._stopping = False
        self._rejected_until: dict[str, float] = {}
        self._searched_at = 0.0
        self._histories: dict[str, _CachedHistory] = {}
        self.entities = EntityEngine(store, catalog, clock, options.max_concurrent_orchestrators)

    # ---- client operations -------------------------------------------------------------

    def start_new(
        self, name: str, instance_id: str | None, input_json: str | None, version: str | None
    ) -> StartResult:
        start = self._prepare_start(name, instance_id, input_json, version)
        if isinstance(start, StartResult):
            return start
        # Locked for this host with the start's write when there is room: the first episode
        # needs no claim (and no search of the inbox) of its own.
        blocking, claimed = self.store.create_or_restart_instance(
            **start, claim=self._next_claim(only=[start["instance_id"]])
        )
        self._claimed += claimed
        return self._started(start["instance_id"], blocking)

    async def start_new_batched(
        self, name: str, instance_id: str | None, input_json: str | None, version: str | None
    ) -> StartResult:
        """`start_new`, written with the loop turn's other writes (`_flush_writes`), where
        each start was a transaction and a COMMIT of its own (about a tenth of the loop's
        time in bench/host_bench.py, 2,000 starts at once). The start is answered, as
        before, only once it is committed."""
        start = self._prepare_start(name, instance_id, input_json, version)
        if isinstance(start, StartResult):
            return start
        done: asyncio.Future[StartResult] = asyncio.get_running_loop().create_future()
        self._turn.starts.append((start, done))
        self._schedule_flush()
        return await done

    @staticmethod
    def _start_args(start: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": start["name"],
            "instance_id": start["instance_id"],
            "input_json": start["input_json"],
            "version": start["version"],
        }

    def _prepare_start(
        self, name: str, instance_id: str | None, input_json: str | None, version: str | None
    ) -> StartResult | dict[str, Any]:
        """A start's row and ExecutionStarted (`create_or_restart_instance`'s arguments), or
        the refusal of an orchestrator the app does not have."""
        if self.catalog.orchestrator(name) is None:
            return StartResult(
                False,
                instance_id or "",
                not_found=True,
                error=(
                    f"The function '{name}' doesn't exist, is disabled, or is not an orchestrator function. "
                    f"Additional info: the app's orchestrator functions are: "
                    f"{', '.join(f.orchestration_name for f in self.catalog.of_type('orchestrationTrigger'))}"
                ),
            )
        iid = instance_id or uuid.uuid4().hex
        version = version if version is not None else self.options.default_version
        now = self.clock.now()
        execution_id = uuid.uuid4().hex
        started = _event(
            EXECUTION_STARTED,
            now,
            Name=name,
            Version=version or "",
            Input=input_json,
            OrchestrationInstance={"InstanceId": iid, "ExecutionId": execution_id},
        )
        return dict(
            instance_id=iid,
            name=name,
            version=version,
            execution_id=execution_id,
            input_json=input_json,
            started_event=started,
            now_iso=iso(now),
            now_epoch=now.timestamp(),
        )

    def _started(self, instance_id: str, blocking: str | None) -> StartResult:
        if blocking is not None:
            return StartResult(
                False,
                instance_id,
                error=f"An Orchestration instance with the status {blocking} already exists.",
            )
        self.clock.poke(ORCHESTRATIONS)
        return StartResult(True, instance_id)

    async def raise_event_batched(
        self, instance_id: str, name: str, data_json: str | None
    ) -> str | None:
        """Raise an event, written with the loop turn's other writes (`_flush_writes`), in
        order (each reply an app hands to the durable client was a transaction and a COMMIT
        of its own); the instance is locked for this host in the same write when it is free.
        Returns once the event is committed (None), or what refused it: `MISSING` (no such
        instance) or the instance's terminal status."""
        event = _event(EVENT_RAISED, self.clock.now(), Name=name, Input=data_json)
        done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._turn.raises.append(((instance_id, event), done))
        self._schedule_flush()
        return await done

    # ---- the loop turn's writes --------------------------------------------------------

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_writes)

    def _take_turn(self) -> _Turn | None:
        turn, self._turn = self._turn, _Turn()
        return turn if turn else None

    def _flush_writes(self) -> None:
        """Write the starts, raised events and activity results that reached the loop in
        this turn, in one transaction that also locks the instances they wake for this host
        (unless a batch of episodes took them into its own first, `_run_episodes`). If it
        fails they are written one by one, so one item's failure stays its own."""
        self._flush_scheduled = False
        turn = self._take_turn()
        if turn is None:
            return
        try:
            out = self.store.write_turn(turn.writes(), claim=self._next_claim(only=[]))
        except Exception:
            log.warning("writing a turn's %s failed; writing them one by one", turn, exc_info=True)
            self._write_one_by_one(turn)
            return
        self._claimed.extend(out.claimed)
        self._answer(turn, out)

    def _answer(self, turn: _Turn, out: TurnWritten) -> None:
        for (start, done), blocking in zip(turn.starts, out.blocking, strict=True):
            if not done.done():
                done.set_result(self._started(start["instance_id"], blocking))
        for (_, done), refusal in zip(turn.raises, out.refused, strict=True):
            if not done.done():
                done.set_result(refusal)
        for (row, _), ok in zip(turn.results, out.results, strict=True):
            if not ok:
                log.warning(
                    "activity %s for %s finished after its lock was lost; the other run's result wins",
                    row["name"],
                    row["instance_id"],
                )
        self.clock.poke(ORCHESTRATIONS)

    def _write_one_by_one(self, turn: _Turn) -> None:
        for start, started in turn.starts:
            self._settle(started, lambda s=start: self.start_new(**self._start_args(s)))
        for (iid, event), raised in turn.raises:
            self._settle(raised, lambda i=iid, e=event: self._enqueue_raised(i, e))
        for row, event in turn.results:
            try:
                out = self.store.write_turn(
                    TurnWrites(
                        results=[(row["id"], row["instance_id"], row["execution_id"], event)]
                    ),
                    claim=self._next_claim(only=[]),
                )
            except Exception:
                log.exception(
                    "the result of activity %s for %s was not written; it runs again once "
                    "its work item is free",
                    row["name"],
                    row["instance_id"],
                )
                continue
            self._claimed.extend(out.claimed)
            self._answer(_Turn(results=[(row, event)]), out)
        self.clock.poke(ORCHESTRATIONS)

    def _enqueue_raised(self, instance_id: str, event: dict[str, Any]) -> str | None:
        """One raised event on its own: refused as `Store.write_turn` refuses it."""
        refusal = self.store.event_refusal(instance_id)
        if refusal is not None:
            return refusal
        self._claimed += self.store.enqueue(
            instance_id, None, event, claim=self._next_claim(only=[instance_id])
        )
        return None

    @staticmethod
    def _settle(done: asyncio.Future[Any], write: Callable[[], Any]) -> None:
        """Answer `done` with what `write` returns, or the exception it raises."""
        try:
            result = write()
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)
            return
        if not done.done():
            done.set_result(result)

    def restart(self, instance_id: str, new_instance_id: bool) -> StartResult | None:
        """Start the instance's orchestration again with its original input (RestartAsync)."""
        inst = self.store.get_instance(instance_id)
        if inst is None:
            return None
        target = uuid.uuid4().hex if new_instance_id else instance_id
        return self.start_new(inst.name, target, inst.input, inst.version)

    def rewind(self, instance_id: str, reason: str | None) -> str | None:
        now = self.clock.now()
        blocking = self.store.rewind(
            instance_id, _event(GENERIC_EVENT, now, Data=f"Rewound: {reason or ''}"), iso(now)
        )
        self.clock.poke(ORCHESTRATIONS)
        return blocking

    def suspend(self, instance_id: str, reason: str | None) -> None:
        self.store.enqueue(
            instance_id, None, _event(EXECUTION_SUSPENDED, self.clock.now(), Reason=reason)
        )
        self.clock.poke(ORCHESTRATIONS)

    def resume(self, instance_id: str, reason: str | None) -> None:
        self.store.enqueue(
            instance_id, None, _event(EXECUTION_RESUMED, self.clock.now(), Reason=reason)
        )
        self.clock.poke(ORCHESTRATIONS)

    def terminate(self, instance_id: str, reason: str | None) -> None:
        self.store.enqueue(
            instance_id,
            None,
            _event(EXECUTION_TERMINATED, self.clock.now(), Input=json.dumps(reason)),
        )
        self.clock.poke(ORCHESTRATIONS)

    # ---- dispatch loops ----------------------------------------------------------------

    async def run(self) -> None:
        await asyncio.gather(self._orchestration_loop(), self._activity_loop(), self.entities.run())

    def stop(self) -> None:
        self._stopping = True
        self.entities.stop()
        self.clock.poke()

    async def drain(self, timeout: float) -> None:
        """Let running episodes and activities finish (a host stopping cleanly does)."""
        pending = [*self._activity_tasks, *self.entities.tasks]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        self._flush_writes()
        # Claimed on the way but not run: let another host have them at once.
        for instance_id in self._claimed:
            self.store.unlock_instance(instance_id)
        self._claimed = []

    async def _orchestration_loop(self) -> None:
        while not self._stopping:
            now = self.clock.now()
            real_now = time.monotonic()
            most = self.options.max_concurrent_orchestrators
            searched = real_now - self._searched_at
            if self._claimed:
                claimed, self._claimed = self._claimed[:most], self._claimed[most:]
            elif searched >= SEARCH_EVERY:
                self._searched_at = real_now
                skip = {i for i, t in self._rejected_until.items() if t > real_now}
                claimed = self.store.claim_instances(now.timestamp(), most, skip)
            else:
                # Woken for work a write of this host locked by name (or none) just after a
                # search: the next search is due in a moment.
                await self.clock.wait(None, max_wait=SEARCH_EVERY - searched, topic=ORCHESTRATIONS)
                continue
            if claimed:
                self._run_episodes(claimed)
                await asyncio.sleep(0)
                continue
            next_due = self.store.next_due()
            # Work already visible but not claimable (locked by another host, rejected) must not spin.
            future_due = next_due is not None and next_due > now.timestamp()
            deadline = datetime.fromtimestamp(next_due, UTC) if future_due else None
            # Poll as well: another host process may have written work into the shared hub.
            await self.clock.wait(deadline, max_wait=0.25, topic=ORCHESTRATIONS)

    def _run_episodes(self, instance_ids: list[str]) -> None:
        """Run one episode of each claimed instance, then write them all in one transaction
        (each episode's writes are atomic either way; a batch takes the hub's write lock and
        commits once instead of once per episode, and holds the lock only for the writes).
        An instance stays locked by this host until its episode is written. An episode that
        raises, or a batch whose write fails, leaves its instances unlocked and retried in 5 s.
        What the episodes read is read for them all at once (`Store.episode_reads`)."""
        wanted = [(i, self._cached_top(i)) for i in dict.fromkeys(instance_ids)]
        reads: dict[str, EpisodeRead] = {}
        if wanted:
            try:
                reads = self.store.episode_reads(wanted, self.clock.now().timestamp())
            except Exception:
                log.exception("reading %d episodes failed; retrying them in 5 s", len(wanted))
                for instance_id, _ in wanted:
                    self._retry_later(instance_id)
        for instance_id, after in wanted:
            if instance_id not in reads:
                continue
            try:
                self._episode(instance_id, after, reads[instance_id])
            except Exception:
                log.exception(
                    "orchestration episode for %s failed inside the host; retrying in 5 s",
                    instance_id,
                )
                self._retry_later(instance_id)
        writes, self._episode_writes = self._episode_writes, []
        if not writes:
            return
        # The turn's other writes waiting for `_flush_writes` go in the same transaction.
        turn = self._take_turn()
        try:
            # This host runs the new activities itself as far as it has free slots, and
            # takes the instances that are ready by now (those whose activity results or
            # events came meanwhile) for its next batch: no claim of their own for either.
            out = self.store.commit_episodes(
                writes,
                own_activities=self._free_activity_slots(),
                claim=self._next_claim(),
                turn=turn.writes() if turn is not None else None,
            )
        except Exception:
            log.exception("writing %d episodes failed; retrying them in 5 s", len(writes))
            for w in writes:
                self._retry_later(w["instance_id"])
            if turn is not None:  # written on their own, as if no episode had come first
                turn.put_back(self._turn)
                self._schedule_flush()
            return
        for w, ok, first in zip(writes, out.written, out.first_seq, strict=True):
            if not ok:
                log.warning("lost the lock on %s; its episode will run again", w["instance_id"])
                self._histories.pop(w["instance_id"], None)
            elif w["status"] in TERMINAL:
                self._histories.pop(w["instance_id"], None)  # read no more
            else:
                self._remember_written(w, first)
        self._claimed.extend(out.claimed)
        if turn is not None and out.turn is not None:
            self._answer(turn, out.turn)
        self._start_activities(out.activities)
        # Activity work left for any host, or entity operations: wake those loops.
        if sum(len(w["activities"]) for w in writes) > len(out.activities):
            self.clock.poke(ACTIVITIES)
        if any(w.get("entity_ops") for w in writes):
            self.clock.poke(ENTITIES)

    def _write(self, **episode: Any) -> None:
        """Queue one episode's writes (`Store._commit_episode_in_tx`) for its batch."""
        self._episode_writes.append(episode)

    def _next_claim(self, only: list[str] | None = None) -> Claim:
        """What a write should lock for this host on the way: the instances in `only`, or
        (None) any ready ones, found by a search of the inbox. The search runs at most every
        `SEARCH_EVERY` s: the work this host makes (starts, events, activity results) it
        locks by name, so a search finds only timers and other hosts' work, and a batch's
        write that searched each time spent more on it than on the writes (host_bench)."""
        real_now = time.monotonic()
        if only is None:
            if real_now - self._searched_at < SEARCH_EVERY:
                only = []
            else:
                self._searched_at = real_now
        skip = {i for i, t in self._rejected_until.items() if t > real_now}
        return Claim(
            self.clock.now().timestamp(),
            self.options.max_concurrent_orchestrators - len(self._claimed),
            skip | set(self._claimed),
            only,
        )

    def _free_activity_slots(self) -> int:
        return self.options.max_concurrent_activities - len(self._activity_tasks)

    def _start_activities(self, rows: list[Any]) -> None:
        for row in rows:
            task = asyncio.create_task(self._run_activity(dict(row)))
            self._activity_tasks.add(task)
            task.add_done_callback(self._activity_done)

    def _retry_later(self, instance_id: str) -> None:
        self._rejected_until[instance_id] = time.monotonic() + 5.0
        self._histories.pop(instance_id, None)
        try:
            self.store.unlock_instance(instance_id)
        except Exception:  # the hub refuses writes: the dispatch loop must go on regardless
            log.exception("could not unlock %s; it stays locked until this host stops", instance_id)

    def _cached_top(self, instance_id: str) -> int:
        """The seq of the last history row this host holds a copy of (-1: none)."""
        cached = self._histories.get(instance_id)
        return cached.max_seq if cached is not None and cached.max_seq is not None else -1

    def _episode(self, instance_id: str, after: int, read: EpisodeRead) -> None:
        """One episode of a claimed instance, from what was read for it (`episode_reads`
        with `after`, the top of its cached history then)."""
        now = self.clock.now()
        inst, messages, tail = read
        if inst is None:
            return
        history = self._history(inst, (after, tail))
        new_events: list[dict[str, Any]] = []
        consumed: list[int] = []
        terminate: dict[str, Any] | None = None
        has_start = bool(history)
        suspended = inst.status == "Suspended"
        terminal = inst.is_terminal
        control: list[dict[str, Any]] = []  # ExecutionSuspended/Resumed that changed the state
        control_mids: list[int] = []
        for mid, execution_id, event in messages:
            et = event["EventType"]
            if et == EXECUTION_STARTED:
                if history or execution_id != inst.execution_id or terminal:
                    consumed.append(mid)  # a duplicate or stale start
                    continue
                has_start = True
            elif et == EXECUTION_TERMINATED:
                consumed.append(mid)
                if not terminal and terminate is None:
                    terminate = event
                continue
            elif terminal or (execution_id is not None and execution_id != inst.execution_id):
                # Late news for a finished or replaced execution: dropped, as DTFx does.
                consumed.append(mid)
                continue
            elif et in (EXECUTION_SUSPENDED, EXECUTION_RESUMED):
                consumed.append(mid)
                control_mids.append(mid)
                if (et == EXECUTION_SUSPENDED) != suspended:
                    suspended = et == EXECUTION_SUSPENDED
                    control.append(event)
                continue
            elif suspended:
                continue  # held while suspended, as DTFx does: stays queued until a resume
            consumed.append(mid)
            new_events.append(event)

        if terminal or (not has_start and terminate is None):
            if terminal:
                self.store.drop_messages(instance_id, consumed)
            else:
                self.store.unlock_instance(instance_id)  # events before the start stay queued
            return

        started_marker = _event(ORCHESTRATOR_STARTED, now)
        if terminate is not None:
            reason = terminate.get("Input")
            # As DTFx records it: the termination, then the execution's end with status Terminated.
            episode = [
                started_marker,
                _event(EXECUTION_TERMINATED, now, Input=reason),
                _event(ORCHESTRATOR_COMPLETED, now),
                _event(EXECUTION_COMPLETED, now, OrchestrationStatus="Terminated", Result=reason),
            ]
            self._commit(
                inst, episode, consumed, [], [], [], "Terminated", reason, inst.custom_status, now
            )
            log.info("orchestration %s terminated", instance_id)
            return

        if suspended:
            # Only the suspension is recorded; every other message stays queued for the resume.
            self._commit(
                inst,
                control,
                control_mids,
                [],
                [],
                [],
                "Suspended",
                inst.output,
                inst.custom_status,
                now,
            )
            if control:
                log.info("orchestration %s suspended", instance_id)
            return
        new_events = control + new_events

        refusal = self._version_refusal(inst.version)
        if refusal is not None:
            if self.options.version_failure == "Fail":
                self._fail(inst, started_marker, new_events, consumed, now, refusal)
            else:  # Reject: leave the work queued for a worker whose version matches
                log.warning("orchestration %s rejected: %s", instance_id, refusal)
                self._rejected_until[instance_id] = time.monotonic() + 5.0
                self.store.unlock_instance(instance_id)
            return

        spec = self.catalog.orchestrator(inst.name)
        replay_history = [*history, started_marker, *new_events]  # `history` is played
        scheduled_before = {e["EventId"]: e for e in history if e["EventType"] in SCHEDULING_EVENTS}
        if spec is None:
            self._fail(
                inst,
                started_marker,
                new_events,
                consumed,
                now,
                f"The function '{inst.name}' doesn't exist, is disabled, or is not an orchestrator function.",
            )
            return
        try:
            result = run_episode(
                spec.func,
                instance_id=instance_id,
                history=replay_history,
                input_json=inst.input,
                scheduled_before=scheduled_before,
            )
        except NonDeterminismError as exc:
            log.error("orchestration %s (%s): %s", instance_id, inst.name, exc)
            self._fail(inst, started_marker, new_events, consumed, now, str(exc))
            return
        except NotImplementedError as exc:
            log.error("orchestration %s (%s): %s", instance_id, inst.name, exc)
            self._fail(inst, started_marker, new_events, consumed, now, str(exc))
            return

        scheduled_events: list[dict[str, Any]] = []
        activities: list[tuple[int, str, str | None]] = []
        timers: list[tuple[dict[str, Any], float]] = []
        messages_out: list[tuple[str, str | None, dict[str, Any]]] = []
        children: list[dict[str, Any]] = []
        entity_ops: list[dict[str, Any]] = []
        for task in result.new_tasks:
            if task.kind == "activity":
                scheduled_events.append(
                    _event(
                        TASK_SCHEDULED, now, EventId=task.task_id, Name=task.name, Input=task.input
                    )
                )
                activities.append((task.task_id, task.name or "", task.input))
            elif task.kind == "timer":
                fire_at = task.fire_at or now
                if fire_at.tzinfo is None:
                    fire_at = fire_at.replace(tzinfo=UTC)
                scheduled_events.append(
                    _event(TIMER_CREATED, now, EventId=task.task_id, FireAt=iso(fire_at))
                )
                timers.append(
                    (
                        _event(TIMER_FIRED, fire_at, TimerId=task.task_id, FireAt=iso(fire_at)),
                        fire_at.timestamp(),
                    )
                )
            elif task.kind == "suborchestration":
                # DurableTask.Core names an unnamed child "{ExecutionId}:{id}", its id
                # the parent's task counter (CreateSubOrchestrationInstanceCore).
                child_id = task.instance_id or f"{inst.execution_id}:{task.task_id}"
                scheduled_events.append(
                    _event(
                        SUB_ORCHESTRATION_CREATED,
                        now,
                        EventId=task.task_id,
                        Name=task.name,
                        InstanceId=child_id,
                        Input=task.input,
                    )
                )
                children.append(self._child(child_id, task, instance_id, inst.execution_id))
            elif task.kind == "entity":
                # As the extension records it: EventSent to the entity, carrying the request id
                # the SDK then waits for as the name of the response's EventRaised.
                request_id = str(uuid.uuid4())
                scheduled_events.append(
                    _event(
                        EVENT_SENT,
                        now,
                        EventId=task.task_id,
                        InstanceId=task.name,
                        Name="op",
                        Input=json.dumps(
                            {"id": request_id, "op": task.operation, "signal": task.signal}
                        ),
                    )
                )
                entity_ops.append(
                    dict(
                        entity_id=task.name,
                        operation=task.operation,
                        input_json=json.dumps(task.input) if task.input is not None else None,
                        request_id=None if task.signal else request_id,
                        reply_instance=None if task.signal else instance_id,
                        reply_execution=None if task.signal else inst.execution_id,
                    )
                )

        episode = [started_marker, *new_events, *scheduled_events]
        if result.outcome == "completed":
            episode += [
                _event(ORCHESTRATOR_COMPLETED, now),
                _event(
                    EXECUTION_COMPLETED,
                    now,
                    OrchestrationStatus="Completed",
                    Result=result.output_json,
                ),
            ]
            messages_out += self._parent_notice(
                instance_id, True, result.output_json, None, new_events, history
            )
            self._commit(
                inst,
                episode,
                consumed,
                activities,
                timers,
                messages_out,
                "Completed",
                result.output_json,
                result.custom_status_json,
                now,
                children,
                entity_ops,
            )
            log.info("orchestration %s (%s) completed", instance_id, inst.name)
        elif result.outcome == "failed":
            message = f"Orchestrator function '{inst.name}' failed: {result.error}"
            episode += [
                _event(ORCHESTRATOR_COMPLETED, now),
                _event(
                    EXECUTION_COMPLETED,
                    now,
                    OrchestrationStatus="Failed",
                    Result=json.dumps(message),
                ),
            ]
            messages_out += self._parent_notice(
                instance_id, False, None, message, new_events, history
            )
            self._commit(
                inst,
                episode,
                consumed,
                activities,
                timers,
                messages_out,
                "Failed",
                json.dumps(message),
                result.custom_status_json,
                now,
                children,
                entity_ops,
            )
            log.warning("orchestration %s (%s) failed: %s", instance_id, inst.name, result.error)
        elif result.outcome == "continued_as_new":
            new_execution = uuid.uuid4().hex
            new_input = (
                json.dumps(result.continue_input) if result.continue_input is not None else None
            )
            restart = _event(
                EXECUTION_STARTED,
                now,
                Name=inst.name,
                Version=inst.version or "",
                Input=new_input,
                OrchestrationInstance={"InstanceId": instance_id, "ExecutionId": new_execution},
            )
            self._write(
                instance_id=instance_id,
                execution_id=new_execution,
                reset_history=True,
                new_history=[],
                consumed=consumed,
                activities=[],
                timers=[],
                messages=[(instance_id, new_execution, restart)],
                status="Running",
                output=None,
                custom_status=result.custom_status_json,
                input_json=new_input,
                now_iso=iso(now),
            )
        else:
            episode.append(_event(ORCHESTRATOR_COMPLETED, now))
            self._commit(
                inst,
                episode,
                consumed,
                activities,
                timers,
                messages_out,
                "Running",
                None,
                result.custom_status_json,
                now,
                children,
                entity_ops,
            )

    def _history(self, inst: Instance, read: tuple[int, Any] | None = None) -> list[dict[str, Any]]:
        """The instance's stored history as a replay takes it (every event IsPlayed), parsing
        only the rows added since this host last read it (an episode otherwise decodes the
        whole history again each time). `read` is (after_seq, what `Store.history_tail`
        returned for it) if the caller read it already.

        The copy is used only if the rows it holds are still there unchanged: same
        execution, and the row count is what it held plus the rows read after it (a rewind
        deletes rows, a reset or restart starts a new execution). Otherwise it is read anew."""
        cached = self._histories.pop(inst.instance_id, None)
        if cached is not None and cached.execution_id != inst.execution_id:
            cached = None
        after = cached.max_seq if cached is not None and cached.max_seq is not None else -1
        if read is not None and read[0] == after:
            count, max_seq, rows = read[1]
        else:
            count, max_seq, rows = self.store.history_tail(inst.instance_id, after)
        if cached is None or count != len(cached.events) + len(rows):
            if after != -1:
                count, max_seq, rows = self.store.history_tail(inst.instance_id, -1)
            events = _played(rows)
        else:
            events = cached.events + _played(rows)
        if not inst.is_terminal and len(events) == count:
            self._histories[inst.instance_id] = _CachedHistory(inst.execution_id, max_seq, events)
            while len(self._histories) > HISTORY_CACHE_SIZE:
                self._histories.pop(next(iter(self._histories)))
        # A new list of the cached events: callers read them and copy what they change.
        return list(events)

    def _remember_written(self, write: dict[str, Any], first: int) -> None:
        """Extend the instance's cached history with the rows its episode just wrote, so the
        next episode reads (and decodes) none of them back, only the row count that shows
        nothing else changed. Kept only if the rows follow the copy's last one exactly."""
        iid = write["instance_id"]
        cached = self._histories.get(iid)
        new = write["new_history"]
        if write["reset_history"] or not new:
            if write["reset_history"]:
                self._histories.pop(iid, None)
            return
        if cached is None:
            cached = _CachedHistory(write["execution_id"], None, [])
        last = -1 if cached.max_seq is None else cached.max_seq
        if cached.execution_id != write["execution_id"] or first != last + 1:
            self._histories.pop(iid, None)
            return
        self._histories[iid] = cached
        # The episode's own dicts, written now and read by nothing else: marked played here,
        # once, rather than copied as played by every later replay.
        for e in new:
            e["IsPlayed"] = True
        cached.events.extend(new)
        cached.max_seq = first + len(new) - 1

    def _version_refusal(self, version: str | None) -> str | None:
        """host.json versionMatchStrategy against defaultVersion, as the Durable extension applies it."""
        current = self.options.default_version
        strategy = self.options.version_match
        if strategy == "None" or not current:
            return None
        version = version or ""
        if strategy == "Strict" and version != current:
            return f"the orchestration version '{version}' does not match the worker version '{current}'"
        if strategy == "CurrentOrOlder" and _version_key(version) > _version_key(current):
            return f"the orchestration version '{version}' is newer than the worker version '{current}'"
        return None

    def _commit(
        self,
        inst: Instance,
        episode: list[dict[str, Any]],
        consumed: list[int],
        activities: list[tuple[int, str, str | None]],
        timers: list[tuple[dict[str, Any], float]],
        messages: list[tuple[str, str | None, dict[str, Any]]],
        status: str,
        output: str | None,
        custom_status: str | None,
        now: datetime,
        children: list[dict[str, Any]] | None = None,
        entity_ops: list[dict[str, Any]] | None = None,
    ) -> None:
        self._write(
            new_instances=children,
            entity_ops=entity_ops,
            instance_id=inst.instance_id,
            execution_id=inst.execution_id,
            reset_history=False,
            new_history=episode,
            consumed=consumed,
            activities=activities,
            timers=timers,
            messages=messages,
            status=status,
            output=output,
            custom_status=custom_status,
            input_json=inst.input,
            now_iso=iso(now),
        )

    def _fail(
        self,
        inst: Instance,
        started_marker: dict[str, Any],
        new_events: list[dict[str, Any]],
        consumed: list[int],
        now: datetime,
        message: str,
    ) -> None:
        episode = [
            started_marker,
            *new_events,
            _event(ORCHESTRATOR_COMPLETED, now),
            _event(
                EXECUTION_COMPLETED, now, OrchestrationStatus="Failed", Result=json.dumps(message)
            ),
        ]
        notice = self._parent_notice(inst.instance_id, False, None, message, new_events)
        self._commit(
            inst,
            episode,
            consumed,
            [],
            [],
            notice,
            "Failed",
            json.dumps(message),
            inst.custom_status,
            now,
        )

    # ---- sub-orchestrations ------------------------------------------------------------

    def _child(
        self, child_id: str, task: Any, parent_id: str, parent_execution: str
    ) -> dict[str, Any]:
        """A sub-orchestration to create in the parent's episode transaction. The link to the
        parent is kept in the child's ExecutionStarted (ParentInstance), as in DTFx."""
        now = self.clock.now()
        execution_id = uuid.uuid4().hex
        version = task.version if task.version is not None else self.options.default_version
        child_input = json.dumps(task.input) if task.input is not None else None
        started = _event(
            EXECUTION_STARTED,
            now,
            Name=task.name,
            Version=version or "",
            Input=child_input,
            OrchestrationInstance={"InstanceId": child_id, "ExecutionId": execution_id},
            ParentInstance={
                "TaskScheduleId": task.task_id,
                "OrchestrationInstance": {"InstanceId": parent_id, "ExecutionId": parent_execution},
            },
        )
        return dict(
            instance_id=child_id,
            name=task.name,
            version=version,
            execution_id=execution_id,
            input_json=child_input,
            started_event=started,
            now_iso=iso(now),
            now_epoch=now.timestamp(),
        )

    def _parent_notice(
        self,
        instance_id: str,
        ok: bool,
        output_json: str | None,
        error: str | None,
        new_events: list[dict[str, Any]],
        history: list[dict[str, Any]] | None = None,
    ) -> list[tuple[str, str | None, dict[str, Any]]]:
        """The parent's SubOrchestrationInstanceCompleted/Failed, if this instance has a parent.

        The ExecutionStarted that names the parent is in the stored history (`history` when
        the caller holds it, else read), or, when the child finishes in its first episode,
        among this episode's new events."""
        history = self.store.history(instance_id, limit=3) if history is None else history[:3]
        parent = None
        for e in [*history, *new_events]:
            if e["EventType"] == EXECUTION_STARTED:
                parent = e.get("ParentInstance")
        if not parent:
            return []
        now = self.clock.now()
        pinst = parent["OrchestrationInstance"]
        if ok:
            ev = _event(
                SUB_ORCHESTRATION_COMPLETED,
                now,
                TaskScheduledId=parent["TaskScheduleId"],
                Result=output_json,
            )
        else:
            ev = _event(
                SUB_ORCHESTRATION_FAILED,
                now,
                TaskScheduledId=parent["TaskScheduleId"],
                Reason=error,
                Details=None,
            )
        return [(pinst["InstanceId"], pinst["ExecutionId"], ev)]

    # ---- activities --------------------------------------------------------------------

    async def _activity_loop(self) -> None:
        while not self._stopping:
            free = self._free_activity_slots()
            rows = self.store.claim_activities(free)
            self._start_activities(rows)
            self._activities_full = len(rows) >= free
            if not rows:
                await self.clock.wait(None, max_wait=0.25, topic=ACTIVITIES)
            else:
                await asyncio.sleep(0)

    def _activity_done(self, task: asyncio.Task[None]) -> None:
        self._activity_tasks.discard(task)
        if self._activities_full:  # a slot is free again for work that is waiting
            self._activities_full = False
            self.clock.poke(ACTIVITIES)

    async def _run_activity(self, row: dict[str, Any]) -> None:
        name = row["name"]
        spec = self.catalog.activity(name)
        if name == HTTP_ACTIVITY:
            try:
                result = await run_http_activity(row["input"])
                event = _event(
                    TASK_COMPLETED, self.clock.now(), TaskScheduledId=row["task_id"], Result=result
                )
            except Exception as exc:
                log.warning("call_http for %s failed: %s", row["instance_id"], exc)
                event = _event(
                    TASK_FAILED,
                    self.clock.now(),
                    TaskScheduledId=row["task_id"],
                    Reason=str(exc) or type(exc).__name__,
                    Details="".join(traceback.format_exception(exc)),
                )
        elif spec is None:
            event = _event(
                TASK_FAILED,
                self.clock.now(),
                TaskScheduledId=row["task_id"],
                Reason=f"The function '{name}' doesn't exist, is disabled, or is not an activity function.",
                Details=None,
            )
        else:
            try:
                arg = ActivityTriggerConverter.decode(
                    meta.Datum(type="json", value=row["input"] or "null"), trigger_metadata=None
                )
                kwargs: dict[str, Any] = {spec.trigger["name"]: arg}
                if spec.durable_client_param:
                    kwargs[spec.durable_client_param] = json.dumps(self.client_binding)
                value = await call_function(spec, kwargs)
                result = ActivityTriggerConverter.encode(value, expected_type=None).value
                event = _event(
                    TASK_COMPLETED, self.clock.now(), TaskScheduledId=row["task_id"], Result=result
                )
            except Exception as exc:
                log.warning("activity %s for %s failed: %s", name, row["instance_id"], exc)
                event = _event(
                    TASK_FAILED,
                    self.clock.now(),
                    TaskScheduledId=row["task_id"],
                    Reason=str(exc) or type(exc).__name__,
                    Details="".join(traceback.format_exception(exc)),
                )
        # Written with the loop turn's other writes: one transaction for them all (each is
        # still at-least-once, as before).
        self._turn.results.append((row, event))
        self._schedule_flush()
