"""The capacity model: for an order rate, the load on every component against
its documented limit, the first bottleneck, and $ per million orders at list
prices beside AWS Step Functions Standard and Temporal Cloud.

    python -m bench.capacity --rate 1000 --profile dev [--shards N] [--index-shards 16]
    python -m bench.capacity --rate 10000 --profile production     # shards: the fewest that fit
    python -m bench.capacity --size 400 [--profile production]      # one shard's parameters for 400/s
    make capacity RATE=10000 PROFILE=production [SHARDS=N]

Inputs, and where each comes from:

- per-order operation counts, measured now: one happy-path order runs through
  the product's code in the simulation (bench/order_cost.py) and its Cosmos
  requests, documents, Service Bus messages and Durable history are counted;
- host CPU seconds per order and p50 latency: the local-stack bench's figures
  (bench/baseline.json "bench", from `make bench-1000`);
- limits and prices: bench/limits.yaml, each with its source and date; a
  profile there says which limits a deployment meets, from infra/main.bicep's
  parameters as its parameters file sets them (`dev`: main.parameters.json,
  `production`: main.production.parameters.json).

Shards: a shard is one deployment of infra/main.bicep (its own function app,
task hub and scheduler or storage account, Cosmos account, Service Bus
namespace), orders routed to it by a hash of their OrderID (docs/capacity.md,
"Shards"). Every per-deployment limit is multiplied by the shard count and
every periodic run happens once per shard; the subscription's regional Flex
memory quota is shared by all of them.

Rules that turn counts into loads (approximations, stated as such):

- Cosmos RU: bench/cosmos_ru.py. The Starter's and the Supervisor's periodic
  runs add their measured RU per run at the Bicep's intervals.
- Service Bus: every message is sent once and received once by our functions
  or the client (1 credit each on Standard); billing counts send, receive and
  complete (3 operations a message).
- Durable on Azure Storage, transactions per order: 2 per message to the
  orchestrator (enqueue, delete), 4 per episode (dequeue, history read, history
  write, instance row), 3 per activity (work-item enqueue, dequeue, delete),
  1 for the instance row of the start. Our reading of the Durable Task
  Framework's Azure Storage provider (history and instance tables, control
  and work-item queues: learn.microsoft.com/azure/azure-functions/durable/
  durable-functions-azure-storage-provider), not a published table.
- Durable Task Scheduler actions (its SKU page's rule): 1 per start, 2 per
  activity, 1 per timer that fires, 1 per external event.
- Functions: instances busy = rate x host CPU s per order (an instance taken
  as one busy core); executions = deliveries + activities + episodes.
- Step Functions Standard with callbacks: one transition per task of the
  saga (each step's request and reply: a Task that waits for its reply's
  token is one transition; the finishing write) plus the end; Express: one
  execution per message the saga handles. Temporal: 1 per workflow start,
  task, timer and signal, plus the Business plan's fee.
- Prices (issue 44): every service of the bill, autoscale and every fixed
  charge per hour at the hour's peak (the rate given; the profile's
  hourly_peak_to_average), Flex by instance memory for the time executions
  run, waits included (the profile's active_cpu_share), Cosmos storage for
  the documents' retention, Application Insights traces (sampled) and the
  app's log records. A figure limits.yaml marks `estimate: true` marks its
  line "est.".
- Periodic work (bench/periodic_cost.py): the Starter's, the outbox's and the
  Supervisor's queries per tick and per hour at 10,000, 100,000 and
  1,000,000 records a shard.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import periodic_cost as pc  # noqa: E402
from bench.order_cost import OrderCost, load_limits, measure, with_host_counts  # noqa: E402
from domain.admission import GRACE  # noqa: E402

BASELINE = Path(__file__).with_name("baseline.json")
MAIN_BICEP = ROOT / "infra" / "main.bicep"
SECONDS_PER_MONTH = 730 * 3600  # the 730-hour month Azure's pricing pages use
ALERT = 0.8  # share of a limit past which a component is flagged
MAX_SHARDS = 10_000
BACKLOGS = (10_000, 100_000, 1_000_000)  # records in one shard's state container
COUNT_INTERVAL_S = 30.0  # the Starter's count_interval once the host passes it
STATUS_SCAN_INTERVAL_S = 10.0  # a third of the Starter's 30 s status grace


class ModelError(ValueError):
    """Bad input to the model (an unknown profile, a missing figure)."""


@cache
def bicep_defaults(path: Path = MAIN_BICEP) -> dict[str, Any]:
    from pycep import BicepParser

    doc = BicepParser().parse(file_path=path)
    return {name: p.get("default") for name, p in doc["parameters"].items()}


def parameter_values(parameters_file: str | None = None) -> dict[str, Any]:
    """main.bicep's parameters as a deployment with this parameters file gets
    them: the file's literal values (azd's `${VAR}` placeholders are left to
    the defaults) over the defaults; a default naming another parameter
    (`ordersCosmosAutoscaleMaxThroughput = cosmosAutoscaleMaxThroughput`)
    takes that parameter's value."""
    declared = bicep_defaults()
    values = dict(declared)
    if parameters_file:
        given = json.loads((ROOT / parameters_file).read_text())["parameters"]
        for name, spec in given.items():
            if name not in declared:
                raise ModelError(
                    f"{parameters_file}: infra/main.bicep declares no parameter {name!r}"
                )
            value = spec.get("value")
            if not (isinstance(value, str) and "${" in value):
                values[name] = value
    for name, value in list(values.items()):
        if isinstance(value, str) and value in declared and value != name:
            values[name] = values[value]
    return values


def _resolve(value: Any, params: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        return {k: _resolve(v, params) for k, v in value.items()}
    if isinstance(value, str) and value.startswith("bicep:"):
        name = value.split(":", 1)[1]
        if name not in params or params[name] is None:
            raise ModelError(f"infra/main.bicep has no value for parameter {name!r}")
        return params[name]
    return value


def profile(limits: dict[str, Any], name: str) -> dict[str, Any]:
    profiles = limits.get("profiles") or {}
    if name not in profiles:
        raise ModelError(f"unknown profile {name!r}; bench/limits.yaml has {sorted(profiles)}")
    spec = profiles[name]
    return _resolve(spec, parameter_values(spec.get("parameters")))


def _round_up(value: float, step: int) -> int:
    return math.ceil(value / step - 1e-9) * step


def figure(limits: dict[str, Any], path: str) -> float | None:
    node: Any = limits
    for part in path.split("."):
        node = node[part]
    value = node["value"]
    return None if value is None else value


def estimated(limits: dict[str, Any], path: str) -> bool:
    node: Any = limits
    for part in path.split("."):
        node = node[part]
    return bool(node.get("estimate"))


def tiered_usd(tiers: list[list[Any]], millions: float) -> float:
    """USD for `millions` units priced by [[up to millions, USD per million],
    ...] tiers counted from zero (None: no upper bound)."""
    total, below = 0.0, 0.0
    for upto, price in tiers:
        top = math.inf if upto is None else upto
        total += max(0.0, min(millions, top) - below) * price
        below = top
    return total


def load_baseline(path: Path = BASELINE) -> dict[str, Any]:
    return json.loads(path.read_text())


@dataclass
class Line:
    component: str
    load: float
    limit: float | None
    unit: str
    note: str = ""
    shards: bool = True  # False: one limit for every shard (a regional quota)

    @property
    def share(self) -> float | None:
        return None if not self.limit else self.load / self.limit

    @property
    def over(self) -> bool:
        # A hair of tolerance: a shard sized to exactly 80 % is not over it.
        return self.share is not None and self.share > ALERT + 1e-9

    def row(self) -> str:
        share = "n/a" if self.share is None else f"{100 * self.share:6.1f}%"
        limit = "n/a" if self.limit is None else f"{self.limit:,.0f}"
        flag = " !" if self.over else ""
        return (
            f"  {self.component:38} {self.load:>14,.1f} / {limit:>12} {self.unit:12} {share:>7}{flag}"
            + (f"  ({self.note})" if self.note else "")
        )


@dataclass
class Cost:
    line: str
    usd_per_million: float | None
    note: str = ""
    estimate: bool = False  # a figure limits.yaml marks `estimate: true`


def derived(cost: OrderCost) -> dict[str, float]:
    """Per-order counts derived from the measured ones by the rules above."""
    messages = sum(cost.sb_sent.values())
    to_orchestrator = 1 + cost.activities + cost.events_raised + cost.timers
    # The saga as a peer runs it: one task per step (its request, then its
    # reply: one per reply raised here) and the finishing write. Not this
    # app's activities: its Starter sends the first request (ADR 021l).
    saga_tasks = cost.events_raised + 1
    return {
        "sb_messages": messages,
        "sb_credits": 2 * messages,
        "sb_operations": 3 * messages,
        "executions": sum(cost.sb_delivered.values()) + cost.activities + cost.episodes,
        "storage_transactions": 2 * to_orchestrator + 4 * cost.episodes + 3 * cost.activities + 1,
        "dts_actions": 1 + 2 * cost.activities + cost.timers_fired + cost.events_raised,
        # Standard with callbacks: each activity a Task state that waits for
        # its reply's token (.waitForTaskToken: one transition, the reply adds
        # none), plus the end state.
        "sfn_transitions": saga_tasks + 1,
        # Express where it applies: it has no task-token wait, so each
        # message the saga handles (the start and every reply) is one short
        # execution that records the state elsewhere.
        "sfn_express_requests": 1 + cost.events_raised,
        "temporal_actions": 1 + saga_tasks + cost.timers + cost.events_raised,
    }


def temporal_usd_per_million_actions(limits: dict[str, Any], actions_per_month: float) -> float:
    """The average price per million actions over the month's tiers; past the
    last published tier, the last tier's price."""
    tiers = figure(limits, "comparison.temporal_cloud_per_million_actions")
    assert isinstance(tiers, list)
    millions = actions_per_month / 1e6
    total, below = 0.0, 0.0
    for upto, price in tiers:
        part = max(0.0, min(millions, upto) - below)
        total += part * price
        below = upto
    if millions > below:
        total += (millions - below) * tiers[-1][1]
    return total / millions if millions else float(tiers[0][1])


class Model:
    def __init__(
        self,
        rate: float,
        profile_name: str,
        shards: int | None = None,
        cost: OrderCost | None = None,
        limits: dict[str, Any] | None = None,
        baseline: dict[str, Any] | None = None,
        index_shards: int | None = None,
    ) -> None:
        """`shards`: deployments (see docs/capacity.md, Shards); `index_shards`: the
        recovery index's key shards (RECOVERY_INDEX_SHARDS; None: the Bicep's
        default, infra/main.bicep recoveryIndexShards)."""
        if not rate > 0 or not math.isfinite(rate):
            raise ModelError(f"--rate must be a positive number of orders per second, not {rate}")
        if shards is not None and not 1 <= shards <= MAX_SHARDS:
            raise ModelError(f"--shards must be 1 to {MAX_SHARDS}, not {shards}")
        self.rate = rate
        if index_shards is None:
            index_shards = int(bicep_defaults().get("recoveryIndexShards") or 1)
        if not 1 <= index_shards <= 999:
            raise ModelError(f"--index-shards must be 1 to 999, not {index_shards}")
        self.index_shards = index_shards
        self.limits = limits or load_limits()
        self.profile_name = profile_name
        self.p = profile(self.limits, profile_name)
        scan = self.p["app"]["supervisor_scan"]
        self.cost = cost or with_host_counts(measure(scan))
        self.baseline = baseline or load_baseline()
        self.d = derived(self.cost)
        wanted = shards if shards is not None else self.p.get("shards", 1)
        self.auto_shards = wanted == "auto"
        self.shards = 1
        if self.auto_shards:
            self.shards = self.fewest_shards()
        elif isinstance(wanted, int) and wanted >= 1:
            self.shards = wanted
        else:
            raise ModelError(f"profile {profile_name}: shards must be a number or 'auto'")

    def fewest_shards(self) -> int:
        """The fewest shards with every component that shards at or under 80 %
        (a regional quota stays whatever the count: it is reported, not solved)."""
        saved = self.shards
        try:
            for n in range(1, MAX_SHARDS + 1):
                self.shards = n
                if not any(line.over for line in self.lines() if line.shards):
                    return n
        finally:
            self.shards = saved
        raise ModelError(f"no shard count up to {MAX_SHARDS} takes {self.rate:,.0f} orders/s")

    # --- loads
    def _periodic_ru_per_s(self) -> dict[str, float]:
        """RU/s of one shard's Starter and Supervisor: the larger of the runs
        measured in the simulation (an almost empty store) and the model's
        idle ticks at the largest backlog priced (BACKLOGS, as deployed)."""
        app = self.p["app"]
        modelled = self.periodic(BACKLOGS[-1], None)
        per_hour = {
            actor: pc.per_hour([q for q in modelled if (q.name.split()[0] == "supervisor") == sup])
            for actor, sup in (("starter", False), ("supervisor", True))
        }
        return {
            "starter": max(
                self.cost.periodic_ru_per_run["starter"] / app["starter_interval_s"],
                per_hour["starter"] / 3600,
            ),
            "supervisor": max(
                self.cost.periodic_ru_per_run["supervisor"] / app["supervisor_interval_s"],
                per_hour["supervisor"] / 3600,
            ),
        }

    def cosmos_ru_per_s(self) -> dict[str, float]:
        """RU/s by container: the orders' own plus the periodic runs (which
        read the state container and, with the index scan, the index)."""
        out: dict[str, float] = {}
        for key, ru in self.cost.cosmos_ru.items():
            container = key.split()[0]
            out[container] = out.get(container, 0.0) + self.rate * ru
        for ru in self._periodic_ru_per_s().values():
            out["state"] = out.get("state", 0.0) + ru * self.shards  # each shard runs its own
        return out

    def lines(self) -> list[Line]:
        p, lim, d, r = self.p, self.limits, self.d, self.rate
        out: list[Line] = []
        n = self.shards
        ru = self.cosmos_ru_per_s()
        mode = str(p["cosmos"]["mode"]).lower()
        if mode == "serverless":
            per_container = figure(lim, "cosmos.serverless_container_ru_per_s")
            for container in sorted(ru):
                out.append(
                    Line(
                        f"cosmos {container} container",
                        ru[container],
                        None if per_container is None else per_container * n,
                        "RU/s",
                    )
                )
        else:
            # Provisioned: each database has its own autoscale maximum (the
            # state database holds orderState and recoveryIndex).
            state = ru.get("state", 0.0) + ru.get("index", 0.0)
            for label, load, limit in (
                ("cosmos state database (autoscale max)", state, p["cosmos"]["state_max_ru_per_s"]),
                (
                    "cosmos orders database (autoscale max)",
                    ru.get("orders", 0.0),
                    p["cosmos"]["orders_max_ru_per_s"],
                ),
            ):
                out.append(Line(label, load, limit * n, "RU/s"))
        # The recovery index's partition key is the deadline's minute plus a
        # hash shard of the OrderID (ADR 019b): a minute's index writes of one
        # deployment spread over RECOVERY_INDEX_SHARDS logical partitions, each
        # taking 1/N (measured: bench/index_partitions.py,
        # tests/sim/test_hot_partition.py); each deployment has its own index.
        index_ru = sum(v for k, v in self.cost.cosmos_ru.items() if k.startswith("index "))
        if index_ru:
            partition_limit = figure(lim, "cosmos.logical_partition_ru_per_s")
            if mode == "serverless":
                partition_limit = min(
                    partition_limit or math.inf,
                    figure(lim, "cosmos.serverless_container_ru_per_s") or math.inf,
                )
            out.append(
                Line(
                    "cosmos index hot partition (1 minute, 1 shard)",
                    r * index_ru / (n * self.index_shards),
                    partition_limit,
                    "RU/s",
                    f"key sharded {self.index_shards} way(s): RECOVERY_INDEX_SHARDS, "
                    f"in each of {n} deployment(s)",
                )
            )
        tier = str(p["servicebus"]["tier"]).lower()
        if tier == "standard":
            credits = figure(lim, "servicebus.standard_credits_per_s")
            out.append(
                Line(
                    f"service bus ({n} x Standard credits)",
                    r * d["sb_credits"],
                    None if credits is None else credits * n,
                    "credits/s",
                )
            )
        else:
            per_mu = figure(lim, "servicebus.premium_ops_per_s_per_mu")
            mus = p["servicebus"].get("messaging_units", 1)
            out.append(
                Line(
                    f"service bus ({n} x Premium {mus} MU)",
                    r * d["sb_operations"],
                    None if per_mu is None else per_mu * mus * n,
                    "ops/s",
                    "no published rate per MU: a load test must size it" if per_mu is None else "",
                )
            )
        backend = str(p["durable"]["backend"])
        if backend == "azureStorage":
            per_account = figure(lim, "storage.account_requests_per_s")
            out.append(
                Line(
                    f"durable storage ({self.shards} account(s))",
                    r * d["storage_transactions"],
                    None if per_account is None else per_account * self.shards,
                    "requests/s",
                )
            )
        elif backend == "durableTaskScheduler":
            if str(p["durable"].get("sku", "dedicated")).lower() == "dedicated":
                per_cu = figure(lim, "durable_task_scheduler.dedicated_actions_per_s_per_cu")
                cus = min(
                    p["durable"].get("cus_per_shard", 1),
                    figure(lim, "durable_task_scheduler.dedicated_max_cus") or 1,
                )
                limit = None if per_cu is None else per_cu * cus * self.shards
                label = f"durable task scheduler ({self.shards} x {cus:g} CU)"
            else:
                limit = figure(lim, "durable_task_scheduler.consumption_actions_per_s")
                limit = None if limit is None else limit * self.shards
                label = f"durable task scheduler ({self.shards} x Consumption)"
            out.append(Line(label, r * d["dts_actions"], limit, "actions/s"))
            storage = self._scheduler_storage_line()
            if storage is not None:
                out.append(storage)
        else:
            raise ModelError(f"unknown durable backend {backend!r}")
        cpu = float(self.baseline["bench"]["host_cpu_s_per_order"]["value"])
        max_instances = min(
            p["functions"]["max_instances"], figure(lim, "functions.flex_max_instances") or math.inf
        )
        out.append(
            Line(f"functions instances ({n} Flex app(s))", r * cpu, max_instances * n, "instances")
        )
        raised = self.p.get("flex_memory_quota_mb")
        out.append(
            Line(
                "functions memory (regional Flex quota)",
                r * cpu * p["functions"]["instance_memory_mb"],
                raised or figure(lim, "functions.flex_regional_memory_quota_mb"),
                "MB",
                "one quota for every shard in the region"
                + ("; raised by a quota request" if raised else ""),
                shards=False,
            )
        )
        out.append(
            Line(
                "MAX_PROCESSING (admission slots held)",
                r * self.slot_seconds(),
                p["app"]["max_processing"] * n,
                "slots",
                f"an order holds its slot {self.slot_seconds():.1f} s: in flight, then its "
                f"lease until a count begun {GRACE.total_seconds():.0f} s after it "
                "(domain/admission.py)",
            )
        )
        return out

    def slot_seconds(self) -> float:
        """How long an order holds an admission slot, on average: its time in
        flight (the bench's p50), then its lease, which counts until the first
        COUNT begun GRACE after it was taken: GRACE and half the time between
        counts (the Starter counts every starterCountIntervalSeconds, or every
        run when that is 0). Measured on the local stack with MAX_PROCESSING
        500 and counts every 5 s: 21-23 orders/s whatever the hosts, 500 /
        22.5 s (docs/performance.md)."""
        app = self.p["app"]
        every = max(float(app.get("starter_count_interval_s") or 0), app["starter_interval_s"])
        latency = float(self.baseline["bench"]["p50_latency_s"]["value"])
        return latency + GRACE.total_seconds() + every / 2

    def _scheduler_storage_line(self) -> Line | None:
        """History the scheduler holds: the orders in flight, plus the completed
        ones its retention policy keeps (without a policy it only grows)."""
        durable = self.p["durable"]
        per_cu = figure(self.limits, "durable_task_scheduler.dedicated_storage_gb_per_cu")
        if str(durable.get("sku", "")).lower() != "dedicated" or per_cu is None:
            return None
        limit = per_cu * durable.get("cus_per_shard", 1) * self.shards
        days = durable.get("retention_days_completed", -1)
        if days is None or days < 0:
            return Line(
                "durable task scheduler storage", math.inf, limit, "GB", "no retention policy"
            )
        latency = float(self.baseline["bench"]["p50_latency_s"]["value"])
        per_hour = self.rate / self.shards * 3600 * self.cost.history_bytes / 1e9
        return Line(
            "durable task scheduler storage",
            self.rate * (latency + days * 86400) * self.cost.history_bytes / 1e9,
            limit,
            "GB",
            f"completed kept {days} day(s); each hour the purge lags adds {per_hour:,.0f} GB a shard",
        )

    def bottleneck(self) -> Line | None:
        known = [line for line in self.lines() if line.share is not None]
        return max(known, key=lambda line: line.share or 0.0) if known else None

    def max_rate(self) -> float | None:
        """The rate at which the first component reaches its limit (loads are
        linear in the rate, apart from the small periodic RU)."""
        b = self.bottleneck()
        return None if b is None or not b.share else self.rate / b.share

    # --- sizing
    def sized_parameters(self, rate_per_shard: float) -> dict[str, int]:
        """main.bicep parameters one shard needs to take `rate_per_shard`
        orders/s with each sized component at or under 80 % of its limit:
        the Cosmos databases' autoscale maxima (whole thousands), the
        scheduler's capacity units, the Flex app's instance cap (tens, 40 at
        least) and MAX_PROCESSING (hundreds). Service Bus Premium's messaging
        units are not sized: no rate per unit is published."""
        if not rate_per_shard > 0 or not math.isfinite(rate_per_shard):
            raise ModelError(
                f"--size must be a positive number of orders per second, not {rate_per_shard}"
            )
        one: dict[str, float] = {}
        for key, ru in self.cost.cosmos_ru.items():
            container = key.split()[0]
            one[container] = one.get(container, 0.0) + rate_per_shard * ru
        periodic = sum(self._periodic_ru_per_s().values())
        state = one.get("state", 0.0) + one.get("index", 0.0) + periodic
        per_cu = figure(self.limits, "durable_task_scheduler.dedicated_actions_per_s_per_cu")
        max_cus = figure(self.limits, "durable_task_scheduler.dedicated_max_cus") or 1
        if per_cu is None:
            raise ModelError("bench/limits.yaml has no actions per second per capacity unit")
        cus = _round_up(rate_per_shard * self.d["dts_actions"] / ALERT / per_cu, 1)
        cpu = float(self.baseline["bench"]["host_cpu_s_per_order"]["value"])
        out = {
            "cosmosAutoscaleMaxThroughput": max(1000, _round_up(state / ALERT, 1000)),
            "ordersCosmosAutoscaleMaxThroughput": max(
                1000, _round_up(one.get("orders", 0.0) / ALERT, 1000)
            ),
            "durableTaskSchedulerCapacity": cus,
            "maximumInstanceCount": max(40, _round_up(rate_per_shard * cpu / ALERT, 10)),
            "maxProcessing": _round_up(rate_per_shard * self.slot_seconds() / ALERT, 100),
        }
        if cus > max_cus:
            raise ModelError(
                f"{rate_per_shard:,.0f} orders/s need {cus} scheduler capacity units and a "
                f"scheduler takes at most {max_cus:g}: size a shard for a lower rate"
            )
        database_max = figure(self.limits, "cosmos.provisioned_database_max_ru_per_s") or math.inf
        for name in ("cosmosAutoscaleMaxThroughput", "ordersCosmosAutoscaleMaxThroughput"):
            if out[name] > database_max:
                raise ModelError(
                    f"{name}={out[name]:,} is past a database's default maximum "
                    f"({database_max:,.0f} RU/s): size a shard for a lower rate"
                )
        return out

    # --- prices
    @property
    def peak_to_average(self) -> float:
        """The hour's highest rate over its average (the profile's
        `hourly_peak_to_average`; 1: a steady rate). The model's rate is the
        peak the plan must carry; the orders billed in an hour are the average's."""
        return float(self.p.get("hourly_peak_to_average", 1.0))

    def _per_million_from_hourly(self, usd_per_hour: float) -> float:
        """A charge per hour (all shards), per million orders at the average rate."""
        return usd_per_hour / (self.rate / self.peak_to_average * 3600) * 1e6

    def costs(self) -> list[Cost]:
        return [
            *self._cosmos_costs(),
            self._servicebus_cost(),
            self._durable_cost(),
            *self._functions_costs(),
            *self._monitoring_costs(),
        ]

    def _cosmos_costs(self) -> list[Cost]:
        p, lim, r = self.p, self.limits, self.rate
        out: list[Cost] = []
        ru = self.cosmos_ru_per_s()
        mode = str(p["cosmos"]["mode"]).lower()
        if mode == "serverless":
            price = figure(lim, "cosmos.serverless_price_per_million_ru")
            per_order = sum(ru.values()) / r
            out.append(Cost("cosmos RU (serverless)", None if price is None else per_order * price))
        else:
            price = figure(lim, "cosmos.autoscale_price_per_100_ru_s_hour")
            # Billed per hour at the hour's highest RU/s (the load at this
            # rate, the peak), never under 10 % of the maximum nor over it.
            billed = 0.0
            for load, ceiling in (
                (ru.get("state", 0.0) + ru.get("index", 0.0), p["cosmos"]["state_max_ru_per_s"]),
                (ru.get("orders", 0.0), p["cosmos"]["orders_max_ru_per_s"]),
            ):
                top = ceiling * self.shards
                billed += min(top, max(load, 0.1 * top))
            out.append(
                Cost(
                    "cosmos RU/s (autoscale, hourly peak)",
                    None if price is None else self._per_million_from_hourly(billed / 100 * price),
                    f"the hour's peak RU/s ({billed:,.0f}) over orders at peak / "
                    f"{self.peak_to_average:g}",
                )
            )
        out.append(self._cosmos_storage_cost())
        return out

    def retention_days(self) -> dict[str, float]:
        """Days a container keeps an order's document: the state record 90
        days after it finished (its per-item TTL); the order its container's
        TTL (ordersTtlSeconds), or a year when it is kept forever."""
        ttl = float(self.p.get("orders_ttl_seconds") or 0)
        return {"state": 90.0, "orders": ttl / 86400 if ttl > 0 else 365.0}

    def _cosmos_storage_cost(self) -> Cost:
        price = figure(self.limits, "cosmos.storage_price_per_gb_month")
        overhead = figure(self.limits, "cosmos.index_overhead") or 0.0
        days = self.retention_days()
        gb_months = sum(
            size * (1 + overhead) / 1e9 * days.get(container, 90.0) / (730 / 24)
            for container, size in self.cost.cosmos_docs.items()
        )
        kept = ", ".join(f"{c} {d:g} d" for c, d in days.items())
        return Cost(
            "cosmos storage",
            None if price is None else gb_months * price * 1e6,
            f"the order's documents + {overhead:.0%} index, kept {kept}",
        )

    def _servicebus_cost(self) -> Cost:
        p, lim, d = self.p, self.limits, self.d
        tier = str(p["servicebus"]["tier"]).lower()
        if tier == "standard":
            base = figure(lim, "servicebus.standard_base_per_hour")
            tiers = figure(lim, "servicebus.standard_price_per_million_ops")
            included = figure(lim, "servicebus.standard_included_ops_per_month") or 0.0
            if base is None or tiers is None:
                return Cost("service bus Standard", None)
            ops_month = d["sb_operations"] * self.rate / self.peak_to_average * SECONDS_PER_MONTH
            per_shard = ops_month / self.shards
            # The tiers' bounds count every operation; the first `included` are free.
            usd_month = self.shards * (
                base * 730 + tiered_usd([[included / 1e6, 0.0], *tiers], per_shard / 1e6)
            )
            return Cost(
                f"service bus Standard ({d['sb_operations']:.0f} operations)",
                self._per_million_from_hourly(usd_month / 730),
                f"base + tiered operations, {self.shards} namespace(s)",
            )
        price = figure(lim, "servicebus.premium_price_per_mu_hour")
        mus = p["servicebus"].get("messaging_units", 1) * self.shards
        return Cost(
            f"service bus Premium ({mus} MU)",
            None if price is None else self._per_million_from_hourly(mus * price),
            "a fixed price per MU-hour: the share per order falls as the rate rises",
        )

    def _durable_cost(self) -> Cost:
        p, lim, d = self.p, self.limits, self.d
        if str(p["durable"]["backend"]) == "azureStorage":
            price = figure(lim, "storage.price_per_10k_transactions")
            tx = d["storage_transactions"]
            return Cost(
                f"durable storage ({tx:.0f} transactions)",
                None if price is None else tx / 1e4 * price * 1e6,
                "every transaction at the queue rate (an upper bound)",
                estimate=estimated(lim, "storage.price_per_10k_transactions"),
            )
        path = "durable_task_scheduler.dedicated_price_per_cu_month"
        price = figure(lim, path)
        cus = p["durable"].get("cus_per_shard", 1) * self.shards
        return Cost(
            f"durable task scheduler ({cus} CU)",
            None if price is None else self._per_million_from_hourly(cus * price / 730),
            "a fixed price per CU-month",
            estimate=estimated(lim, path),
        )

    def _functions_costs(self) -> list[Cost]:
        p, lim, d = self.p, self.limits, self.d
        gb = p["functions"]["instance_memory_mb"] / 1024
        cpu = float(self.baseline["bench"]["host_cpu_s_per_order"]["value"])
        share = float(p.get("active_cpu_share", 1.0))
        gbs = figure(lim, "functions.flex_on_demand_price_per_gb_s")
        execs = figure(lim, "functions.flex_price_per_million_executions")
        baseline = figure(lim, "functions.flex_always_ready_baseline_per_gb_s")
        ready = int(p["functions"].get("always_ready", 0) or 0) * self.shards
        billed_s = cpu / share
        return [
            Cost(
                f"functions memory-time ({billed_s * gb:.3f} GB-s)",
                None if gbs is None else billed_s * gb * gbs * 1e6,
                f"{gb:g} GB for the time executions run, waits included: "
                f"{cpu:.3f} CPU s / {share:.0%} busy",
                estimate="active_cpu_share" in p,
            ),
            Cost(
                f"functions ({d['executions']:.0f} executions)",
                None if execs is None else d["executions"] * execs,
            ),
            Cost(
                f"functions always ready ({ready} instance(s))",
                None
                if baseline is None
                else self._per_million_from_hourly(ready * gb * baseline * 3600),
                "baseline memory of the always-ready instances, all the time",
                estimate=estimated(lim, "functions.flex_always_ready_baseline_per_gb_s"),
            ),
        ]

    def _monitoring_costs(self) -> list[Cost]:
        """Application Insights: a request item per execution and a dependency
        item per Cosmos request and message sent, sampled; and the app's own
        log records, which are not sampled."""
        lim, d = self.limits, self.d
        price = figure(lim, "monitoring.log_ingestion_price_per_gb")
        size = figure(lim, "monitoring.telemetry_bytes_per_item")
        sampling = float(self.p.get("trace_sampling_ratio") or 1.0)
        items = (
            d["executions"] + self.cost.cosmos_requests_per_order + d["sb_messages"]
        ) * sampling
        logs = float(self.p.get("app_log_records_per_order") or 0.0)
        usd = None if price is None or size is None else size / 1e9 * price * 1e6
        return [
            Cost(
                f"application insights traces ({items:.1f} items)",
                None if usd is None else items * usd,
                f"trace sampling {sampling:g}",
                estimate=estimated(lim, "monitoring.telemetry_bytes_per_item"),
            ),
            Cost(
                f"application insights app logs ({logs:g} records)",
                None if usd is None else logs * usd,
                "the app's log records an order writes at the profile's APP_LOG_LEVEL "
                "(measured on the local host: make bench --log-level)",
                estimate=True,
            ),
        ]

    def usd_per_million_orders(self) -> tuple[float, list[str]]:
        """The priced lines' sum, and the lines no price was found for."""
        costs = self.costs()
        return (
            sum(c.usd_per_million for c in costs if c.usd_per_million is not None),
            [c.line for c in costs if c.usd_per_million is None],
        )

    def estimated_usd_per_million(self) -> float:
        """The part of the total that rests on an estimated figure."""
        return sum(c.usd_per_million or 0.0 for c in self.costs() if c.estimate)

    def comparison(self) -> dict[str, float]:
        """The same saga's $ per million orders on its peers (docs/capacity.md,
        "Peers", explains every count)."""
        lim, d = self.limits, self.d
        sfn = figure(lim, "comparison.step_functions_standard_per_1000_transitions")
        express = figure(lim, "comparison.step_functions_express_per_million_requests") or 0.0
        express_gb_s = figure(lim, "comparison.step_functions_express_per_gb_s") or 0.0
        actions_month = d["temporal_actions"] * self.rate / self.peak_to_average * SECONDS_PER_MONTH
        temporal = d["temporal_actions"] * temporal_usd_per_million_actions(lim, actions_month)
        plan = figure(lim, "comparison.temporal_cloud_plan_fee")
        assert isinstance(plan, dict)
        orders_month = self.rate / self.peak_to_average * SECONDS_PER_MONTH
        fee = max(
            plan["minimum_usd_per_month"] / orders_month * 1e6, plan["share_of_usage"] * temporal
        )
        storage = figure(lim, "storage.price_per_10k_transactions") or 0.0
        return {
            "step_functions_standard": d["sfn_transitions"] * (sfn or 0) * 1000,
            # 100 ms at the 64 MB minimum per execution.
            "step_functions_express": d["sfn_express_requests"]
            * (express + 0.1 * 0.0625 * express_gb_s * 1e6),
            "temporal_cloud": temporal + fee,
            "durable_azure_storage": d["storage_transactions"] / 1e4 * storage * 1e6,
        }

    # --- periodic work
    def periodic(self, records: int, count_interval_s: float | None) -> list[pc.Query]:
        """One shard's periodic queries at `records` records (bench/periodic_cost.py);
        `count_interval_s` None: the Starter counts on every tick (as deployed)."""
        app, p = self.p["app"], self.p
        rules = pc.Rules.of(self.limits)
        backlog = pc.Backlog.of(
            records,
            self.cost.cosmos_docs.get("state", 2048),
            int(bicep_defaults().get("pendingBacklogLimit") or 5000),
            int(app["max_processing"]),
        )
        schedule = pc.Schedule(
            starter_interval_s=app["starter_interval_s"],
            supervisor_interval_s=app["supervisor_interval_s"],
            count_interval_s=count_interval_s or app["starter_interval_s"],
            outbox_interval_s=STATUS_SCAN_INTERVAL_S,
            batch=int(bicep_defaults().get("starterBatchSize") or 50),
        )
        provisioned = str(p["cosmos"]["mode"]).lower() != "serverless"
        state_max = p["cosmos"]["state_max_ru_per_s"] if provisioned else 5000
        parts = rules.partitions(backlog, state_max)
        index_parts = rules.partitions(pc.Backlog(0, 0, 0, 0), state_max)
        return [
            *pc.starter_queries(rules, backlog, schedule, parts),
            *pc.supervisor_queries(rules, schedule, parts, app["supervisor_scan"], index_parts),
        ]

    def _usd_per_hour_of(self, ru_per_hour: float) -> float:
        """What a steady load of `ru_per_hour` costs an hour: RU consumed
        (serverless), or autoscale RU/s-hours (provisioned, above its floor)."""
        if str(self.p["cosmos"]["mode"]).lower() == "serverless":
            return (
                ru_per_hour
                * (figure(self.limits, "cosmos.serverless_price_per_million_ru") or 0)
                / 1e6
            )
        price = figure(self.limits, "cosmos.autoscale_price_per_100_ru_s_hour") or 0.0
        return ru_per_hour / 3600 / 100 * price

    def periodic_report(self) -> list[str]:
        out = [
            "periodic work per shard (bench/periodic_cost.py; idle ticks, RU by Azure's rules, "
            "$ at this profile's Cosmos price):"
        ]
        for records in BACKLOGS:
            for label, interval in (("counts every tick", None), ("counts every 30 s", 30.0)):
                queries = self.periodic(records, interval)
                hour = pc.per_hour(queries)
                starter = [q for q in queries if not q.name.startswith("supervisor")]
                tick = sum(
                    q.ru for q in starter if q.every_s == self.p["app"]["starter_interval_s"]
                )
                grows = ", ".join(
                    f"{q.name} {q.ru:,.1f} RU" for q in queries if q.grows and q.ru > 1
                )
                out.append(
                    f"  records={records:>9,} {label:17} starter tick {tick:7.1f} RU, "
                    f"all periodic {hour:>9,.0f} RU/hour = {hour / 3600:5.1f} RU/s "
                    f"(${self._usd_per_hour_of(hour):,.4f}/hour)"
                    + (f"; grows with the backlog: {grows}" if grows else "")
                )
        return out

    # --- report
    def report(self) -> str:
        c, d = self.cost, self.d
        how = (
            " (the fewest with every component that shards at or under 80 %)"
            if self.auto_shards
            else ""
        )
        out = [
            f"capacity: rate={self.rate:,.0f} orders/s profile={self.profile_name} "
            f"shards={self.shards}{how} scan={c.scan} index_shards={self.index_shards}",
            f"  {self.p.get('description', '').strip()}",
            "per order (Cosmos and history counted on the local host by make bench, "
            "bench/host_order.json; the rest in the simulation, bench/order_cost.py):"
            if c.counted_on == "host"
            else "per order (measured in the simulation: happy-path orders, bench/order_cost.py):",
            f"  cosmos {c.cosmos_requests_per_order:.2f} requests, {c.cosmos_ru_per_order:.1f} RU "
            f"(+ periodic: starter {c.periodic_ru_per_run['starter']:.1f} RU/run, "
            f"supervisor {c.periodic_ru_per_run['supervisor']:.1f} RU/run)",
            f"  service bus {d['sb_messages']:.0f} messages; durable {c.history_events:.0f} history "
            f"events, {c.history_bytes:,.0f} bytes; {c.activities:.0f} activities, "
            f"{c.episodes:.0f} episodes",
            f"  derived: {d['storage_transactions']:.0f} storage transactions, {d['dts_actions']:.0f} "
            f"scheduler actions, {d['executions']:.0f} executions, {d['sfn_transitions']:.0f} Step "
            f"Functions transitions, {d['temporal_actions']:.0f} Temporal actions",
            "load at this rate (load / limit, share; ! past 80 %):",
        ]
        out += [line.row() for line in self.lines()]
        b = self.bottleneck()
        if b is not None:
            top = self.max_rate()
            out.append(
                f"first bottleneck: {b.component} at {100 * (b.share or 0):.0f} % "
                f"(reaches its limit near {top:,.0f} orders/s with {self.shards} shard(s))"
            )
        over = [line.component for line in self.lines() if line.over]
        unknown = [line.component for line in self.lines() if line.share is None]
        out.append(
            f"components over 80 %: {', '.join(over) if over else 'none'}"
            + (f"; not checked (no published limit): {', '.join(unknown)}" if unknown else "")
        )
        out.append(
            "$ per million orders at list prices (bench/limits.yaml; est.: an estimated figure; "
            f"hourly peak / average {self.peak_to_average:g}):"
        )
        for cost in self.costs():
            value = (
                "n/a (no price found)"
                if cost.usd_per_million is None
                else f"${cost.usd_per_million:,.2f}" + (" est." if cost.estimate else "")
            )
            out.append(f"  {cost.line:44} {value:>12}" + (f"  ({cost.note})" if cost.note else ""))
        total, unpriced = self.usd_per_million_orders()
        cmp = self.comparison()
        out.append(
            f"usd_per_million_orders={total:.2f}"
            + (f" (not priced: {', '.join(unpriced)})" if unpriced else " (every line priced")
            + (f"; ${self.estimated_usd_per_million():,.2f} of it on estimated figures)")
        )
        out.append(
            f'  beside (orchestration alone, docs/capacity.md "Peers"): AWS Step Functions '
            f"Standard with callbacks ${cmp['step_functions_standard']:,.2f} "
            f"({d['sfn_transitions']:.0f} transitions), Express per message "
            f"${cmp['step_functions_express']:,.2f} ({d['sfn_express_requests']:.0f} executions), "
            f"Temporal Cloud with its plan fee ${cmp['temporal_cloud']:,.2f} "
            f"({d['temporal_actions']:.0f} actions), Durable Functions on Azure Storage "
            f"${cmp['durable_azure_storage']:,.2f} ({d['storage_transactions']:.0f} transactions)"
        )
        out += self.periodic_report()
        return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.capacity",
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="Figures and their sources: bench/limits.yaml; method: docs/capacity.md.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--rate", type=float, help="orders per second")
    what.add_argument(
        "--size",
        type=float,
        metavar="RATE",
        help="print the main.bicep parameters one shard needs for RATE orders/s",
    )
    p.add_argument(
        "--profile", default=None, help="a profile of bench/limits.yaml (dev, production)"
    )
    p.add_argument(
        "--shards",
        type=int,
        default=None,
        help="deployments (shards) the orders are spread over; default: the profile's "
        "(dev 1, production the fewest that fit)",
    )
    p.add_argument(
        "--index-shards",
        type=int,
        default=None,
        help="recovery index key shards (default: the Bicep's RECOVERY_INDEX_SHARDS)",
    )
    args = p.parse_args(argv)
    try:
        if args.size is not None:
            model = Model(args.size, args.profile or "production", 1)
            sized = model.sized_parameters(args.size)
            print(
                f"# one shard for {args.size:,.0f} orders/s, each sized component at or under 80 % "
                f"(profile {model.profile_name}; Service Bus messaging units are not sized: "
                "no published rate per unit)"
            )
            print(json.dumps({k: {"value": v} for k, v in sized.items()}, indent=2))
            return 0
        model = Model(args.rate, args.profile or "dev", args.shards, index_shards=args.index_shards)
    except ModelError as exc:
        p.error(str(exc))
    print(model.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
