"""The checks on the path: run as each write, send, remote call, delivery,
index change or raised event happens (the hooks `Simulation.__init__` sets
on the simulated stores, bus, remote services and task hub), so a rule that
holds at the end but was broken on the way (a recovery too early, a stale
write later undone, a cursor past a live entry) is still seen. A few report
at once (`fail`); the others record what they find in a list of their own,
which the end's checks report (`sim.checks.EndChecks.report_path_findings`).

Each names the design's rule it guards: docs/design.md section 7's
invariants by number, section 4's protocols by name."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from adapters.ports import bucket_of
from agents.agent import PACING_SPREAD, AgentPolicy
from agents.ports import RemoteCall
from domain.ids import reply_event_name, status_message_id
from domain.state_machine import MAX_COMPENSATION_RESTARTS

from .bus import (
    HANDLING,
    Delivery,
    rules_for,
)
from .observed import Observed, cosmos_text, store_unavailable
from .options import REGISTRY, SLACK

# How long after a COUNT that missed another session's claim the admission
# check does not ask: until the next COUNT (the Starter's interval, or its
# count interval of up to 30 s) and the claims of a lease taken on it (GRACE).
MISSED_CLAIM_WINDOW = timedelta(seconds=45)


@dataclass
class _Outcome:
    """A remote call's end as its client saw it (PathChecks._on_remote_outcome)."""

    status: int | None  # None: no answer within its timeout
    timeout: float
    retry_after: int  # a 429's Retry-After, whole seconds
    at: datetime
    judged: bool = False  # its breaker's verdict seen (PathChecks._on_breaker)


class PathChecks(Observed):
    """The hooks and the per-run checks of the Supervisor (see the module)."""

    # Its own bookkeeping (set by Simulation.__init__).
    first_entry: dict[tuple[str, int], datetime]  # (order key, attempt) -> first index entry
    orders_writer: dict[str, tuple[int | None, datetime]]  # order key -> (lock token, when)
    request_sender: dict[str, tuple[str, int]]  # request id -> (instance, execution)
    _request_limit: dict[Any, datetime | None]  # task -> until when its calls may start
    _refused_here: dict[Any, set[tuple[str, str]]]  # task -> (operation, key) refused to it
    _replies_seen: set[tuple[str, str]]  # (instance, reply event) of the replies sent
    _replies_indexed: int  # how many of agent-responses' sends _replies_seen has read
    _last_outcome: dict[Any, _Outcome]  # task -> the last remote call it made, as it ended
    last_write: datetime | None
    # The path's own bookkeeping for the issue-43 checks (set by Simulation.__init__).
    replying: dict[Any, bytes]  # task -> the body of the reply delivery it bridges
    wrote_states: dict[str, set[str]]  # instance -> the ProcessStates its writes left
    sup_pages: dict[Any, list[int]]  # a Supervisor run's task -> recoveries per page
    status_refused: dict[str, str]  # instance -> the record's state when its status was refused
    processed_at: dict[str, datetime]  # order key -> when its record was written Processed
    # order key -> (message id, when written) of each outbox entry that carries an alert
    alerting_entries: dict[str, list[tuple[str, datetime]]]
    refused_sends: dict[str, int]  # queue -> sends it refused (any sender, any cause)
    _told_rejected: Callable[[str, str], None]  # sim.clients.Clients

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

    def _on_state_write(self, old: dict | None, new: dict) -> None:
        """Every write of the state container: the checkpoint's cursor, or a
        record's write, its transition row counted and checked on the path."""
        if "ProcessState" not in new:
            if self.o.scan == "index" and "Cursor" in new:
                self._check_cursor(new)
            pages = self.sup_pages.get(asyncio.current_task())
            if pages is not None and "Cursor" in new:
                pages.append(0)  # a page saved: the next one's recoveries count anew
            return
        self._check_step_deadline(old, new)
        if self.o.scan == "index":
            self._check_index_entry(old, new)
        self.last_write = self.world.clock.now
        actor = self._actor()
        before = old.get("ProcessState") if old else None
        row = _row(actor, before, old, new)
        if row:
            self.rows[row] += 1
        if old:
            self._check_compensation_long_retry(old, new, actor)
        self._check_restarts_on_write(old, new, actor)
        if old and actor == "supervisor" and before == "Processing":
            self._check_recovery(old, new)
            pages = self.sup_pages.get(asyncio.current_task())
            if pages is not None:
                pages[-1] += 1
        if (
            old
            and actor == "starter"
            and before == "Compensating"
            and old.get("LockedBy")
            and new.get("LockedBy") != old.get("LockedBy")
        ):
            self._check_compensation_taken(old, new)
        if old and actor == "orchestration":
            self._check_stale_write(old, new)
        if new["ProcessState"] == "Processing" and before != "Processing":
            self._check_admission_cap(new)
        if new["ProcessState"] == "Processed" and before != "Processed":
            self.processed_at[str(new.get("id"))] = self.world.clock.now
        pending = new.get("PendingStatus") or {}
        if pending.get("Status") in ("Failed", "CompensationFailed") and pending.get(
            "MessageId"
        ) != ((old or {}).get("PendingStatus") or {}).get("MessageId"):
            self.alerting_entries.setdefault(str(new.get("id")), []).append(
                (str(pending.get("MessageId")), self.world.clock.now)
            )
        writer = self._instance()
        if writer is not None:
            self.wrote_states.setdefault(writer, set()).add(str(new["ProcessState"]))

    def _check_admission_cap(self, new: dict) -> None:
        """Admission control (design, section 4): no claim puts more records in
        Processing than MAX_PROCESSING, on any host: every claimer first takes a
        slot from the one admission document (domain/admission.py), and a slot
        counts until a count surely includes its claim. Checked as each record
        enters Processing, over the whole container's records: a foreign
        document (foreign_docs) was never admitted, and takes no slot. What is
        promised assumes every COUNT sees every claim that has landed: within
        MISSED_CLAIM_WINDOW of a COUNT whose lagging replica hid another
        session's claim (sim.cosmos `missed_claim_at`), the cap may be passed
        by the claims it missed, and this check does not ask (a Starter's
        estimate is low from that COUNT until the next; docs/design.md)."""
        missed = self.state_c.missed_claim_at
        if missed is not None and self.world.clock.now - missed <= MISSED_CLAIM_WINDOW:
            return
        cap = self.settings.max_processing
        processing = sum(
            1
            for key, doc in self.state_c.docs.items()
            if doc.get("ProcessState") == "Processing" and key[0] not in self.junk
        )
        if processing > cap:
            self.fail(
                "Processing never above MAX_PROCESSING",
                f"{new.get('id')} claimed by {self._actor()} made {processing} records "
                f"Processing against MAX_PROCESSING {cap}",
            )

    def _check_restarts_on_write(self, old: dict | None, new: dict, actor: str) -> None:
        """Invariant 5 for compensation (nothing retries forever), on the path,
        as written (issue 21: every counter by its rule): a restart past
        MAX_COMPENSATION_RESTARTS is reset by the long retry that follows, so
        the end state would not show it."""
        restarts = new.get("CompensationRestarts")
        if (
            isinstance(restarts, int)
            and restarts > MAX_COMPENSATION_RESTARTS
            and restarts != (old or {}).get("CompensationRestarts")
        ):
            self.violations.append(
                (
                    "compensation restarts bounded",
                    f"{actor} restarted the compensation of {new.get('id')} for the "
                    f"{restarts}th time at {self.world.stamp()} "
                    f"(at most {MAX_COMPENSATION_RESTARTS})",
                )
            )

    def _check_compensation_taken(self, old: dict, new: dict) -> None:
        """Section 4, compensation (ADR 019a), on the path: the Starter takes a
        compensation from its instance (a restart, or giving up) only when that
        instance is gone, never on a status blip; and a restart is counted only
        for an attempt that ran."""
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

    def _check_stale_write(self, old: dict, new: dict) -> None:
        """Invariant 3: a stale attempt never changes the record (an activity
        of an instance that does not hold the lock writes nothing but the
        status outbox's bookkeeping, which anyone who sent the status may)."""
        writer = self._instance()
        if writer and old.get("LockedBy") != writer and not _outbox_only(old, new):
            self.violations.append(
                (
                    "3 stale attempt wrote",
                    f"{writer} changed {new['id']} locked by {old.get('LockedBy')}",
                )
            )

    def _check_recovery(self, old: dict, new: dict) -> None:
        """Invariant 5 (§7 5: each expired attempt counts once, FailureCount
        never past threshold + long retries) and the long retry (§4), as each
        Supervisor recovery (rows 6 and 7) is written: the attempt's
        CompleteBy had passed in the world's own time (the Supervisor's slack
        is larger than any actor's skew), FailureCount moved by exactly one,
        and that count says where the record goes: a quick retry below the
        threshold, a long retry (NotBefore set) below threshold + long
        retries, Error at the end."""
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
        # The store leaves out a field at its default (exclude_defaults): an
        # absent count is 0, and a recovery that leaves it absent counted
        # nothing (mutant `sm-failurecount-not-counted`). Only a count that
        # is there and no number is a foreign document's: its alert names it.
        counted = old.get("FailureCount", 0)
        if not isinstance(counted, int):
            return
        failures = counted + 1
        if new.get("FailureCount", 0) != failures:
            self.violations.append(
                (
                    "FailureCount moves by one per recovery",
                    f"{oid}: {counted} -> {new.get('FailureCount', 0)}",
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

    def _on_remote_call(self, call: RemoteCall, timeout: float | None = None) -> None:
        """No call starts after its request's deadline (DESIGN.md section 4,
        agents: never start a new side effect after it), nor after the undo's
        ListenUntil when it listens longer (ADR 005), in the world's own time:
        the agent's margin before it is larger than any actor's skew. Nor
        does a call's timeout run past that limit (section 4, agents: retries
        only inside their deadline; the reply must reach the Scheduler before
        its timer): the agent caps it at its stop time, the deadline less a
        reply margin no smaller than any actor's skew. Nor is a call made
        again that its service refused for this very request (section 4,
        agents: a non-transient failure is answered with an error reply)."""
        task = asyncio.current_task()
        limit = self._request_limit.get(task)
        now = self.world.clock.now
        what = f"{call.service}/{call.operation} for {call.idempotency_key} (token {call.fencing_token})"
        if limit is not None and now >= limit:
            self.late_calls.append(
                f"{what} started at {self.world.stamp()}, after its "
                f"request's deadline {limit.isoformat()}"
            )
        elif (
            limit is not None
            and timeout is not None
            and now + timedelta(seconds=timeout) > limit + timedelta(milliseconds=1)
        ):
            self.long_calls.append(
                f"{what} started at {self.world.stamp()} with a {timeout:g} s timeout, "
                f"past its request's deadline {limit.isoformat()}"
            )
        self._check_payload(call, what)
        if (f"{call.service}/{call.operation}", call.idempotency_key) in self._refused_here.get(
            task, ()
        ):
            self.retried_refusals.append(
                f"{what} called again at {self.world.stamp()} by the delivery its service "
                "had refused (a 4xx, not 408 or 429)"
            )

    def _check_payload(self, call: RemoteCall, what: str) -> None:
        """A call carries the order fields its step's catalog entry names, no
        more (the payment provider no order lines, the warehouse no card
        reference) and no fewer (domain/steps.json; the Scheduler cuts each
        request to them, the agent again before its call): the order's step
        payload always has every field."""
        step = next(
            (
                s
                for s in self.o.steps.steps
                if s.service == call.service
                and call.operation in (s.do_operation, s.undo_operation)
            ),
            None,
        )
        payload = call.body.get("Payload")
        if step is None or not isinstance(payload, dict):
            return
        if set(payload) != set(step.payload):
            self.wrong_payloads.append(
                f"{what} at {self.world.stamp()} carried {sorted(payload)}; its step "
                f"{step.name} takes {sorted(step.payload)}"
            )

    def _on_remote_answer(self, call: RemoteCall, status: int) -> None:
        """An answer the agent read: a refusal (a 4xx but 408 and 429, which
        agents.remote_client maps to PermanentError) noted for the delivery
        being handled (`_on_remote_call`)."""
        if 400 <= status < 500 and status not in (408, 429):
            task = asyncio.current_task()
            if task in self._request_limit:
                self._refused_here.setdefault(task, set()).add(
                    (f"{call.service}/{call.operation}", call.idempotency_key)
                )

    def _on_remote_outcome(
        self, call: RemoteCall, status: int | None, timeout: float, retry_after: int
    ) -> None:
        """What the client saw of a call as it ended (sim.remote.SimRemote.told),
        for the task that made it: the next breaker verdict of that task
        judges it (`_on_breaker`), and the delivery's reply reads its last."""
        self._last_outcome[asyncio.current_task()] = _Outcome(
            status, timeout, retry_after, self.world.clock.now
        )

    def _on_breaker(self, service: str, counted: bool) -> None:
        """A breaker's verdict on the call that just ended in this task
        (counted: a failure; else taken for a success). A call the service
        failed, a 5xx or no answer within the agent's whole call timeout,
        counts on its breaker (section 4, agents: "open a circuit breaker on
        a failing dependency"; only a 429 and a call our own deadline cut
        short, a timeout below the call timeout, are pacing)."""
        outcome = self._last_outcome.get(asyncio.current_task())
        if outcome is None or outcome.judged:
            return  # no call of this task ended since (its task ending, a crash)
        outcome.judged = True
        failed = (outcome.status is not None and outcome.status >= 500) or (
            outcome.status is None and outcome.timeout >= AgentPolicy().call_timeout
        )
        if failed and not counted:
            what = (
                f"no answer within its {outcome.timeout:g} s timeout"
                if outcome.status is None
                else f"HTTP {outcome.status}"
            )
            self.uncounted_failures.append(
                f"a call to {service} ended at {outcome.at.isoformat()} with {what}; "
                "its breaker took it for a success"
            )

    def _check_pacing_not_given_up(self, d: Delivery, reply: bytes | None) -> None:
        """A 429 never ends a request's retries before its deadline (section
        4, pacing is not failure: it counts neither on a breaker nor toward
        max_attempts): an agent that gives up ("gave up after ... calls")
        right after a 429 does so only because its next wait, Retry-After x
        up to PACING_SPREAD, would pass its last start (the Deadline less the
        reply margin and the least call time, on a clock up to the skew
        bound off). Its failure count did not move at the 429, so it had not
        reached max_attempts either."""
        outcome = self._last_outcome.get(asyncio.current_task())
        if reply is None or outcome is None or outcome.status != 429 or not outcome.retry_after:
            return
        try:
            body = json.loads(reply)
            error = str(body.get("Error") or "")
            deadline = datetime.fromisoformat(json.loads(d.body)["Deadline"])
        except (ValueError, TypeError, KeyError, AttributeError):
            return
        if not error.startswith("gave up after"):
            return
        policy = AgentPolicy()
        last_start = deadline - timedelta(seconds=policy.reply_margin + policy.min_call_time)
        wake = outcome.at + timedelta(
            seconds=self.o.faults.skew + PACING_SPREAD * outcome.retry_after + 0.01
        )
        if wake < last_start:
            self.paced_given_up.append(
                f"{d.message_id} gave up at {outcome.at.isoformat()} after a 429 (Retry-After "
                f"{outcome.retry_after} s), {(last_start - wake).total_seconds():.1f} s before "
                f"the last wait could pass its last start {last_start.isoformat()}: {error[:120]}"
            )

    def _check_count_kept(self, d: Delivery, count: int, settled: str) -> None:
        """The app never lets a message's delivery count run out (ADR 014: a
        transient failure on the last delivery the queue allows, a reply or
        a back-off copy that cannot be sent, is dead-lettered
        RetriesExhausted with its alert; "never lets the count run out
        silently"): no handler abandons the delivery whose count (the
        broker's, `count`) is the queue's MaxDeliveryCount, which the broker
        would dead-letter MaxDeliveryCountExceeded with no reason of the
        app's. (A worker's handler cancelled at its shutdown abandons by
        raising, which is not its decision.)"""
        if settled == "abandon" and count >= rules_for(d.queue).max_delivery:
            self.count_run_out.append(
                f"{d.queue} {d.message_id} abandoned on delivery {count}, the last the queue "
                f"allows, at {self.world.stamp()}"
            )

    def _check_answered(self, d: Delivery) -> None:
        """A genuine agent request the agent completed was answered (section 4,
        deadline race; ADR 014's settlement table): a reply naming its
        instance and reply event is on agent-responses, sent by this delivery
        or an earlier one. A request completed without one (its reply's send
        failed), or whose reply duplicate detection dropped as another
        request's (a reply id that does not name its request), leaves its
        attempt to wait out its deadline for nothing."""
        try:
            req = json.loads(d.body)
            wanted = (str(req["InstanceId"]), str(req["ReplyEvent"]))
        except (ValueError, TypeError, KeyError):
            return
        sent = self.bus.queue("agent-responses").sent
        for m in sent[self._replies_indexed :]:
            try:
                body = json.loads(m.body)
                self._replies_seen.add((str(body["InstanceId"]), str(body["EventName"])))
            except (ValueError, TypeError, KeyError):
                pass
        self._replies_indexed = len(sent)
        if wanted not in self._replies_seen:
            self.unanswered.append(
                f"{d.message_id} ({wanted[0]} {wanted[1]}) completed at {self.world.stamp()} "
                "with no reply naming it on agent-responses"
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
                doc.get("CompleteBy") == cosmos_text(str(entry.get("CompleteBy")))
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
        if failed == "load_plan" and store_unavailable(reason):
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

    def _on_raise(self, instance_id: str, event_name: str) -> None:
        """Every reply event an instance takes names that instance and attempt
        (§4 fencing, late replies; issue 43): the reply bridge raises a reply
        only on the instance the reply names, under the reply's own event
        name, whose attempt is that instance's. A reply of an attempt that is
        gone completes; handed to the next attempt, it would answer a request
        that attempt may never have sent (mutant `bridge-gone-to-next`)."""
        body = self.replying.get(asyncio.current_task())
        if body is None:
            return  # not the bridge's raise
        try:
            reply = json.loads(body)
            named, event = str(reply["InstanceId"]), str(reply["EventName"])
        except (ValueError, TypeError, KeyError):
            return
        _, _, token = instance_id.rpartition(":")
        _, _, event_attempt = event_name.rpartition("-")
        if (instance_id, event_name) != (named, event) or event_attempt != token:
            self.reply_misrouted.append(
                f"the bridge raised {event_name} on {instance_id} at {self.world.stamp()} for "
                f"a reply to {named} (event {event})"
            )

    def _on_timer(self, instance_id: str, fire_at: datetime, now: datetime) -> None:
        """The timer's fire time equals the record's deadline (§4 deadline
        race, ADR 002 one deadline; issue 43): a durable timer an attempt
        creates while it holds the record Processing fires at the record's
        CompleteBy, the deadline the agents and the Supervisor use; a timer
        later than it leaves a reply to race a Supervisor that has already
        taken the attempt, an earlier one gives up a step with time left
        (mutant `wf-timer-off-deadline`). Not an activity's retry timer
        (the SDK's `call_activity_with_retry`: the episode's time plus the
        first retry interval)."""
        from orchestrators.order_workflow import ACTIVITY_RETRY

        retry = timedelta(milliseconds=ACTIVITY_RETRY.first_retry_interval_in_milliseconds)
        if fire_at - now == retry:
            return
        oid = instance_id.rpartition(":")[0]
        doc = self.state_c.docs.get((oid, oid)) or {}
        due = doc.get("CompleteBy")
        if (
            doc.get("ProcessState") != "Processing"
            or doc.get("LockedBy") != instance_id
            or not isinstance(due, str)
        ):
            return
        if datetime.fromisoformat(due) != fire_at:
            self.timer_off_deadline.append(
                f"{instance_id} created a timer for {fire_at.isoformat()} at "
                f"{self.world.stamp()}; its record's CompleteBy is {due}"
            )

    def _on_activity_result(self, instance_id: str, name: str, value: Any) -> None:
        """A write counts as landed only if this attempt wrote it (§7 3, the
        LockedBy guard; issue 43): a finishing or state write that answers
        its attempt with a state (not stale) left the record in that state by
        one of the attempt's own writes. An activity retried after a lost
        answer recognises its own write; one that took another attempt's
        Processed for its own would report a success it did not make and
        retire an index entry it does not own (mutant `act-landed-any-writer`)."""
        if name not in ("finish_attempt", "write_state"):
            return
        try:
            result = json.loads(value) if isinstance(value, str) else dict(value or {})
        except (ValueError, TypeError):
            return
        state = result.get("State") if isinstance(result, dict) else None
        if not state or result.get("Stale"):
            return
        state = getattr(state, "value", state)
        if str(state) not in self.wrote_states.get(instance_id, set()):
            self.landed_not_written.append(
                f"{name} of {instance_id} answered {state} at {self.world.stamp()}; none of "
                f"its writes left the record {state} (its writes left "
                f"{sorted(self.wrote_states.get(instance_id, set())) or 'nothing'})"
            )

    def _check_read_on(self, report: Any, page_writes: list[int], elapsed: timedelta) -> None:
        """A Supervisor run that made progress reads on until its budget or
        the backlog ends (§4 scans, §7 8 under a backlog; issue 43): a run
        whose last page recovered an attempt, skipped none and left a cursor
        (more may be due) stopped only at its page limit or its time budget.
        One page per run works a backlog off at one page a period, far
        slower than the store allows (mutant `sup-one-page`). `page_writes`:
        the recoveries of each page, as the path saw them."""
        if (
            not page_writes
            or page_writes[-1] == 0
            or report.skipped
            or report.pass_finished
            or report.pages >= self.settings.supervisor_max_pages
            or (
                self.settings.supervisor_run_budget is not None
                and elapsed >= self.settings.supervisor_run_budget
            )
        ):
            return
        self.stopped_reading.append(
            f"a Supervisor run stopped at {self.world.stamp()} after {report.pages} page(s) "
            f"(at most {self.settings.supervisor_max_pages}) in {elapsed.total_seconds():.1f} s "
            f"(budget {self.settings.supervisor_run_budget}); its last page recovered "
            f"{page_writes[-1]} and its cursor is not at the backlog's end"
        )

    def _on_refused(self, queue: str, message_id: str) -> None:
        """A send refused (nothing sent): a status an orchestration's activity
        sent to a client's reply queue is noted with the state of the record
        the instance holds, for `check_status_never_stops_work` at the end;
        a Starter's resend a refusing reply queue refused, for
        `check_refused_resends_bounded`."""
        self.refused_sends[queue] = self.refused_sends.get(queue, 0) + 1
        if (
            queue in REGISTRY.values()
            and self.world.faults.queue_refuses(queue) is not None
            and self._actor() == "starter"  # an outbox resend
        ):
            self.starter_refused.setdefault(queue, []).append(self.world.clock.now)
        iid = self._instance()
        if iid is None or queue not in REGISTRY.values():
            return
        oid = iid.rpartition(":")[0]
        doc = self.state_c.docs.get((oid, oid)) or {}
        if doc.get("LockedBy") == iid:
            self.status_refused.setdefault(iid, str(doc.get("ProcessState")))

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


_BOOKKEEPING = frozenset(
    {"PendingStatus", "UpdatedAt", "_etag", "_ts", "_rid", "_self", "_attachments"}
)


def _outbox_only(old: dict, new: dict) -> bool:
    """A write that only clears (or counts a failed send of) the status
    outbox: anyone who sent the status may make it (ADR 001), owner or not,
    and it changes nothing an attempt owns; or that parks a Processed
    record's status, which its finishing write left out (ADR 021k)."""
    keys = (set(old) | set(new)) - _BOOKKEEPING
    if any(old.get(k) != new.get(k) for k in keys):
        return False
    was, now = old.get("PendingStatus"), new.get("PendingStatus")
    if was is None and now is not None and new.get("ProcessState") == "Processed":
        return now.get("MessageId") == status_message_id(new["id"], "Processed")
    return now is None or (was is not None and now.get("MessageId") == was.get("MessageId"))


def _row(actor: str, before: str | None, old: dict | None, new: dict) -> str | None:
    """The transition row (docs/design.md section 3, sim.options.ROWS) a
    write by `actor` from `before` to `new` is, or None."""
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
    return row
