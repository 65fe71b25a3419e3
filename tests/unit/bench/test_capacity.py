"""The capacity model's profiles and shards (bench/capacity.py): the
production profile read from its Bicep parameters file, the fewest shards that
keep every component at or under 80 %, the sizing of one shard, and the
command line. The order's cost is measured once per scan in the simulation,
as `python -m bench.capacity` measures it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import capacity
from bench.capacity import ALERT, Model, ModelError, parameter_values
from bench.order_cost import load_limits, measure, with_host_counts

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def limits():
    return load_limits()


@pytest.fixture(scope="module")
def index_cost(limits):
    # As `python -m bench.capacity` prices it: the host's counts (make bench) where saved.
    return with_host_counts(measure("index", limits))


@pytest.fixture(scope="module")
def query_cost(limits):
    return measure("query", limits)


def production(rate, limits, cost, shards=None):
    return Model(rate, "production", shards, cost, limits)


def test_ten_thousand_orders_per_second_fit_in_a_stated_number_of_shards(limits, index_cost):
    model = production(10_000, limits, index_cost)
    assert model.auto_shards
    over = [line.component for line in model.lines() if line.over]
    assert over == []
    known = [line for line in model.lines() if line.share is not None]
    assert all(line.share <= ALERT + 1e-9 for line in known)
    report = model.report()
    assert f"shards={model.shards} (the fewest" in report
    assert "components over 80 %: none" in report
    # The one component with no published limit is named, not passed over.
    assert "not checked (no published limit): service bus" in report


def test_the_stated_shard_count_is_the_fewest(limits, index_cost):
    model = production(10_000, limits, index_cost)
    fewer = production(10_000, limits, index_cost, shards=model.shards - 1)
    assert any(line.over for line in fewer.lines() if line.shards)


def test_the_shard_count_follows_from_the_per_order_counts(limits, index_cost):
    """The shards are the fewest at which the component that runs out first
    with fewer stays at or under 80 %: its load per shard follows from the
    per-order counts (the scheduler's actions, the state database's RU)."""
    model = production(10_000, limits, index_cost)
    first = model.bottleneck()
    assert first is not None
    assert first.share is not None
    fewer = production(10_000, limits, index_cost, shards=model.shards - 1)
    name = first.component.split(" (")[0]
    (same,) = [line for line in fewer.lines() if line.component.split(" (")[0] == name]
    assert same.over
    # Its load is the rate over the shards: one shard fewer moves it by that ratio.
    assert same.share == pytest.approx(first.share * model.shards / (model.shards - 1), rel=0.01)


def test_shards_multiply_per_deployment_limits_not_the_regional_quota(limits, index_cost):
    one = {
        line.component.split(" (")[0]: line
        for line in production(400, limits, index_cost, 1).lines()
    }
    three = {
        line.component.split(" (")[0]: line
        for line in production(400, limits, index_cost, 3).lines()
    }
    for name in ("cosmos state database", "cosmos orders database", "MAX_PROCESSING"):
        assert three[name].limit == 3 * one[name].limit, name
    quota = "functions memory"
    assert three[quota].limit == one[quota].limit
    assert not three[quota].shards
    # Every shard runs its own Starter and Supervisor: their RU count once per shard.
    periodic = sum(production(400, limits, index_cost, 1)._periodic_ru_per_s().values())
    assert three["cosmos state database"].load - one["cosmos state database"].load == pytest.approx(
        2 * periodic
    )


def test_dev_is_as_shipped_and_stays_one_shard(limits, query_cost):
    model = Model(100, "dev", None, query_cost, limits)
    assert model.shards == 1
    assert not model.auto_shards
    # The admission slots first: MAX_PROCESSING 500 as shipped, each order
    # holding its slot about 21 s (in flight, then its lease's grace), so
    # about 23.6 orders/s, what the local bench delivers at 200 in flight
    # (21-23/s, docs/performance.md); Service Bus Standard's credits next
    # (≈ 56 orders/s, workflow 2.3's order, docs/adr/020b-workflow-2-3.md).
    assert model.bottleneck().component.startswith("MAX_PROCESSING")
    assert 20 < (model.max_rate() or 0) < 25
    slots = next(line for line in model.lines() if line.component.startswith("MAX_PROCESSING"))
    assert slots.load == pytest.approx(100 * model.slot_seconds())


def test_the_production_profile_is_read_from_its_parameters_file(limits, tmp_path, monkeypatch):
    real = json.loads((ROOT / "infra" / "main.production.parameters.json").read_text())
    real["parameters"]["cosmosAutoscaleMaxThroughput"]["value"] = 12345
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "main.production.parameters.json").write_text(json.dumps(real))
    monkeypatch.setattr(capacity, "ROOT", tmp_path)
    p = capacity.profile(limits, "production")
    assert p["cosmos"]["state_max_ru_per_s"] == 12345
    # The orders database defaults to the state database's maximum when a file leaves it out.
    del real["parameters"]["ordersCosmosAutoscaleMaxThroughput"]
    (tmp_path / "infra" / "main.production.parameters.json").write_text(json.dumps(real))
    assert capacity.profile(limits, "production")["cosmos"]["orders_max_ru_per_s"] == 12345


def test_a_parameters_file_naming_an_undeclared_parameter_is_refused(tmp_path, monkeypatch):
    (tmp_path / "p.json").write_text(json.dumps({"parameters": {"cosmosThroughput": {"value": 1}}}))
    monkeypatch.setattr(capacity, "ROOT", tmp_path)
    with pytest.raises(ModelError, match="declares no parameter 'cosmosThroughput'"):
        parameter_values("p.json")


def test_azd_placeholders_leave_the_default():
    values = parameter_values("infra/main.parameters.json")
    assert values["durableBackend"] == "azureStorage"  # "${DURABLE_BACKEND=azureStorage}"
    assert values["ordersCosmosAutoscaleMaxThroughput"] == values["cosmosAutoscaleMaxThroughput"]


def test_one_shard_is_sized_to_stay_at_or_under_eighty_percent(limits, index_cost):
    model = production(400, limits, index_cost, 1)
    sized = model.sized_parameters(400)
    state = model.cosmos_ru_per_s()
    assert (state["state"] + state["index"]) / sized["cosmosAutoscaleMaxThroughput"] <= ALERT
    assert sized["cosmosAutoscaleMaxThroughput"] % 1000 == 0
    assert sized["durableTaskSchedulerCapacity"] == 3
    assert sized["maximumInstanceCount"] >= 40


def test_sizing_refuses_a_shard_past_one_scheduler(limits, index_cost):
    model = production(400, limits, index_cost, 1)
    with pytest.raises(ModelError, match="at most 3"):
        model.sized_parameters(1000)
    with pytest.raises(ModelError, match="positive"):
        model.sized_parameters(0)


def test_a_profile_without_a_retention_policy_shows_unbounded_history(limits, index_cost):
    model = production(100, limits, index_cost, 1)
    model.p["durable"]["retention_days_completed"] = -1
    line = model._scheduler_storage_line()
    assert line is not None
    assert line.over


def test_premium_messaging_units_are_priced_per_shard(limits, index_cost):
    def premium(model):
        (cost,) = [c for c in model.costs() if c.line.startswith("service bus Premium")]
        return cost.usd_per_million

    one, four = production(400, limits, index_cost, 1), production(400, limits, index_cost, 4)
    assert premium(four) == pytest.approx(4 * premium(one))


def test_the_command_line(capsys):
    assert capacity.main(["--size", "400"]) == 0
    out = capsys.readouterr().out
    sized = json.loads(out[out.index("{") :])
    given = json.loads((ROOT / "infra" / "main.production.parameters.json").read_text())
    assert set(sized) <= set(given["parameters"])
    with pytest.raises(SystemExit):
        capacity.main(["--rate", "10", "--size", "400"])
    with pytest.raises(SystemExit):
        capacity.main(["--rate", "10", "--shards", "0"])


def table_row(model: Model) -> str:
    """docs/capacity.md's summary-table row for a model run."""
    b = model.bottleneck()
    assert b is not None
    cmp = model.comparison()
    total, unpriced = model.usd_per_million_orders()
    assert unpriced == []
    return (
        f"| {model.rate:,.0f} | {model.profile_name} | {model.shards} | "
        f"{b.component.split(' (')[0]} at {round(100 * (b.share or 0))} % | "
        f"${total:.2f} | ${model.estimated_usd_per_million():.2f} | "
        f"${cmp['step_functions_standard']:.2f} | ${cmp['temporal_cloud']:.2f} |"
    )


def test_the_summary_table_is_what_the_model_prints(limits, index_cost, query_cost):
    """Every figure of docs/capacity.md's summary table comes from
    `python -m bench.capacity --rate R --profile P` (the command beside it).
    A change to the per-order counts or a price changes them: the message
    prints the table to paste."""
    doc = (ROOT / "docs" / "capacity.md").read_text()
    section = doc[doc.index("## Summary") :]
    rows = re.findall(r"^\| ([\d,]+) \| (dev|production) \| .*\|$", section, re.MULTILINE)
    assert len(rows) >= 4, rows
    given = re.findall(r"^\| [\d,]+ \| (?:dev|production) \| .*\|$", section, re.MULTILINE)
    expected = [
        table_row(
            Model(
                float(rate.replace(",", "")),
                name,
                None,
                index_cost if name == "production" else query_cost,
                limits,
            )
        )
        for rate, name in rows
    ]
    assert given == expected, (
        "docs/capacity.md's summary table is stale; the model prints:\n" + "\n".join(expected)
    )


def test_every_line_of_the_bill_is_priced(limits, index_cost, query_cost):
    """Issue 44 item 2: no unpriced line, in either profile, at any rate; a
    line resting on an estimated figure says so."""
    for rate in (100, 1_000, 10_000):
        model = production(rate, limits, index_cost)
        total, unpriced = model.usd_per_million_orders()
        assert unpriced == [], (rate, unpriced)
        names = " ".join(c.line for c in model.costs())
        for service in (
            "cosmos RU",
            "cosmos storage",
            "service bus",
            "durable task scheduler",
            "functions memory-time",
            "executions",
            "always ready",
            "application insights traces",
            "application insights app logs",
        ):
            assert service in names, (rate, service)
        assert 0 < model.estimated_usd_per_million() < total
        assert "est." in model.report()
    dev = Model(100, "dev", None, query_cost, limits)
    assert dev.usd_per_million_orders()[1] == []
    assert any(c.line.startswith("durable storage") for c in dev.costs())


def test_fixed_charges_follow_the_hourly_peak(limits, index_cost):
    """Autoscale and every fixed charge are billed per hour at the peak: with
    the peak twice the average, a fixed line costs twice as much per order."""
    steady = production(1_000, limits, index_cost)
    steady.p["hourly_peak_to_average"] = 1.0
    peaky = production(1_000, limits, index_cost)
    peaky.p["hourly_peak_to_average"] = 2.0
    fixed = {c.line: c.usd_per_million for c in steady.costs()}
    for cost in peaky.costs():
        before = fixed[cost.line]
        assert before is not None
        assert cost.usd_per_million is not None
        if cost.line.startswith(("service bus Premium", "durable task scheduler", "cosmos RU/s")):
            assert cost.usd_per_million == pytest.approx(2 * before), cost.line
        if cost.line.startswith(("functions (", "cosmos storage")):
            assert cost.usd_per_million == pytest.approx(before), cost.line


def test_the_peers_are_priced_for_the_same_saga(limits, index_cost):
    """Step Functions Standard with callbacks: a transition per task of the
    saga (a step's request and reply: the reply's token adds none; the
    finishing write) and the end; Temporal: its actions plus the Business
    plan's 10 % (issue 44 item 3). The saga's tasks, not this app's
    activities: its Starter sends the first request (ADR 021l)."""
    model = production(1_000, limits, index_cost)
    d = model.d
    steps = index_cost.events_raised
    assert index_cost.activities == steps  # a send per step after the first, the finish
    assert d["sfn_transitions"] == steps + 1 + 1
    assert d["temporal_actions"] == 1 + steps + 1 + index_cost.timers + index_cost.events_raised
    cmp = model.comparison()
    assert cmp["step_functions_standard"] == pytest.approx(d["sfn_transitions"] * 25)
    assert cmp["temporal_cloud"] > d["temporal_actions"] * 25  # the tiers, then the fee
    assert cmp["durable_azure_storage"] == pytest.approx(d["storage_transactions"] * 0.4)


def test_periodic_work_is_priced_at_each_backlog(limits, index_cost):
    """Issue 44 item 4: the Starter's, the outbox's and the Supervisor's
    queries at 10,000, 100,000 and 1,000,000 records; only the COUNTs grow,
    and counting once per 30 s takes them off the 5 s tick."""
    model = production(1_000, limits, index_cost)
    for records in capacity.BACKLOGS:
        every_tick = model.periodic(records, None)
        spaced = model.periodic(records, 30.0)
        assert {q.name for q in every_tick if q.grows} == {
            "starter COUNT Pending",
            "starter COUNT Processing",
        }
        tick = [q for q in spaced if q.every_s == model.p["app"]["starter_interval_s"]]
        assert not any(q.grows for q in tick)
        assert pc_per_hour(spaced) < pc_per_hour(every_tick)
    report = model.report()
    for records in ("10,000", "100,000", "1,000,000"):
        assert f"records={records:>9}" in report


def pc_per_hour(queries):
    from bench.periodic_cost import per_hour

    return per_hour(queries)
