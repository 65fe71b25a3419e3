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
