"""The schedule's clients and operators: each order's client message and
what the seed draws for it (a same-data or changed resend, a bad message, an
order in another application's name), the client told Rejected who sends
again, and an operator's resubmit or compensate (reading the console first in
the fallible world)."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from typing import Any

from adapters.ports import ANY_OWNER
from domain import state_machine as sm
from domain.errors import DomainError

from .observed import Observed
from .options import (
    APPS,
    CHANGED_TOTAL,
    IMPERSONATION,
    INGRESS_OF,
    REGISTRY,
)
from .world import START


class Clients(Observed):
    """The clients and operators (see the module); Simulation drives them."""

    submitted: set[str]  # orders whose client message was sent
    operator_pending: int  # actions and resends still to come: the schedule waits
    impersonated: bool
    told_rejected: set[str]
    store: Any  # the product's state store (adapters.state_store.CosmosStateStore)

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

    def _foreign_senders(self) -> None:
        """The foreign-senders world's clients (Options.reply_thief,
        lax_client), at moments of the first minute from a stream of their
        own, each about an order of its own (`{OrderID}-RQ`, `{OrderID}-LAX`)
        and judged as a bad message of an order's client (check 4, with the
        alert of its kind; a status it got anywhere is one of an order no
        application sent, `check_applications_apart`):

        - a registered application's client names the other application's
          reply queue in its own order, on its own ingress queue: it must
          be refused (ReplyQueueNotAllowed), never sent to (section 4);
        - a client whose JSON library writes lax types, a Quantity as the
          string "2": the contract does not coerce (ADR 013), so the order
          is refused (InvalidMessage) and creates nothing (the Quantity is
          strict by its own field; the codec's strict validation is what
          refuses a timestamp written as a number, which only the insider
          of sim.hostile sends)."""
        rng = random.Random(f"foreign-senders/clients/{self.seed}")
        if self.o.reply_thief:
            key = self.order_ids[0]
            app, own = self.orders[key]
            other = next(a for a in APPS if a != app)
            payload = json.loads(self._order_body(key, oid=f"{own}-RQ"))
            payload["ReplyTo"] = REGISTRY[other]
            at = START + timedelta(seconds=round(rng.uniform(0, 60), 3))
            mid = f"{key}/reply-queue"
            self.bad[mid] = "reply-queue"
            self._send_later(at, INGRESS_OF[app], json.dumps(payload).encode(), mid)
        if self.o.lax_client:
            key = rng.choice(self.order_ids)
            app, own = self.orders[key]
            lax = json.loads(self._order_body(key, oid=f"{own}-LAX"))
            for line in lax["Lines"]:
                line["Quantity"] = str(line["Quantity"])
            at = START + timedelta(seconds=round(rng.uniform(0, 60), 3))
            lax_mid = f"{key}/lax-typed"
            self.bad[lax_mid] = "lax-typed"
            self._send_later(at, INGRESS_OF[app], json.dumps(lax).encode(), lax_mid)

    def _send_later(self, at: datetime, queue: str, body: bytes, message_id: str) -> None:
        """A client's message sent at `at`; the schedule waits for it, as for
        an operator (it may come after every order ended)."""
        self.operator_pending += 1

        def send() -> None:
            self.operator_pending -= 1
            self.bus.send(queue, body, message_id)

        self.world.at(at, "client", send)

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
        # The same order, its amounts written as another client library writes
        # them ("20.0" for "20.00": the same decimal, which Submit compares
        # canonically, OrderSubmitted.immutable_fields); no draw.
        same = json.loads(self._order_body(key))
        same["Total"] = same["Total"].removesuffix("0")
        for line in same["Lines"]:
            line["UnitPrice"] = line["UnitPrice"].removesuffix("0")
        self.bus.send(INGRESS_OF[app], json.dumps(same).encode(), f"{own}/resend")

    def _impersonate(self) -> None:
        """The second application's client sends an order in the first's
        name (its AppId) with its own reply queue, on its own ingress queue."""
        victim, sender = APPS
        payload = json.loads(self._order_body(self.order_ids[0]))
        payload.update(OrderID=f"ORD-{self.seed}-IMP", AppId=victim, ReplyTo=REGISTRY[sender])
        self.bus.send(INGRESS_OF[sender], json.dumps(payload).encode(), IMPERSONATION)
        self.impersonated = True

    async def _console_look(self, action: str) -> None:
        """What an operator reads in the console before acting (the fallible
        world): one page of the orders in the state the action is for."""
        from adapters.console_reads import ConsoleReads

        state = {"resubmit": "Error", "compensate": "Processing"}[action]
        rows, _ = await ConsoleReads(self.state_c).list_orders(state, 20)
        self.world.log(f"operator console: {len(rows)} {state}")

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

    def _schedule_order(self, i: int, oid: str) -> None:
        """Order `oid` (the i-th): its client's message, and what the seed
        draws for it: a resend, the impersonator (with the first), a bad
        message, an operator's action."""
        w, o = self.world, self.o
        f = o.faults
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
        if i == 0:
            self._foreign_senders()
        if i == 0 and o.impersonation:
            w.at(
                START
                + timedelta(seconds=random.Random(f"impersonate/at/{self.seed}").uniform(0, 60)),
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
