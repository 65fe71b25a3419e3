"""The world's faults that need the schedule's stores and queues to set up
(the rest are drawn in `sim.options.options_for` and injected by
`sim.world.Faults` at each call): documents no version of the product wrote
(garbage and a newer version's field), the fallible world's Cosmos outage
and blips, Service Bus outages, full queues and host starts, the hosts'
outage, restarts and lost leases, throttling storms and bursts, a remote
service's outage; and the two faults the
schedule decides as it runs (a lagging Supervisor read, a compensation
execution that dies)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

from adapters.ports import bucket_of
from adapters.recovery_index import entry_id
from adapters.servicebus import AGENT_REQUESTS_QUEUE, AGENT_RESPONSES_QUEUE, ALERTS_QUEUE

from .cosmos import SimCosmosClient
from .observed import Observed, cosmos_text
from .options import HOST_OUTAGE, INGRESS_OF, REGISTRY
from .world import START, Outages


class WorldFaults(Observed):
    """The faults of the world set up over the schedule's state (see the module)."""

    index_shards: int
    compensation_died: Counter[str]  # order key -> compensation executions that died
    _lag_rng: random.Random  # the lagging Supervisor's reads, a stream of its own

    def _install_faults(self, fault_end: datetime) -> None:
        """The stores' and services' faults of the schedule, in the order
        their draws are made (each draw moves the seed's streams): a
        throttling storm and bursts, a remote service's outage, foreign
        documents, then the fallible world's."""
        w, o = self.world, self.o
        f = o.faults
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
                "CompleteBy": cosmos_text(past.isoformat()),
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
        self._refusing_reply()
        self._refusing_alerts()
        self._tenant_throttle()
        self._replies_full_in_worker()
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

    def _refusing_reply(self) -> None:
        """A client's reply queue that refuses every send for hours
        (FaultConfig.refusing_reply, issue 43): disabled, deleted, the app's
        Sender role removed, or full, from a moment in the fault window; the
        window outlasts the faults (sim.world.Faults.queue_refuses), and the
        schedule runs until it has ended (Simulation.run, fixed_point)."""
        w, f = self.world, self.o.faults
        if not f.refusing_reply:
            return
        rng = random.Random(f"refusing-reply/window/{self.seed}")
        queue = rng.choice([REGISTRY["webshop"]] if self.o.apps == 1 else sorted(REGISTRY.values()))
        start = START + timedelta(seconds=round(rng.uniform(0, self.o.fault_window), 3))
        until = start + timedelta(seconds=f.refusing_seconds)
        if w.faults.draw(1.0, "refusing_reply", f"{queue} {f.refusing_reply}"):
            w.faults.refusing[queue] = (start, until, f.refusing_reply)
            w.log(
                f"queue {queue} {f.refusing_reply}: every send refused from "
                f"{start.isoformat()} until {until.isoformat()}"
            )

    def _refusing_alerts(self) -> None:
        """The `alerts` queue refusing every send for 15-45 minutes
        (FaultConfig.refusing_alerts) from a moment in the first minute, as
        a refusing reply queue does (sim.world.Faults.queue_refuses): the
        schedule runs until it has ended and what it held has been sent."""
        w, f = self.world, self.o.faults
        if not f.refusing_alerts:
            return
        rng = random.Random(f"refusing-alerts/window/{self.seed}")
        start = START + timedelta(seconds=round(rng.uniform(0, 60), 3))
        until = start + timedelta(seconds=f.refusing_alerts_seconds)
        if w.faults.draw(1.0, "refusing_alerts", f"{ALERTS_QUEUE} {f.refusing_alerts}", rng=rng):
            w.faults.refusing[ALERTS_QUEUE] = (start, until, f.refusing_alerts)
            w.log(
                f"queue {ALERTS_QUEUE} {f.refusing_alerts}: every send refused from "
                f"{start.isoformat()} until {until.isoformat()}"
            )

    def _tenant_throttle(self) -> None:
        """A provider throttling the whole tenant (FaultConfig.tenant_throttle)
        for a while within the fault window: every call to its service is
        answered 429 (sim.remote.SimRemote._rate_limited)."""
        w, f = self.world, self.o.faults
        if not f.tenant_throttle:
            return
        rng = random.Random(f"tenant-throttle/window/{self.seed}")
        service = rng.choice(sorted({s.service for s in self.o.steps.steps}))
        start = START + timedelta(seconds=round(rng.uniform(0, self.o.fault_window - 20), 3))
        until = start + timedelta(seconds=f.tenant_throttle)
        if w.faults.draw(1.0, "tenant_throttle", f"{service} for {f.tenant_throttle}s", rng=rng):
            w.faults.throttled = (start, until, service)
            w.log(
                f"{service} throttles the tenant from {start.isoformat()} until {until.isoformat()}"
            )

    def _replies_full_in_worker(self) -> None:
        """The agents' reply queue full (FaultConfig.replies_full_in_worker)
        from a moment of the first standalone worker run, as `entity_full`
        makes a queue full: every reply refused, so each request the worker
        (or the Functions agent) handles meanwhile is delivered again at once."""
        w, f = self.world, self.o.faults
        if not f.replies_full_in_worker or not self.o.workers:
            return
        run = self.o.workers[0]
        rng = random.Random(f"replies-full/window/{self.seed}")
        start = START + timedelta(
            seconds=round(rng.uniform(run.start, max(run.start, run.stop - 20)), 3)
        )
        seconds = f.replies_full_in_worker
        if w.faults.draw(1.0, "entity_full", f"{AGENT_RESPONSES_QUEUE} for {seconds}s", rng=rng):
            w.faults.full.setdefault(
                AGENT_RESPONSES_QUEUE, Outages(f"queue {AGENT_RESPONSES_QUEUE} full")
            ).begin(start, seconds)
            w.log(f"queue {AGENT_RESPONSES_QUEUE} full for {seconds}s from {start.isoformat()}")

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

    def _schedule_host_faults(self, end: datetime) -> datetime:
        """The host processes' faults: an outage of the whole app (which moves
        the schedule's end, returned), host restarts and lost leases of the
        singleton lock."""
        w, o = self.world, self.o
        f = o.faults
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
        return end
