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
from bench.order_cost import load_limits, measure

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def limits():
    return load_limits()


@pytest.fixture(scope="module")
def index_cost(limits):
    return measure("index", limits)


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
    """With the scheduler's 3 CUs (6,000 actions/s) per shard and 12 actions
    per order today, a shard takes 400 orders/s at 80 %: 10,000/s need 25."""
    model = production(10_000, limits, index_cost)
    per_shard_at_80 = 0.8 * 3 * 2000 / model.d["dts_actions"]
    assert model.shards == int(-(-10_000 // per_shard_at_80))
    assert model.bottleneck().component.startswith("durable task scheduler")


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
    # Service Bus Standard's credits first (≈ 56 orders/s), the state container
    # right behind it (workflow 2.3's order, docs/adr/020b-workflow-2-3.md).
    assert model.bottleneck().component.startswith("service bus")
    assert 50 < (model.max_rate() or 0) < 60


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


def readme_row(model: Model) -> str:
    """The README's capacity-table row for a model run."""
    b = model.bottleneck()
    assert b is not None
    cmp = model.comparison()
    return (
        f"| {model.rate:,.0f} | {model.profile_name} | {model.shards} | "
        f"{b.component.split(' (')[0]} at {round(100 * (b.share or 0))} % | "
        f"${model.usd_per_million_orders()[0]:.2f} | ${cmp['step_functions_standard']:.2f} | "
        f"${cmp['temporal_cloud']:.2f} |"
    )


def test_the_readme_table_is_what_the_model_prints(limits, index_cost, query_cost):
    """Every figure of the README's capacity table comes from
    `python -m bench.capacity --rate R --profile P` (the command beside it).
    A change to the per-order counts changes them: the message prints the
    table to paste."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Capacity") :]
    rows = re.findall(r"^\| ([\d,]+) \| (dev|production) \| .*\|$", section, re.MULTILINE)
    assert len(rows) >= 4, rows
    given = re.findall(r"^\| [\d,]+ \| (?:dev|production) \| .*\|$", section, re.MULTILINE)
    expected = [
        readme_row(
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
        "README.md's capacity table is stale; the model prints:\n" + "\n".join(expected)
    )
