"""Fault rules matched without HTTP: expiry and rates under a controlled clock."""

from __future__ import annotations

import random

from devstack.remote_service.faults import FaultBook, FaultRule


class Monotonic:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_ends_when_its_period_is_over():
    clock = Monotonic()
    book = FaultBook(monotonic=clock)
    book.add(FaultRule(kind="outage", service="payment", seconds=30))

    during = book.plan("payment", "charge", "o1").failure
    clock.now += 30
    after = book.plan("payment", "charge", "o1").failure

    assert during is not None
    assert during.status == 503
    assert after is None
    assert book.describe() == []


def test_a_rate_rule_fires_about_as_often_as_asked_and_is_reproducible():
    def failures(seed: int) -> list[bool]:
        book = FaultBook(rng=random.Random(seed))
        book.add(FaultRule(kind="transient", rate=0.3))
        return [book.plan("inventory", "reserve", "o1").failure is not None for _ in range(1000)]

    run = failures(1)

    assert run == failures(1)
    assert 200 < sum(run) < 400


def test_latency_rules_add_up_and_the_first_failure_rule_wins():
    book = FaultBook()
    book.add(FaultRule(kind="latency", seconds=1))
    book.add(FaultRule(kind="latency", service="payment", seconds=2))
    book.add(FaultRule(kind="permanent", service="payment", status=400, count=1))
    book.add(FaultRule(kind="transient", service="payment"))

    plan = book.plan("payment", "charge", "o1")
    next_plan = book.plan("payment", "charge", "o1")

    assert plan.delay == 3
    assert plan.failure is not None
    assert plan.failure.status == 400
    assert next_plan.failure is not None
    assert next_plan.failure.status == 503


def test_a_crash_rule_is_used_up_only_when_an_effect_was_applied():
    book = FaultBook()
    book.add(FaultRule(kind="crash", mode="error", count=1))

    plan_without_effect = book.plan("shipping", "arrange", "o1")  # e.g. a replay
    plan = book.plan("shipping", "arrange", "o1")

    assert plan_without_effect.crash_rule is not None
    assert book.crashed(plan) == "error"
    assert book.crashed(plan_without_effect) is None
    assert book.describe() == []


def test_a_ratelimit_serves_its_rate_and_refuses_the_rest_with_429_and_retry_after():
    clock = Monotonic()
    book = FaultBook(monotonic=clock)
    book.add(FaultRule(kind="ratelimit", per_second=4))

    first_second = [book.plan("payment", "charge", f"o{i}").failure for i in range(6)]
    clock.now += 0.5  # two tokens back
    half_later = [book.plan("shipping", "arrange", f"p{i}").failure for i in range(3)]

    assert [f is None for f in first_second] == [True] * 4 + [False] * 2
    refused = first_second[4]
    assert refused is not None
    assert (refused.status, refused.retry_after) == (429, 1)
    assert [f is None for f in half_later] == [True, True, False]
    assert len(book.describe()) == 1  # a ratelimit rule stays until deleted


def test_a_ratelimit_bucket_holds_its_burst_and_names_the_wait_in_whole_seconds():
    clock = Monotonic()
    book = FaultBook(monotonic=clock)
    book.add(FaultRule(kind="ratelimit", service="payment", per_second=0.25, burst=2))

    calls = [book.plan("payment", "charge", "o1").failure for _ in range(3)]
    other = book.plan("inventory", "reserve", "o1").failure
    clock.now += 60  # a long quiet spell refills no more than the burst
    after = [book.plan("payment", "charge", "o1").failure for _ in range(3)]

    assert [f is None for f in calls] == [True, True, False]
    assert calls[2] is not None
    assert calls[2].retry_after == 4
    assert other is None
    assert [f is None for f in after] == [True, True, False]


def test_a_ratelimit_rule_needs_its_rate_and_takes_no_count():
    for bad in (
        {"kind": "ratelimit"},
        {"kind": "ratelimit", "per_second": 5, "count": 3},
        {"kind": "transient", "per_second": 5},
        {"kind": "latency", "seconds": 1, "burst": 2},
    ):
        try:
            FaultRule.model_validate(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")
