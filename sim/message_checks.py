"""The end's checks of what went through the queues (docs/design.md section 7,
invariant 4, and section 4's messaging protocols): dead letters and their
reasons, bad submissions, alerts, late replies, applications kept apart, and
the lineage predicates (a message, its redeliveries and its back-off copies)
the other checks judge dead letters by."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import replace
from datetime import datetime

from adapters.durable_client import GONE_MARKERS
from adapters.servicebus import ALERTS_QUEUE
from adapters.settlement import ORIGINAL_ID_PROPERTY
from domain.ids import order_key

from .bus import (
    Msg,
    copy_root,
    later_copy,
)
from .hostile import PREFIX as FORGED
from .observed import Observed
from .options import (
    ALERT_REPEAT,
    APP_OF_INGRESS,
    APPS,
    IMPERSONATION,
    INGRESS_OF,
    REGISTRY,
    TERMINAL_STATUS,
)
from .world import START

# The alert kind each bad submission's dead letter raises (a conflict's is
# judged by the order it names): sim.clients' bad messages and foreign senders.
BAD_ALERT = {
    "malformed": "InvalidMessage",
    "amqp-value": "InvalidMessage",
    "lax-typed": "InvalidMessage",
    "reply-queue": "ReplyQueueNotAllowed",
}


class MessageChecks(Observed):
    """The queue checks (see the module); EndChecks runs them."""

    # Who wrote each orders-DB document last, each delivery's lineage and
    # start, and the deliveries that ended before they finished (the drive's).
    orders_writer: dict[str, tuple[int | None, datetime]]
    delivery_of: dict[int, tuple[str, datetime]]
    delivery_root: dict[int, str]  # each delivery's back-off lineage (bus.copy_root)
    lineage_starts: dict[str, list[datetime]]
    unfinished: set[int]

    alert_ledger: dict[str, list[tuple[str | None, bytes]]]

    def alert_messages(self) -> list[Msg]:
        """The alerts as operators count them: each message on the alerts
        queue, an aggregate (reporting.alerts) read as the alerts it counted
        (the drive's ledger of them), each under its own alert id, at the
        time the aggregate was sent. Every check of alerts reads these."""
        out: list[Msg] = []
        for m in self.bus.queue(ALERTS_QUEUE).sent:
            counted = self.alert_ledger.get(m.message_id)
            if counted is None:
                out.append(m)
                continue
            for n, (alert_id, body) in enumerate(counted):
                out.append(replace(m, message_id=alert_id or f"{m.message_id}#{n}", body=body))
        return out

    def check_alerts_count_what_they_aggregate(self) -> None:
        """Section 4, operational visibility (docs/operations.md, "Alerts"):
        an aggregate's Count is the number of alerts it counted, its first
        and last examples are the first and last of them, and every counted
        alert reached the alerts queue in an aggregate (none dropped at a
        window's end, at shutdown, or by a refused send)."""
        sent = {m.message_id: json.loads(m.body) for m in self.bus.queue(ALERTS_QUEUE).sent}
        for aggregate_id, counted in sorted(self.alert_ledger.items()):
            body = sent.get(aggregate_id)
            if body is None:
                self.fail(
                    "every counted alert sent",
                    f"{aggregate_id}: {len(counted)} alerts counted, never sent",
                )
                return
            first, last = json.loads(counted[0][1]), json.loads(counted[-1][1])
            if (
                body.get("Count", 1) != len(counted)
                or body.get("MessageId") != first.get("MessageId")
                or (body.get("Last") or {}).get("MessageId") != last.get("MessageId")
            ):
                self.fail(
                    "every counted alert sent",
                    f"{aggregate_id}: Count {body.get('Count', 1)} for {len(counted)} counted "
                    f"(first {body.get('MessageId')}, last {(body.get('Last') or {}).get('MessageId')})",
                )
                return

    def check_one_alert_per_incident(self) -> None:
        """Section 4, operational visibility: an alert raised again under its own
        stable id (a retried outbox entry, a redelivered dead letter)
        reaches operators once; an incident that lasts days may page again
        once per ALERT_REPEAT."""
        sent_at: dict[str, list[datetime]] = {}
        for m in self.alert_messages():
            sent_at.setdefault(m.message_id, []).append(m.visible_at)
        for mid, times in sorted(sent_at.items()):
            gaps = [b - a for a, b in itertools.pairwise(sorted(times))]
            if any(gap < ALERT_REPEAT for gap in gaps):
                self.fail(
                    "one alert per incident",
                    f"{mid} reached the alerts queue {len(times)} times within {ALERT_REPEAT}",
                )
                return

    def check_real_replies_not_dead_lettered(self) -> None:
        """Section 4, late replies change nothing: a real reply (not a forgery, nor a
        delayed copy of one) that comes too late (its instance gone) is
        completed, never retried into the dead-letter queue; one whose
        instance still waits may end there only as the gate's last resort
        (RetriesExhausted: its event could not be raised on any delivery and
        no retry could be scheduled), or by the broker when every delivery
        met an injected fault (Bus.every_delivery_faulted). The broker may
        also dead-letter (MaxDeliveryCountExceeded) a message whose back-off
        copy the queue already accepted: the reply goes on in that copy, and
        the dead letter is a leftover of its lineage (seed 209, 50 orders:
        the copy's complete failed after it scheduled the next copy, and its
        redeliveries met faults or a refused schedule)."""
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
                return

    def check_dead_letters_have_reasons(self) -> None:
        """Invariant 4: every dead-lettered message, on any queue, has a reason."""
        for q in self.bus.queues.values():
            for m in q.dead:
                if not m.dead_letter_reason:
                    self.fail("4 dead-lettered with a reason", f"{q.name} {m.message_id}")

    def check_bad_submissions(self, alerted: set[str | None]) -> None:
        """Invariant 4: every conflicting or malformed submission (and the
        foreign senders' stolen reply queue and lax types, Clients._foreign_senders)
        is dead-lettered by its handler with a reason and alerted with its
        kind (BAD_ALERT; judged by its lineage: the original and its back-off
        copies)."""
        kinds = Counter(json.loads(m.body).get("Kind") for m in self.alert_messages())
        for mid, kind in sorted(self.bad.items()):
            self._check_bad_submission(mid, kind, kinds, alerted)

    def _check_bad_submission(
        self, mid: str, kind: str, kinds: Counter, alerted: set[str | None]
    ) -> None:
        """One bad submission's lineage (check_bad_submissions): a verdict of
        its handler, or, when the broker's dead letters are explained, no
        member completed as if valid."""
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
            return
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
            kind != "conflict" and not kinds[BAD_ALERT[kind]]
        ):
            self.fail(
                "4 bad submission alerted",
                f"{mid} ({kind}) dead-lettered with {reason}, no alert",
            )

    def check_changed_resends(self) -> None:
        """Invariant 4 (no record overwritten) and section 4's idempotent
        submit: a client's changed resend of a Rejected order is a conflict,
        dead-lettered OrderConflict; the orders DB keeps the order first
        accepted."""
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
            # Or by the gate's last resort with its alert (`_unfinished_dead_letter`, as for
            # the order's own lineages): a store down through every delivery while no
            # back-off copy could be scheduled, so no delivery could read the record
            # (seed 90029: the ingress queue full, Cosmos out for 2.5 s, five deliveries in
            # 0.3 s); the orders DB still holds the first copy (checked above).
            unexplained = [
                m
                for m in dead
                if not self.bus.every_delivery_faulted(m)  # the broker's verdict
                and not any(later_copy(m, c) for c in ingress.sent)
                and not self._unfinished_dead_letter(ingress.name, m, alerted=True)
            ]
            if unexplained:
                self.fail(
                    "a changed resend of a Rejected order is a conflict",
                    f"{mid} ({key}) dead-lettered {unexplained[0].dead_letter_reason}, "
                    "not OrderConflict",
                )
                break
            broker = any(
                self.bus.every_delivery_faulted(m)
                or self._unfinished_dead_letter(ingress.name, m, alerted=True)
                for m in dead
            )
            if not broker and not any(mine(m) for m in ingress.messages):
                self.fail(
                    "a changed resend of a Rejected order is a conflict",
                    f"{mid} ({key}, Total changed) was completed as if valid",
                )
                break

    def check_impersonation(self) -> None:
        """Section 4, reply queues are access-controlled (ADR 017f): an order
        sent on one application's ingress queue in another's name creates
        nothing under the other's keys and is dead-lettered."""
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

    def check_applications_apart(
        self, docs: dict[str, dict | None], statuses: dict[str, list[dict]]
    ) -> None:
        """Section 4, reply queues are access-controlled, and ADR 017f (order
        keys): OrderIDs belong to their application: two applications posting one
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
        for m in self.alert_messages():
            alert = json.loads(m.body)
            if alert.get("Kind") == "OrderConflict" and alert.get("OrderID") not in deliberate:
                self.fail(
                    "conflict crossed applications",
                    f"OrderConflict alert for {alert.get('OrderID')}: {alert.get('Reason')}",
                )

    def _orphaned(self, key: str) -> bool:
        """The orders-DB document under `key` was last written by a delivery
        that ended before it finished (its host died, or it raised), and no
        delivery of that message's lineage started after the write: nothing
        in the product knows of it any more until the order is sent again,
        when Submit takes a conflicting copy's document back
        (_unless_in_the_way; seed 3005811: the changed resend's two deliveries
        ran at once, one dead-lettered the message, the other wrote the
        document again and its host died); or every delivery after the write
        failed and the writer's lineage ended in dead letters no handler
        finished. Garbage, not a kept order."""
        token, at = self.orders_writer.get(key, (None, START))
        if token is None or token not in self.delivery_of:
            return False
        lineage = self.delivery_of[token][0]
        if token in self.unfinished and not any(
            start > at for start in self.lineage_starts.get(lineage, ())
        ):
            return True
        # Or the deliveries after the write could not take it back, and the
        # writer's lineage ended in dead letters no handler finished (the
        # fault surface's seed 77 of 3 orders: a changed resend's four
        # deliveries in 0.5 s, its ingress queue full, Cosmos out through
        # all of them; the gate's RetriesExhausted with its alert).
        # The writer's own back-off lineage, not every message under its name: a
        # client's message sent twice is two lineages, and the other may have
        # finished the order before this one wrote (scale seed 38008855, 2 orders:
        # one copy rejected the order and took its document; the other, in
        # back-off till then, wrote it again, met failing stores on every
        # delivery and dead-lettered RetriesExhausted, its queue full).
        queue, _, origin = lineage.partition(" ")
        writer_root = self.delivery_root.get(token)
        if not self._dead_lineages(queue, {origin}, root=writer_root):
            return False
        # ...and no message of the order's own (which would take it back)
        # came after the write, unless it ended so too. The writer's own back-off
        # copies are its lineage, dead as just checked, not a message after it
        # (scale seed 48010480, 3 orders: a resend's first delivery wrote the
        # document and went to back-off, and its copy's every delivery was refused
        # its own copy on the full ingress queue, until RetriesExhausted; the
        # copy, sent after the write, was taken for a new message of the order).
        app, own = self.orders[key]
        names = {own, f"{own}/resend"}
        later = any(
            str(m.props.get(ORIGINAL_ID_PROPERTY) or m.message_id) in names
            and m.enqueued_at is not None
            and m.enqueued_at > at
            and copy_root(m.message_id, m.seq) != writer_root
            for m in self.bus.queue(INGRESS_OF[app]).sent
        )
        return not later or self._dead_lineages(queue, names)

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
        return self._dead_lineages(INGRESS_OF[app], {own, f"{own}/resend"})

    def _dead_lineages(self, queue: str, names: set[str], root: str | None = None) -> bool:
        """Every message of the lineages `names` on `queue` (their first
        messages' ids; with `root`, only the back-off lineage of that first
        message, bus.copy_root) that the handler did not carry to a settlement
        ended in a dead letter no handler finished (`_unfinished_dead_letter`,
        with its alert), and none completed."""
        ingress = self.bus.queue(queue)

        def member(m: Msg) -> bool:
            return str(m.props.get(ORIGINAL_ID_PROPERTY) or m.message_id) in names and (
                root is None or copy_root(m.message_id, m.seq) == root
            )

        members = [m for m in ingress.sent if member(m)]
        dead = [m for m in ingress.dead if member(m)]
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
        reports (infra/app/alerts.bicep: any dead letter on any queue).
        Not the gate's last resort, RetriesExhausted by a delivery whose
        back-off copy could not be scheduled (Msg.copy_faulted) and whose
        alert was refused too (seed 2 with its ingress queue full, in the
        fault surface's targeted pass: four deliveries in 0.3 s, every copy
        refused, and the last one's alert refused by a failing alerts send):
        since 44f5a86 the gate holds that alert (Alerts.hold) and sends it
        once the alerts queue takes it, at the latest at the process's
        shutdown, so the dead letter is judged with its alert like any
        other (mutant `gate-held-alert-dropped`, sim/mutants.json).
        With `alerted`, also the gate's RetriesExhausted whose alert went out
        (seed 894): a caller that asks no more of it than its alert. A
        message and its back-off copies alert once between them (one alert
        id, adapters.settlement._alert_source): the alert of another dead
        letter of `m`'s lineage is `m`'s too, the alerts queue dropping the
        later ones as duplicates (seed 26000797, 50 orders: three copies of
        one Rejected order's message dead-lettered, one alert)."""
        if m.dead_letter_reason == "MaxDeliveryCountExceeded":
            return self.bus.every_delivery_faulted(m)
        if m.dead_letter_reason != "RetriesExhausted":
            return False

        def lineage(message_id: object) -> str | None:
            for sent in self.bus.queue(queue).sent:
                if sent.message_id == message_id:
                    return str(sent.props.get(ORIGINAL_ID_PROPERTY) or sent.message_id)
            return None

        def names_m(alert: dict) -> bool:
            return (
                alert.get("Kind") == "RetriesExhausted"
                and alert.get("MessageId") == m.message_id
                and alert.get("Queue") == queue
            )

        def names_m_lineage(alert: dict) -> bool:
            own = str(m.props.get(ORIGINAL_ID_PROPERTY) or m.message_id)
            return (
                alert.get("Kind") == "RetriesExhausted"
                and alert.get("Queue") == queue
                and lineage(alert.get("MessageId")) == own
            )

        return alerted and any(
            names_m(body) or names_m_lineage(body)
            for body in (json.loads(a.body) for a in self.alert_messages())
        )
