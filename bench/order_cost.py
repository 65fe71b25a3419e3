"""What one happy-path order costs, measured: the product's own code runs one
order through the simulation (sim/, no faults, one application) and every
request it makes is recorded with the documents it sends and reads.

Measured (counted from what the code did, not assumed):

- every Cosmos request, by container, kind and caller, with the body written,
  the version it replaced and what came back; RU from those documents and the
  Bicep's indexing policies through the published model (bench/cosmos_ru.py);
- every Service Bus message sent (queue, bytes) and every delivery our
  functions took;
- Durable: the instance's history events and their bytes (compact JSON of the
  events as the host keeps them), activities, timers, external events and
  orchestrator episodes.

Derived from those counts by stated rules (bench/capacity.py says which):
Service Bus operations and credits, Functions executions, Durable Task
Scheduler actions, Azure Storage transactions of the Durable Azure Storage
provider, AWS Step Functions transitions and Temporal actions of the same saga.

The Starter's and the Supervisor's periodic runs are kept apart from the
order's own requests by the host bench's rule (bench/host_cost.py: their
queries and the shared documents; a claim of an order is the order's): they
cost per run, not per order, and are reported per run (measured on an almost
empty store, so they understate a large backlog).
So is the fast path's block of admission slots (a read and a write of the
admission document, domain.admission): it serves FAST_PATH_BLOCK orders at
volume (a lone order pays it whole), and is reported per block.

Happy-path orders are measured ORDERS at a time and each figure is per order,
as the host bench divides its counts (bench/pipeline_bench.py): the recovery
index's removals go in batches (adapters/recovery_index.py), flushed at the
end, and the backlog gauge is read once per cache period, not per order
(both sides class it as periodic work, bench/host_cost.py).

    python -m bench.order_cost [--scan index|query] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench.cosmos_ru import Op, RuModel, bicep_policies, stored_bytes  # noqa: E402
from bench.host_cost import periodic  # noqa: E402

LIMITS = Path(__file__).with_name("limits.yaml")
PERIODIC = ("starter", "supervisor")
BLOCK = "fast-path block"  # the fast path's admission slots, per block (module docstring)
ADMISSION_ID = "_admission"  # adapters.state_store.ADMISSION_ID
SEED = 1
ORDERS = 20


def load_limits(path: Path = LIMITS) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@dataclass
class OrderCost:
    scan: str
    cosmos_requests: dict[str, float]  # "container kind" -> count per order (the order's own)
    cosmos_ru: dict[str, float]  # "container kind" -> RU (the order's own)
    cosmos_ru_by_caller: dict[str, float]
    cosmos_ru_by_partition: dict[str, float]  # "container pk" -> RU (hot-partition check)
    cosmos_docs: dict[str, int]  # "container" -> stored bytes of the last version
    periodic_ru_per_run: dict[str, float]  # "starter"/"supervisor" -> RU per run
    periodic_requests_per_run: dict[str, float]
    sb_sent: dict[str, float]  # queue -> messages sent
    sb_sent_bytes: int
    sb_delivered: dict[str, float]  # queue -> deliveries our functions took
    history_events: float
    history_bytes: float
    activities: float
    timers: float
    timers_fired: float
    events_raised: float
    episodes: float
    outcome: str
    orders: int = 1
    counted_on: str = "simulation"  # or "host": with_host_counts
    write_sizes: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def cosmos_ru_per_order(self) -> float:
        return sum(self.cosmos_ru.values())

    @property
    def cosmos_requests_per_order(self) -> float:
        return sum(self.cosmos_requests.values())

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out["cosmos_ru_per_order"] = round(self.cosmos_ru_per_order, 1)
        out["cosmos_requests_per_order"] = round(self.cosmos_requests_per_order, 2)
        return out


class _Recorder:
    """Wraps one simulated container's methods (on the instance only) so that
    every request is recorded with the documents it touched."""

    def __init__(self, sim: Any, container: Any, ops: list[Op]) -> None:
        self.sim, self.c, self.ops = sim, container, ops
        for name in (
            "create_item",
            "upsert_item",
            "replace_item",
            "read_item",
            "delete_item",
            "execute_item_batch",
        ):
            setattr(container, name, self._wrap(name, getattr(container, name)))
        query = container.query_items

        def query_items(*args: Any, **kwargs: Any) -> Any:
            pages = query(*args, **kwargs)
            recorder = self

            class _Counted:
                def __aiter__(self) -> Any:
                    return self._gen()

                async def _gen(self) -> Any:
                    op = Op(recorder.c.name, "query", recorder.sim._actor())
                    recorder.ops.append(op)
                    async for item in pages:
                        op.returned.append(item)
                        yield item

            return _Counted()

        container.query_items = query_items

    def _key(self, body: dict[str, Any]) -> tuple[str, str]:
        return self.c._key_of(body)

    def _wrap(self, name: str, method: Any) -> Any:
        kind = {
            "create_item": "create",
            "upsert_item": "upsert",
            "replace_item": "replace",
            "read_item": "read",
            "delete_item": "delete",
            "execute_item_batch": "batch",
        }[name]

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            op = Op(self.c.name, kind, self.sim._actor())
            if kind in ("create", "upsert", "replace"):
                body = kwargs.get("body", args[-1] if args else None)
                op.new = dict(body)
                op.old = self.c.docs.get(self._key(body))
            elif kind in ("read", "delete"):
                item = kwargs.get("item", args[0] if args else None)
                pk = kwargs.get("partition_key", args[1] if len(args) > 1 else None)
                op.old = self.c.docs.get((str(pk), str(item)))
            elif kind == "batch":
                ops = kwargs.get("batch_operations", args[0] if args else [])
                pk = kwargs.get("partition_key", args[1] if len(args) > 1 else None)
                op.deleted = [
                    self.c.docs[(str(pk), str(o[1][0]))]
                    for o in ops
                    if (str(pk), str(o[1][0])) in self.c.docs
                ]
            self.ops.append(op)
            try:
                result = await method(*args, **kwargs)
            except Exception:
                op.failed = True  # a 404, 409 or 412: charged as one (small) request
                raise
            if kind == "read" and isinstance(result, dict):
                op.returned = [result]
            return result

        return recorded


def _admission(op: Op) -> bool:
    doc = op.new or op.old or (op.returned[0] if op.returned else None)
    return isinstance(doc, dict) and doc.get("id") == ADMISSION_ID


def _partition(op: Op) -> str:
    doc = op.new or op.old or (op.deleted[0] if op.deleted else None)
    if not doc:
        return f"{op.container} (query)"
    key = "bucket" if op.container == "index" else "id"
    return f"{op.container} {doc.get(key)}"


def _bench_orders(sim: Any) -> None:
    """The simulation's orders given the lines, customer and payment reference
    of the orders `make bench` posts (cli.orders.generate, seed 1): the data
    every request carries is then the same size on both sides."""
    from cli.orders import generate

    shapes = list(generate("webshop", "replies-webshop", len(sim.order_ids), "B", seed=SEED))
    position = {key: i for i, key in enumerate(sim.order_ids)}
    original = sim._order_body

    def order_body(key: str, total: str = "20.00", oid: str | None = None) -> bytes:
        data = json.loads(original(key, total, oid))
        if key in position and total == "20.00":  # not a changed or conflicting copy
            shape = shapes[position[key]].model_dump(mode="json")
            data.update({k: shape[k] for k in ("Customer", "Lines", "Total", "PaymentReference")})
        return json.dumps(data).encode()

    sim._order_body = order_body


def bicep_default_shards() -> int:
    from bench.capacity import bicep_defaults

    return int(bicep_defaults().get("recoveryIndexShards") or 1)


def measure(
    scan: str = "index", limits: dict[str, Any] | None = None, orders: int = ORDERS
) -> OrderCost:
    """`orders` happy-path orders through the simulation, measured, per order."""
    from sim.system import Options, Simulation
    from sim.world import FaultConfig

    limits = limits or load_limits()
    model = RuModel(limits, bicep_policies())
    was_disabled = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="Potential duplicate Task completion")
    options = Options(
        orders=orders,
        scan=scan,
        page_size=100,
        faults=FaultConfig(),
        apps=1,
        index_shards=bicep_default_shards(),  # RECOVERY_INDEX_SHARDS as deployed (ADR 019b)
    )
    sim = Simulation(SEED, 1, options=options, apps=1, hostile=0)
    _bench_orders(sim)
    ops: list[Op] = []
    for container in (sim.state_c, sim.orders_c, sim.index_c):
        _Recorder(sim, container, ops)
    runs: Counter[str] = Counter()
    for name in PERIODIC:
        method = getattr(sim, f"_{name}_run")

        async def counted(method: Any = method, name: str = name) -> None:
            runs[name] += 1
            await method()

        setattr(sim, f"_{name}_run", counted)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(sim.run())
        # The index removals still gathering for a batch (adapters/recovery_index.py).
        flush = getattr(sim.index, "flush", None)
        if flush is not None:
            loop.run_until_complete(flush())
    finally:
        loop.close()
        logging.disable(was_disabled)
    if sim.violations:
        raise RuntimeError(f"the measured order broke a check: {sim.violations[0]}")
    oid = sim.order_ids[0]
    for key in sim.order_ids:
        outcome = str((sim.state_c.docs.get((key, key)) or {}).get("ProcessState"))
        if outcome != "Processed":
            raise RuntimeError(f"the measured order {key} ended {outcome}, not Processed")

    requests: Counter[str] = Counter()
    ru: Counter[str] = Counter()
    by_caller: Counter[str] = Counter()
    by_partition: Counter[str] = Counter()
    periodic_ru: Counter[str] = Counter()
    periodic_n: Counter[str] = Counter()
    # Blocks taken: the fast path's successful writes of the admission document.
    runs[BLOCK] = sum(
        1
        for op in ops
        if op.actor not in PERIODIC
        and op.kind in ("create", "replace")
        and not op.failed
        and _admission(op)
    )
    sizes = []
    for op in ops:
        charge = model.charge(op)
        actor = BLOCK if op.actor not in PERIODIC and _admission(op) else op.actor
        # The host's rule (bench/host_cost.py): queries and the shared
        # documents are periodic, whoever makes them; a claim the timer
        # Starter makes of an order (its replace, index entry and order read)
        # is that order's, as it is on the host.
        if actor == BLOCK or periodic(op):
            periodic_ru[actor] += charge
            periodic_n[actor] += 1
            continue
        key = f"{op.container} {op.kind}"
        requests[key] += 1
        ru[key] += charge
        by_caller[f"{op.actor} {op.container} {op.kind}"] += charge
        by_partition[_partition(op)] += charge
        if op.new is not None and oid in str(op.new.get("id")):  # the first order's writes
            sizes.append((op.container, op.kind, stored_bytes(op.new)))

    instances = list(sim.durable.instances.values())
    history = [e for inst in instances for e in inst.history]
    kinds = Counter(e["EventType"] for e in history)
    from devstack.host.durable import (
        EVENT_RAISED,
        ORCHESTRATOR_STARTED,
        TASK_SCHEDULED,
        TIMER_CREATED,
        TIMER_FIRED,
    )

    consumed = {"agent-requests", "agent-responses", *sim.functions, "orders-webshop"}
    sent = {q: len(queue.sent) for q, queue in sim.bus.queues.items() if queue.sent}
    delivered = {q: n for q, n in sent.items() if q in consumed}
    n = len(sim.order_ids)

    def each(counts: dict[str, float] | Counter[str], digits: int = 2) -> dict[str, float]:
        return {k: round(v / n, digits) for k, v in sorted(counts.items())}

    return OrderCost(
        scan=scan,
        orders=n,
        cosmos_requests=each(requests, 3),
        cosmos_ru=each(ru),
        cosmos_ru_by_caller=each(by_caller),
        cosmos_ru_by_partition={k: round(v, 2) for k, v in sorted(by_partition.items())},
        cosmos_docs={
            name: stored_bytes(d)
            for name, c in (("state", sim.state_c), ("orders", sim.orders_c))
            for d in [c.docs.get((oid, oid))]
            if d
        },
        periodic_ru_per_run={
            k: round(periodic_ru[k] / max(1, runs[k]), 2) for k in (*PERIODIC, BLOCK)
        },
        periodic_requests_per_run={
            k: round(periodic_n[k] / max(1, runs[k]), 2) for k in (*PERIODIC, BLOCK)
        },
        sb_sent=each(sent),
        sb_sent_bytes=sum(len(m.body) for q in sim.bus.queues.values() for m in q.sent) // n,
        sb_delivered=each(delivered),
        history_events=len(history) / n,
        history_bytes=round(sum(history_size(as_kept(e)) for e in history) / n),
        activities=kinds[TASK_SCHEDULED] / n,
        timers=kinds[TIMER_CREATED] / n,
        timers_fired=kinds[TIMER_FIRED] / n,
        events_raised=kinds[EVENT_RAISED] / n,
        episodes=kinds[ORCHESTRATOR_STARTED] / n,
        outcome=outcome,
        write_sizes=sizes,
    )


HOST_COUNTS = Path(__file__).with_name("host_order.json")


def with_host_counts(cost: OrderCost, host: dict[str, Any] | None = None) -> OrderCost:
    """`cost` with the local host's own per-order counts (Cosmos requests and RU
    by container and kind, Durable history bytes) in place of the simulation's:
    `host`, else the last `make bench` saved (bench/host_order.json) for the
    same Supervisor scan; `cost` as it is when there is none."""
    import dataclasses

    if host is None and HOST_COUNTS.exists():
        host = json.loads(HOST_COUNTS.read_text())
    if not host or host.get("scan") != cost.scan:
        return cost
    return dataclasses.replace(
        cost,
        cosmos_requests=dict(host["cosmos_requests"]),
        cosmos_ru=dict(host["cosmos_ru"]),
        history_bytes=float(host["history_bytes"]),
        counted_on="host",
    )


def as_kept(event: dict[str, Any]) -> dict[str, Any]:
    """A simulated history event as Azure and the local host keep it: the
    Durable client encodes an orchestration's input and an external event's
    data before posting them as JSON, so their history holds them encoded
    twice (orchestrators/contracts.py, read_reply); the simulation's durable
    world keeps them encoded once."""
    from devstack.host.durable import EVENT_RAISED, EXECUTION_STARTED

    value = event.get("Input")
    twice = event.get("EventType") in (EXECUTION_STARTED, EVENT_RAISED)
    if twice and isinstance(value, str) and not value.startswith('"'):
        return {**event, "Input": json.dumps(value)}
    return event


def history_size(event: dict[str, Any]) -> int:
    """Bytes of one Durable history event as counted on both sides: its
    compact JSON (the sizes the services bill are of the data, not of its
    formatting; the local host's hub stores orjson's compact text, the
    simulation's durable world keeps dicts)."""
    return len(json.dumps(event, separators=(",", ":")).encode())


TOLERANCE = 0.10  # a change may raise RU or history per order this much over the baseline


def regressions(
    cost: OrderCost, baseline: dict[str, Any], tolerance: float = TOLERANCE
) -> list[str]:
    """What rose more than `tolerance` over the committed baseline for the
    same Supervisor scan (bench/baseline.json "order")."""
    base = baseline["order"][cost.scan]
    measured = {
        "cosmos_ru_per_order": cost.cosmos_ru_per_order,
        "history_bytes_per_order": float(cost.history_bytes),
    }
    out = []
    for name, value in measured.items():
        allowed = float(base[name]) * (1 + tolerance)
        if value > allowed:
            out.append(
                f"{name} rose to {value:,.1f} (scan={cost.scan}): more than "
                f"{100 * tolerance:.0f} % over the baseline {float(base[name]):,.1f}"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.order_cost", description=__doc__)
    p.add_argument("--scan", choices=("index", "query"), default="index")
    p.add_argument("--json", action="store_true", help="print the whole measurement as JSON")
    args = p.parse_args(argv)
    cost = measure(args.scan)
    if args.json:
        print(json.dumps(cost.summary(), indent=1))
        return 0
    print(
        f"per happy-path order ({cost.orders} orders), Supervisor scan={cost.scan} "
        "(simulation, no faults)"
    )
    print(
        f"  cosmos requests {cost.cosmos_requests_per_order:.2f}, RU {cost.cosmos_ru_per_order:.1f}"
    )
    for key, value in cost.cosmos_ru.items():
        print(f"    {key:24} {cost.cosmos_requests[key]:6.2f} requests {value:7.2f} RU")
    for container, kind, size in cost.write_sizes:
        print(f"    write {container} {kind}: {size} bytes stored")
    print(f"  periodic RU per run: {cost.periodic_ru_per_run}")
    print(
        f"  service bus sent {sum(cost.sb_sent.values())} ({cost.sb_sent}), {cost.sb_sent_bytes} bytes"
    )
    print(
        f"  durable: {cost.history_events:.1f} history events, {cost.history_bytes:.0f} bytes; "
        f"{cost.activities} activities, {cost.timers} timers ({cost.timers_fired} fired), "
        f"{cost.events_raised} external events, {cost.episodes} episodes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
