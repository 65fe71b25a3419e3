"""The checks at the end of a schedule (`EndChecks.check`): once it has
stopped, the stores, the queues, the remote ledger, the task hub and what the
path checks (sim.path_checks) recorded are checked against docs/design.md
section 7's invariants and section 4's protocols. Each check is a method
whose docstring names the rule it guards; `check` is the list of them, in
the order that makes a seed's verdict (its first violation)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from adapters.recovery_index import MAX_BUCKETS_PER_PAGE
from adapters.servicebus import ALERTS_QUEUE
from adapters.settlement import ORIGINAL_ID_PROPERTY
from agents.agent import AgentPolicy
from devstack.host.durable import (
    EVENT_RAISED,
    ORCHESTRATOR_STARTED,
    TASK_COMPLETED,
    TASK_FAILED,
    TASK_SCHEDULED,
    TIMER_FIRED,
)
from domain.errors import TransientError
from domain.ids import order_key, reply_event_name
from domain.state_machine import MAX_COMPENSATION_RESTARTS
from orchestrators.starter import (
    STATUS_ALERT_AFTER,
    STATUS_BACKOFF_FIRST,
    STATUS_BACKOFF_MAX,
    STATUS_GRACE,
)

from .hostile import ALERT_KINDS as FORGERY_ALERTS
from .hostile import PREFIX as FORGED
from .message_checks import MessageChecks
from .observed import cosmos_text, store_unavailable
from .options import (
    INGRESS_OF,
    REGISTRY,
    SLACK,
    SUPERVISOR_PERIOD,
    TERMINAL_STATUS,
)
from .world import START, FaultConfig


class EndChecks(MessageChecks):
    """The end's checks (see the module)."""

    undo_unheard: list[str]

    def check(self) -> None:
        """Every end check, in a fixed order: the schedule's verdict is the
        first violation, so the order is part of what a seed replays."""
        statuses = self._statuses()
        alerted = self._alerted()
        docs = {oid: self.state_c.docs.get((oid, oid)) for oid in self.order_ids}
        self.check_index_entries_recovered(docs)
        self._report_first(self.live_entry_deleted, "index entry of a live attempt kept")
        self._report_first(
            self.cursor_passed, "the index cursor never passes a live attempt's entry"
        )
        self.check_liveness(docs, statuses, alerted)
        self.check_failure_count_bounded(docs)
        self.check_side_effects_once()
        self.check_side_effects_accounted(docs, alerted)
        self.check_permanent_not_retried()
        self._report_first(self.lost_requests, "a restarted orchestration's requests are delivered")
        self._report_first(self.lost_copies, "a failed delivery's back-off copy comes after it")
        self.check_fault_free_processes_all(docs)
        self._report_first(
            self.bad_identity, "a request carries its attempt's token and its step's key"
        )
        self._report_first(self.late_calls, "no call starts after its request's deadline")
        self.check_undo_order()
        self._report_first(self.deadline_mismatch, "one deadline travels everywhere")
        self._report_first(
            self.quit_early, "an attempt listens for its step's reply until the deadline"
        )
        self._report_first(self.step_deadline_reused, "each step gets its own deadline")
        self._report_first(
            self.due_not_recovered, "a clean Supervisor pass recovers every due attempt"
        )
        self._report_first(
            self.index_not_visited, "an index run visits every due entry after its cursor"
        )
        self.check_undo_answers_heard()
        self._report_first(self.undo_unheard, "an undo hears every try's answer until its deadline")
        self._report_first(
            self.index_entry_late, "an attempt's index entry is at or before its deadline"
        )
        self._report_first(self.durable.invalid_own_data, "the product's own writes are valid")
        self.check_compensation_failed_is_true(docs)
        self.check_compensation_failed_tried(docs)
        self.check_rejected_not_kept(docs)
        self.check_supervisor_cost()
        self.check_runs_survive_bad_documents()
        self.check_foreign_fields_kept()
        self.check_bad_documents_alerted()
        self.check_one_alert_per_incident()
        self.check_alerts_count_what_they_aggregate()
        if self.o.impersonation:
            self.check_impersonation()
        self.check_changed_resends()
        self.check_real_replies_not_dead_lettered()
        self.check_dead_letters_have_reasons()
        self.check_bad_submissions(alerted)
        self._report_first(
            [f"the orders DB document of {oid} was written twice" for oid in self.overwritten],
            "4 nothing overwritten",
        )
        self.check_compensation_restarts_bounded(docs)
        self.check_processed_applied_every_step(docs)
        if self.hostile is not None:
            self.hostile.check()
        self.check_applications_apart(docs, statuses)
        # Issue 43's path properties (sim.path_checks), after every older check
        # so that no recorded seed's verdict moves.
        self._report_first(
            self.reply_misrouted,
            "every reply event an instance takes names that instance and attempt",
        )
        self._report_first(self.timer_off_deadline, "the timer fires at the record's deadline")
        self._report_first(
            self.landed_not_written, "a write counts as landed only if this attempt wrote it"
        )
        self._report_first(self.stopped_reading, "a Supervisor run that made progress reads on")
        self.check_goodput_under_overload(docs)
        self.check_status_never_stops_work()
        self.check_breakers_open_on_failures()
        self.check_refused_resends_bounded()
        self.check_refusing_queue_alerted()
        # The agents' calls and answers (sim.path_checks), after every older check.
        self._report_first(self.long_calls, "no call outlasts its request's deadline")
        self._report_first(self.retried_refusals, "a refused call is not made again")
        self._report_first(self.unanswered, "a completed agent request was answered")
        self._report_first(self.uncounted_failures, "a failed call counts on its breaker")
        self._report_first(self.paced_given_up, "a 429 never ends a request before its deadline")
        self._report_first(self.count_run_out, "the app never lets a delivery count run out")
        # The alerts queue refusing for long (after every older check).
        self.check_undeliverable_names_a_refusing_queue()
        self.check_statuses_never_wait_for_alerts()
        self._report_first(self.wrong_payloads, "a remote call carries its step's fields")

    def _report_first(self, findings: list[str], check: str) -> None:
        """A path check's first finding, as `check`'s violation (one is enough
        to replay; sim.path_checks names the rule each guards)."""
        for detail in findings[:1]:
            self.fail(check, detail)

    def check_index_entries_recovered(self, docs: dict[str, dict | None]) -> None:
        """Invariant 8 through the recovery index (docs/design.md section 4, Supervisor
        scans; ADR 007): no index entry of an attempt still Processing at
        its deadline outlives that deadline by three Supervisor periods and
        the slack unseen."""
        if self.o.scan != "index":
            return
        for (_, _), entry in sorted(self.index_c.docs.items()):
            if not isinstance(entry.get("OrderID"), str):
                continue  # not an entry: the shard-count document, garbage
            doc = docs.get(entry["OrderID"])
            if (
                doc
                and doc["ProcessState"] == "Processing"
                and doc.get("CompleteBy") == cosmos_text(entry["CompleteBy"])
                and datetime.fromisoformat(entry["CompleteBy"])
                < self.end - timedelta(seconds=3 * SUPERVISOR_PERIOD) - SLACK
            ):
                self.fail(
                    "index entry outlived its attempt unseen",
                    f"{entry['id']} (bucket {entry['bucket']}) never recovered",
                )

    def check_liveness(
        self,
        docs: dict[str, dict | None],
        statuses: dict[str, list[dict]],
        alerted: set[str | None],
    ) -> None:
        """Invariant 8, liveness: once faults stop, every order is terminal within the
        bound (an order with no record was never accepted: its dead letter
        must be alerted), and its terminal status reached its reply queue,
        once (one message id)."""
        for oid, doc in docs.items():
            if doc is None:
                self._check_unrecorded(oid, statuses, alerted)
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
            operated = any(o == oid for o, _ in self.operator_done)
            if len(ids) > 1 and not operated:
                self.fail(
                    "terminal status sent once (one message id)", f"{oid}: {want} sent as {ids}"
                )
            # A terminal status heard must be the one the order ends in (design §4:
            # the status follows the write that ends it); only an operator's action
            # changes a terminal order. (Rejected answers a conflicting copy of the
            # order, not the order's own end.)
            ends = set(TERMINAL_STATUS.values()) - {"Rejected"}
            heard = {s["Status"] for s in statuses.get(oid, [])} & ends
            if heard - {want} and not operated:
                self.fail(
                    "no terminal status the order did not end in",
                    f"{oid} ended {state} but its client heard {sorted(heard)}",
                )
            if not got and not (state == "Rejected" and self._ended_in_dead_letters(oid)):
                self.fail(
                    "terminal status reaches the reply queue",
                    f"{oid} is {state} but no {want} status was sent "
                    f"(sent: {[s['Status'] for s in statuses.get(oid, [])]})",
                )

    def _check_unrecorded(
        self, oid: str, statuses: dict[str, list[dict]], alerted: set[str | None]
    ) -> None:
        """An order with no record at the end (invariants 4 and 8): dead-lettered
        with an alert (and a status unless the gate gave up on it), or by the
        broker or the gate's last resort with nothing left to alert; a message
        submitted and never dead-lettered is a liveness failure."""
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
            return
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
            self.fail("liveness", f"{oid}: submitted but no record after the bound {self.bound}")

    def check_failure_count_bounded(self, docs: dict[str, dict | None]) -> None:
        """Invariant 5: FailureCount never exceeds threshold + long retries."""
        for oid, doc in docs.items():
            if doc and doc.get("FailureCount", 0) > self.o.retry.max_failures:
                self.fail(
                    "5 FailureCount bounded",
                    f"{oid}: {doc['FailureCount']} > {self.o.retry.max_failures}",
                )

    def check_side_effects_once(self) -> None:
        """Invariant 2: no remote side effect is applied twice for one (OrderID, step)
        (the ledger counts each applied effect)."""
        for key, count in sorted(self.remote.ledger.effects.items()):
            if count > 1:
                self.fail("2 side effect applied once", f"{key} applied {count} times")

    def _net_effects(self) -> Counter[tuple[str, str]]:
        """Per (order, step): the effects applied by its do less those undone."""
        net: Counter[tuple[str, str]] = Counter()
        for key, count in self.remote.ledger.effects.items():
            order, step, op = key.split("|")
            forward = op in self.remote.do_paths
            net[(order, step)] += count if forward else -count
        return net

    def check_side_effects_accounted(
        self, docs: dict[str, dict | None], alerted: set[str | None]
    ) -> None:
        """Invariant 7: every side effect the remote service applied is kept by a
        Processed order, undone by a Compensated one, or named on an Error
        or CompensationFailed record that raised an alert."""
        net = self._net_effects()
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

    def check_permanent_not_retried(self) -> None:
        """Section 4, agents and one retry budget: a permanent answer (a refusal) that
        reached its attempt is never asked again by a later attempt, unless
        an operator resubmitted the order (defect 3)."""
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
                and op not in self.remote.undo_paths
                and self._acted_on(key.partition("/")[0], key.partition("/")[2], token)
            ):
                permanent.setdefault((key, op), token)

    def check_fault_free_processes_all(self, docs: dict[str, dict | None]) -> None:
        """Invariant 1, its plainest case: a schedule without faults (about one seed in
        seven; forgeries change nothing) ends every order Processed, unless
        admission control may reject. A system that only ever ended orders
        Error (every reply lost, say) would otherwise break no other check."""
        if replace(self.o.faults, hostile=0) == FaultConfig() and self.o.backlog_limit > 0:
            for oid, doc in sorted(docs.items()):
                if not doc or doc.get("ProcessState") != "Processed":
                    state = doc.get("ProcessState") if doc else "no record"
                    self.fail("a fault-free schedule processes every order", f"{oid}: {state}")
                    return

    def check_goodput_under_overload(self, docs: dict[str, dict | None]) -> None:
        """Goodput under overload bounded below (issue 43: no congestion
        collapse; §7 1 under load). In a schedule whose only adversity is
        overload (FaultConfig.overload alone: every order within 3 s against
        services that serve R = rate_limit calls a second and answer 429 with
        a Retry-After above it; no fault), the services never fail, they only
        pace. An order needs `steps` served calls per attempt and has at most
        max_failures + 1 attempts, so a system that spends the services'
        capacity on work it keeps ends every order Processed (unless admission
        control may reject), the last within N x steps x (max_failures + 1) / R
        seconds (the services' time for every call of every allowed attempt)
        plus the liveness bound of the burst: goodput at least N over that. An
        order ended otherwise, or later, means the capacity went to work
        thrown away (attempts past their retry budget, a breaker opened by
        429s, requests queued past their deadlines): a collapse."""
        f = self.o.faults
        if not f.overload or not f.rate_limit or self.o.backlog_limit <= 0:
            return
        alone = replace(
            f,
            overload=False,
            burst=False,
            rate_limit=0.0,
            episode_wait=0.0,
            episode_stalls=0.0,
            hostile=0,
        )
        if alone != FaultConfig():
            return
        steps = len(self.o.steps.steps)
        allowed = len(self.order_ids) * steps * (self.settings.retry.max_failures + 1)
        bound = START + timedelta(seconds=3 + allowed / f.rate_limit) + self.bound
        for oid, doc in sorted(docs.items()):
            state = doc.get("ProcessState") if doc else "no record"
            at = self.processed_at.get(oid)
            if state != "Processed" or at is None or at > bound:
                self.fail(
                    "goodput under overload bounded below",
                    f"{oid}: {state}"
                    + (f" at {at.isoformat()}" if at else "")
                    + f"; every order Processed by {bound.isoformat()} "
                    f"({len(self.order_ids)} orders, {steps} steps, "
                    f"{f.rate_limit:.3f} calls/s per service)",
                )
                return

    def check_status_never_stops_work(self) -> None:
        """No compensation delayed by a status (issue 43; §4 status delivery,
        compensation): a status send a client's reply queue refuses (disabled,
        deleted, forbidden, full, for hours) never stops the orchestration
        that sent it. Progress and Compensating statuses are best effort and
        a terminal one waits in the record's outbox, so an instance whose
        status was refused never ends Failed on its `report_status`: a
        compensation that did would send no undo, and its restarts would meet
        the same refusal until CompensationFailed with the charge kept."""
        for iid, state in sorted(self.status_refused.items()):
            inst = self.durable.instances.get(iid)
            if inst is None or inst.status != "Failed" or str(inst.output).startswith("injected:"):
                continue
            failed, reason = self.durable.last_failure(inst)
            if failed == "report_status":
                self.fail(
                    "no compensation delayed by a status",
                    f"{iid} (record {state} when its status was refused) ended Failed on "
                    f"report_status: {reason[:160]}",
                )
                return

    def _refusing_reply_queues(self) -> list[tuple[str, tuple[datetime, datetime, str]]]:
        """The client reply queues that refused for long (FaultConfig.refusing_reply),
        not the alerts queue (FaultConfig.refusing_alerts)."""
        refusing = self.world.faults.refusing
        return sorted((q, spell) for q, spell in refusing.items() if q in REGISTRY.values())

    def check_refused_resends_bounded(self) -> None:
        """A refusing reply queue is not resent to every scan (§4 status
        delivery): the Starter probes it with one send after
        STATUS_BACKOFF_FIRST, doubling to STATUS_BACKOFF_MAX, so a Starter
        (one per host process: a restart or a lock handover starts over)
        sends it at most the doublings plus one a STATUS_BACKOFF_MAX of the
        spell; plus, per order, one terminal send its restart loop makes
        outside the scan (a compensation given up)."""
        doublings = 1
        while STATUS_BACKOFF_FIRST * 2**doublings < STATUS_BACKOFF_MAX:
            doublings += 1
        for queue, (start, until, _) in self._refusing_reply_queues():
            refused = self.starter_refused.get(queue, [])
            starters = sum(
                1 for first, last in self.starter_spans.values() if first <= until and last >= start
            )
            bound = starters * (doublings + 2 + (until - start) / STATUS_BACKOFF_MAX) + len(
                self.order_ids
            )
            self.world.counters["refusing spells"] += 1
            self.world.counters["starter sends refused in refusing spells"] += len(refused)
            if len(refused) > bound:
                self.fail(
                    "a refusing reply queue is probed, not resent to every scan",
                    f"{queue} refused {len(refused)} of the Starter's sends in its spell "
                    f"{start:%H:%M:%S}-{until:%H:%M:%S} ({starters} Starter processes): "
                    f"more than {bound:.0f}",
                )
                return

    def check_refusing_queue_alerted(self) -> None:
        """A refusing reply queue is alerted (section 4, status delivery: "its
        operators get one StatusUndeliverable alert per spell of refusals,
        naming the queue"): a Starter process alerts at its
        STATUS_ALERT_AFTER-th refusal in a row, so once the Starter's sends a
        queue refused in its spell outnumber what every Starter process that
        ran in it could have had below that, plus one terminal send per order
        outside the scan (check_refused_resends_bounded), one of them reached
        it and a StatusUndeliverable alert names the queue."""
        alerted = {
            json.loads(m.body).get("Queue")
            for m in self.alert_messages()
            if json.loads(m.body).get("Kind") == "StatusUndeliverable"
        }
        for queue, (start, until, _) in self._refusing_reply_queues():
            refused = self.starter_refused.get(queue, [])
            starters = sum(
                1 for first, last in self.starter_spans.values() if first <= until and last >= start
            )
            below = starters * (STATUS_ALERT_AFTER - 1) + len(self.order_ids)
            if len(refused) > below and queue not in alerted:
                self.fail(
                    "a refusing reply queue is alerted",
                    f"{queue} refused {len(refused)} of the Starter's sends in its spell "
                    f"{start:%H:%M:%S}-{until:%H:%M:%S} ({starters} Starter processes; at most "
                    f"{below} without an alert): no StatusUndeliverable alert names it",
                )
                return

    def check_undeliverable_names_a_refusing_queue(self) -> None:
        """A StatusUndeliverable alert names a reply queue that refused (§4
        status delivery): the Starter raises it at the STATUS_ALERT_AFTER-th
        refusal in a row of that queue, so the queue it names refused at least
        that many sends. An alert of a Failed status the alerts queue refused
        is not the client's queue refusing (seed 104 of h11-mutants)."""
        for m in self.alert_messages():
            body = json.loads(m.body)
            if body.get("Kind") != "StatusUndeliverable":
                continue
            queue = str(body.get("Queue"))
            if self.refused_sends.get(queue, 0) < STATUS_ALERT_AFTER:
                self.fail(
                    "a StatusUndeliverable alert names a queue that refused",
                    f"{m.message_id} names {queue}, which refused "
                    f"{self.refused_sends.get(queue, 0)} sends (fewer than "
                    f"{STATUS_ALERT_AFTER}); the alerts queue refused "
                    f"{self.refused_sends.get(ALERTS_QUEUE, 0)}",
                )
                return

    def check_statuses_never_wait_for_alerts(self) -> None:
        """A client's terminal status never waits for the operators' queue
        (§4 status delivery, ADR 001): while the alerts queue refuses for
        long, a Failed or CompensationFailed status whose own reply queue
        takes sends is on it within the Starter's grace and a few of its
        back-offs (probes of a queue that keeps refusing) of its outbox entry,
        its alert kept in the entry. Checked for the entries written early
        enough in the alerts queue's spell that they would still be held at
        its end; not across the whole app's 8-day outage (nothing runs)."""
        spell = self.world.faults.refusing.get(ALERTS_QUEUE)
        if spell is None or self.o.faults.host_outage:
            return
        start, until, _ = spell
        margin = STATUS_GRACE + 3 * STATUS_BACKOFF_MAX + timedelta(minutes=1)
        refusing = dict(self._refusing_reply_queues())
        for key, entries in sorted(self.alerting_entries.items()):
            app, _ = self.orders.get(key, (None, None))
            queue = REGISTRY.get(str(app))
            if queue is None:
                continue
            sent = {m.message_id: m.sent_at or m.enqueued_at for m in self.bus.queue(queue).sent}
            for message_id, at in entries:
                if not start <= at or at + margin >= until:
                    continue
                other = refusing.get(queue)
                if other is not None and other[0] < at + margin and other[1] > start:
                    continue  # its own queue refused too
                when = sent.get(message_id)
                if when is None or when > at + margin:
                    self.fail(
                        "a client's terminal status never waits for the alerts queue",
                        f"{key}: its outbox entry {message_id} written at {at:%H:%M:%S}, the "
                        f"alerts queue refusing {start:%H:%M:%S}-{until:%H:%M:%S}; its status "
                        + (f"sent at {when:%H:%M:%S}" if when else "never sent")
                        + f", later than {at + margin:%H:%M:%S}",
                    )
                    return

    def check_breakers_open_on_failures(self) -> None:
        """Slowness and pacing are not the failures a breaker is for (issue 43
        item 1; §4 agents): an agent's reply that a call was not made because
        its service's breaker is open comes only after that service failed a
        call (a 5xx, no answer in time). A service that only answered 429s
        (rate limits) is up; a breaker opened by them refuses every request
        behind it unasked (mutant `remote-429-breaker-failure`). A breaker
        stays open `breaker_reset_timeout` after the failure that opened it
        (or reopened it, a trial call failing), and that failure's call began
        at most a step timeout before: a failure longer ago than both excuses
        no refusal (the services of a schedule with 5xx early and 429s later)."""
        marker = "circuit open for "
        window = timedelta(seconds=AgentPolicy().breaker_reset_timeout) + self.settings.step_timeout
        for m in self.bus.queue("agent-responses").sent:
            if m.props.get(ORIGINAL_ID_PROPERTY):
                # A back-off copy the gate scheduled of a reply the bridge
                # failed on (seed 12000363): sent later; its original is judged.
                continue
            try:
                body = json.loads(m.body)
                error = str(body.get("Error") or "")
            except (ValueError, AttributeError):
                continue
            if marker not in error:
                continue
            service = error.split(marker, 1)[1].split(":", 1)[0]
            failures = self.remote.failures.get(service, [])
            if not any(_refused_at(body, m.sent_at) - window <= t <= m.sent_at for t in failures):
                self.fail(
                    "a breaker opens only on a failing service",
                    f"{m.message_id} at {m.sent_at.isoformat()}: {error[:160]}; {service} had "
                    f"failed no call in the {window.total_seconds():.0f} s before "
                    "(429s only pace)",
                )
                return

    def check_undo_order(self) -> None:
        """Section 4, compensation: completed steps are undone in reverse order. Every
        instance's first undo request of each step comes after the undo of
        every later step, whatever was completed, failed or resumed."""
        for iid, undone in sorted(self.undo_sent.items()):
            names = self.o.steps.names
            order = [names.index(s) for s in undone if s in names]
            if order != sorted(order, reverse=True):
                self.fail(
                    "compensation undoes in reverse order", f"{iid} undid {', '.join(undone)}"
                )
                return

    def check_compensation_failed_tried(self, docs: dict[str, dict | None]) -> None:
        """Section 4, compensation undoes whatever may have happened: an honest
        CompensationFailed tried every undo it did not finish; each step the
        log leaves undone had an undo request sent for it."""
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
                return

    def check_rejected_not_kept(self, docs: dict[str, dict | None]) -> None:
        """Section 4, admission control: a Rejected order is not kept in the orders DB
        (unless the delivery that wrote it died, or its lineage ended in
        dead letters)."""
        for oid, doc in docs.items():
            if (
                doc
                and doc["ProcessState"] == "Rejected"
                and (oid, oid) in self.orders_c.docs
                and not self._orphaned(oid)
                and not self._ended_in_dead_letters(oid)
            ):
                self.fail("rejected order not kept", f"{oid} is Rejected but in the orders DB")

    def check_supervisor_cost(self) -> None:
        """Invariant 6: each Supervisor run's cost is bounded by its page size and page
        count (SUPERVISOR_MAX_PAGES), not by the number of records."""
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
                return

    def check_runs_survive_bad_documents(self) -> None:
        """Section 4, Supervisor scans: no Starter or Supervisor run is stopped by one
        document it cannot read (only a transient store failure may end
        one)."""
        for name, exc in self.world.raised:
            if name.startswith(("starter", "supervisor")) and not isinstance(exc, TransientError):
                self.fail(
                    "no run is stopped by one bad document",
                    f"{name} raised {type(exc).__name__}: {str(exc)[:160]}",
                )
                return

    def check_foreign_fields_kept(self) -> None:
        """Section 4, versioning (the tolerant reader): a newer version's field on a
        record survives this version's writes."""
        for oid in sorted(self.newer_fields):
            doc = self.state_c.docs.get((oid, oid))
            if doc is not None and "NewerVersionField" not in doc:
                self.fail("foreign fields are kept", f"{oid} lost NewerVersionField")
                return

    def check_bad_documents_alerted(self) -> None:
        """Section 4, operational visibility: every garbage document (foreign_docs) is
        named by an UnreadableRecord alert."""
        for junk in self._junk_unalerted()[:1]:
            self.fail("a bad document is alerted", f"{junk}: no UnreadableRecord alert")

    def check_processed_applied_every_step(self, docs: dict[str, dict | None]) -> None:
        """Invariant 7 for a Processed order: it has every step's effect, once and not
        undone (a forged ok or a lost one would leave a step without it)."""
        net = self._net_effects()
        for oid, doc in docs.items():
            if doc and doc["ProcessState"] == "Processed":
                missing = [s for s in self.o.steps.names if net[(oid, s)] != 1]
                if missing:
                    self.fail(
                        "Processed order applied every step",
                        f"{oid} is Processed but the remote service has no effect of {missing}",
                    )

    def check_compensation_restarts_bounded(self, docs: dict[str, dict | None]) -> None:
        """Invariant 5 for compensation (nothing retries forever): a compensation is
        restarted at most MAX_COMPENSATION_RESTARTS times (its long retries
        are bounded on the path: PathChecks._check_compensation_long_retry)."""
        for oid, doc in docs.items():
            if doc and (doc.get("CompensationRestarts") or 0) > MAX_COMPENSATION_RESTARTS:
                self.fail(
                    "compensation restarts bounded",
                    f"{oid} restarted its compensation {doc['CompensationRestarts']} times "
                    f"(at most {MAX_COMPENSATION_RESTARTS})",
                )
                return

    def check_compensation_failed_is_true(self, docs: dict[str, dict | None]) -> None:
        """Invariant 7 and section 4's compensation (N3; ADR 005, ADR 019a).
        No false CompensationFailed: a CompensationFailed record whose every
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
                if k.startswith(oid + "/") and out == "ok" and op in self.remote.undo_paths
            }
            applied = {
                key.split("|")[0].split("/", 1)[1]
                for key in self.remote.ledger.results
                if key.startswith(oid + "/") and key.split("|")[1] in self.remote.undo_paths
            }
            if open_steps and all(s in answered | applied for s in open_steps):
                self.fail(
                    "no false CompensationFailed",
                    f"{oid}: undo of {open_steps} succeeded remotely, record says CompensationFailed",
                )

    def check_undo_answers_heard(self) -> None:
        """Section 4, compensation: every try's answer counts until the undo's
        deadline (ADR 005), read from the task hub's histories at the end, on
        the path: an episode of a compensation that hears an OK answer to any
        try of an undo (the first copy of that try's reply event, which is the
        one the orchestration takes; earlier than the undo's ListenUntil less
        the clocks' skew and a second) whose outcome it has not yet written,
        while no activity of it is outstanding and no timer fired with it,
        schedules that undo's UndoDone write in the same episode, or, when
        that episode also started activities, in the episode that sees the
        last of them settled: the SDK hands an episode's new events to the
        orchestration one at a time, so an earlier try's OK queued behind the
        current try's transient answer reaches it after it has started the
        next try (seed 28000319). (An undo that listens only to its latest try
        leaves an earlier try's late OK unheard, and waits on, or ends the undo
        unconfirmed.)"""
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
            # OKs heard in an episode that also scheduled activities: the SDK
            # hands an episode's events over one at a time, so an OK behind a
            # try's transient answer reaches the orchestration after it has
            # started that try's successor; it must be recorded once those
            # activities are settled.
            behind: list[tuple[str, str, set[Any]]] = []
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
                ids = {e.get("EventId") for e in scheduled}
                pending = outstanding - ids
                started = {e.get("EventId") for e in scheduled if e.get("Name") != "write_state"}
                late = [(step, name) for step, name, wait in behind if not wait & pending]
                behind = [b for b in behind if b[2] & pending]
                for step, name, was_behind in [
                    *((step, name, False) for step, name in due),
                    *((step, name, True) for step, name in late),
                ]:
                    if step in outcomes | written or pending or fired or waiting_retry:
                        continue
                    if started and not was_behind:
                        behind.append((step, name, started))
                        continue
                    self.undo_unheard.append(
                        f"{iid} heard {name} answer OK before the undo's deadline, with "
                        f"nothing else outstanding, and did not record the undo of {step} done"
                    )
                written |= {str(s) for s in outcomes}

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
        if status == "Failed" and store_unavailable(str(output)):
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
        bodies = (json.loads(m.body) for m in self.alert_messages())
        # Nor one about a forged message refused for another reason (an
        # insider's lax-typed reply is InvalidMessage), or about a copy of one.
        forged = {
            m.message_id
            for q in ("agent-requests", "agent-responses")
            for m in self.bus.queue(q).sent
            if str(m.props.get(ORIGINAL_ID_PROPERTY) or m.message_id).startswith(FORGED)
        }
        return {
            b.get("OrderID")
            for b in bodies
            if b.get("Kind") not in FORGERY_ALERTS and b.get("MessageId") not in forged
        }

    def _junk_unalerted(self) -> list[str]:
        if not self.junk:
            return []
        said = " ".join(
            json.loads(m.body).get("Reason") or ""
            for m in self.alert_messages()
            if b"UnreadableRecord" in m.body
        )
        return [junk for junk in self.junk if junk not in said]


def _outcome_of(event_input: str | None) -> str | None:
    try:
        value = json.loads(event_input or "null")
        if isinstance(value, str):
            value = json.loads(value)
        return value.get("Outcome") if isinstance(value, dict) else None
    except ValueError:
        return None


def _refused_at(reply: dict, sent_at: datetime) -> datetime:
    """When the agent met the open breaker: after its last call, which its
    reply records (Calls[].At and Ms). A reply's send can come much later (its
    process paused across a long outage), and the window is the breaker's, not
    the send's."""
    ends = []
    for call in reply.get("Calls") or []:
        try:
            at = datetime.fromisoformat(str(call["At"]))
            ends.append(at + timedelta(milliseconds=float(call.get("Ms") or 0)))
        except (KeyError, TypeError, ValueError):
            continue
    return min(max(ends), sent_at) if ends else sent_at
