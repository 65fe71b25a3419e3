"""The cost of one order, measured, against the committed baseline; and the
rules that turn measured documents into RU and counts into loads.

The regression test runs a real happy-path order through the product's code
in the simulation (bench/order_cost.py) and computes RU and Durable history
from the documents and events that order produced: a change that makes a
document or an activity payload bigger, adds a write or indexes more paths
shows up here."""

from __future__ import annotations

import copy
import json

import pytest

from bench.capacity import Model, ModelError, derived, load_baseline
from bench.cosmos_ru import DEFAULT_POLICY, IndexPolicy, Op, RuModel, bicep_policies
from bench.order_cost import load_limits, measure, regressions


@pytest.fixture(scope="module")
def limits():
    return load_limits()


@pytest.fixture(scope="module", params=["index", "query"])
def cost(request, limits):
    return measure(request.param, limits)


def test_an_order_costs_no_more_than_the_baseline_allows(cost):
    assert cost.outcome == "Processed"
    assert cost.cosmos_ru_per_order > 0
    assert cost.history_bytes > 0
    assert regressions(cost, load_baseline()) == []


def test_the_check_fails_past_ten_percent(cost):
    baseline = load_baseline()
    bigger = copy.deepcopy(cost)
    bigger.history_bytes = int(baseline["order"][cost.scan]["history_bytes_per_order"] * 1.11)
    found = regressions(bigger, baseline)
    assert len(found) == 1
    assert "history_bytes_per_order" in found[0]
    bigger.cosmos_ru = {"state replace": baseline["order"][cost.scan]["cosmos_ru_per_order"] * 1.11}
    assert len(regressions(bigger, baseline)) == 2


def test_the_measurement_sees_what_the_order_did(cost):
    # One Submit, one orchestration, remote steps answered over the bus: the
    # order's message arrived and its statuses went back, every activity left
    # a TaskScheduled in the history, the state record was created and then
    # replaced, and the index was written only by the index scan.
    assert cost.sb_sent["orders-webshop"] == 1
    assert cost.sb_sent["replies-webshop"] >= 1
    assert cost.sb_sent["agent-requests"] == cost.sb_sent["agent-responses"] >= 1
    assert cost.events_raised == cost.sb_sent["agent-responses"]
    assert 1 <= cost.activities < cost.episodes < cost.history_events
    assert cost.cosmos_requests["state create"] == 1
    assert cost.cosmos_requests["state replace"] >= 1
    assert ("index upsert" in cost.cosmos_requests) == (cost.scan == "index")
    assert cost.periodic_ru_per_run["starter"] > 0


def _model(limits) -> RuModel:
    return RuModel(limits, {"c": DEFAULT_POLICY})


def test_create_and_replace_follow_the_published_examples(limits):
    model = _model(limits)
    doc = {"id": "a", **{f"p{i}": i for i in range(9)}}  # 10 indexed terms, well under 1 KB
    assert model.charge(Op("c", "create", "x", new=doc)) == pytest.approx(4.95 + 0.2 * 10)
    changed = dict(doc, p0=100, p1=101)  # two terms removed, two added
    assert model.charge(Op("c", "replace", "x", new=changed, old=doc)) == pytest.approx(
        4.95 + 4.95 + 0.2 * 4
    )
    assert model.charge(Op("c", "delete", "x", old=doc)) == pytest.approx(4.95 + 0.2 * 10)
    big = {"id": "b", "blob": "x" * 3000}  # ~3.2 KB stored: between the 2 and 4 KB rows
    assert 6.29 < model.size_write(big) < 6.67


def test_the_bicep_policy_indexes_only_what_queries_name():
    state = IndexPolicy.of(bicep_policies()["state"])
    assert state.indexed(("ProcessState",))
    assert state.indexed(("PendingStatus", "At"))
    assert not state.indexed(("History", "[]", "At"))
    assert not state.indexed(("Steps", "payment", "Status"))
    assert not state.indexed(("Lines", "[]", "Sku"))
    assert not state.indexed(("_etag",))
    orders = IndexPolicy.of(bicep_policies()["orders"])
    assert not orders.indexed(("Lines", "[]", "Sku"))  # indexingMode none
    assert not orders.indexed(("AppId",))
    index = IndexPolicy.of(bicep_policies()["index"])
    assert index.indexed(("bucket",))
    assert not index.indexed(("OrderID",))


def test_dev_as_shipped_hits_its_ceilings(limits, cost):
    model = Model(1000, "dev", cost=cost, limits=limits)
    bottleneck = model.bottleneck()
    assert bottleneck is not None
    assert (bottleneck.share or 0) > 1
    assert (model.max_rate() or 0) < 1000


def test_shards_multiply_the_durable_backend(limits, cost):
    one = {
        line.component.split(" (")[0]: line for line in Model(500, "dev", 1, cost, limits).lines()
    }
    four = {
        line.component.split(" (")[0]: line for line in Model(500, "dev", 4, cost, limits).lines()
    }
    assert four["durable storage"].limit == 4 * (one["durable storage"].limit or 0)
    assert four["durable storage"].load == one["durable storage"].load


def test_the_index_hot_partition_takes_one_shards_share(limits, cost):
    """RECOVERY_INDEX_SHARDS (ADR 019b): the busiest index partition takes
    1/N of the index's writes, so its ceiling is N times one partition's;
    the default is the Bicep's."""

    def hot(model):
        lines = [line for line in model.lines() if line.component.startswith("cosmos index hot")]
        return lines[0] if lines else None

    one = hot(Model(500, "dev", 1, cost, limits, index_shards=1))
    if one is None:  # the query Supervisor writes no index
        assert cost.scan == "query"
        return
    sixteen = hot(Model(500, "dev", 1, cost, limits, index_shards=16))
    assert sixteen is not None
    assert sixteen.load == pytest.approx(one.load / 16)
    assert sixteen.limit == one.limit
    default = Model(500, "dev", 1, cost, limits)
    assert default.index_shards == 16  # infra/main.bicep recoveryIndexShards
    with pytest.raises(ModelError, match="index-shards"):
        Model(500, "dev", 1, cost, limits, index_shards=0)


def test_bad_input_is_refused_with_the_reason(limits, cost):
    with pytest.raises(ModelError, match="unknown profile"):
        Model(10, "staging", cost=cost, limits=limits)
    with pytest.raises(ModelError, match="positive"):
        Model(0, "dev", cost=cost, limits=limits)


def test_every_figure_names_its_source_and_date(limits):
    def figures(node, path=""):
        if isinstance(node, dict) and "value" in node:
            yield path, node
        elif isinstance(node, dict):
            for k, v in node.items():
                if k != "profiles":
                    yield from figures(v, f"{path}.{k}")

    found = list(figures(limits))
    assert len(found) > 20
    for path, node in found:
        assert node.get("source"), path
        assert node.get("read"), path
        if node["value"] is None:
            assert node.get("note"), f"{path}: a missing figure must say why"


def test_derived_counts_follow_the_stated_rules(cost):
    d = derived(cost)
    assert d["dts_actions"] == 1 + 2 * cost.activities + cost.timers_fired + cost.events_raised
    assert d["sb_operations"] == 3 * sum(cost.sb_sent.values())
    json.dumps(d)
