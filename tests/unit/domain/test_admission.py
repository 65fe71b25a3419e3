"""The admission limit (domain.admission): slots never past the limit, the
limit following the completion rate under MAX_PROCESSING, and leases counted
until a count surely includes their claims (issue 43)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from domain import admission
from domain.admission import GRACE, LEASE_TTL, Admission, Lease

T0 = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)
BUDGET = timedelta(seconds=180)  # 3 steps x 60 s


def _recount(state: Admission, counted: int, seconds: float, cap: int = 500) -> Admission:
    began = state.counted_at + timedelta(seconds=seconds)
    return admission.recount(state, counted, began, cap=cap, floor=50, attempt_budget=BUDGET)


def test_slots_are_granted_up_to_the_limit_and_no_further():
    state = Admission(limit=30, counted=12, counted_at=T0)

    state, first = admission.take(state, 10, T0)
    state, second = admission.take(state, 10, T0)
    after, third = admission.take(state, 10, T0)

    assert (first, second, third) == (10, 8, 0)
    assert state.estimate() == 30
    assert after == state  # nothing granted, nothing to write


def test_the_limit_follows_the_completion_rate_within_the_cap():
    # 100 in flight, 20 claimed, 60 s later 60 in flight: 60 finished, 1/s.
    state = Admission(limit=120, counted=100, counted_at=T0, rate=1.0)
    state, _ = admission.take(state, 20, T0 + timedelta(seconds=1))

    slow = _recount(state, 60, 60)
    fast = _recount(Admission(limit=200, counted=100, counted_at=T0, rate=50.0), 0, 1)

    # An attempt should take half its budget in flight: 1/s x 90 s.
    assert slow.rate == 1.0
    assert slow.limit == 90
    assert fast.limit == 500  # 50/s would allow 4,500: the cap holds


def test_a_stall_brings_the_limit_down_to_the_floor_and_no_work_keeps_it():
    stalled = _recount(Admission(limit=400, counted=300, counted_at=T0, rate=4.0), 300, 60)
    idle = _recount(Admission(limit=400, counted=0, counted_at=T0, rate=4.0), 0, 60)

    assert stalled.rate < 4.0
    assert stalled.limit < 400
    for _ in range(20):
        stalled = _recount(stalled, 300, 60)
    assert stalled.limit == 50  # the floor: some work always goes on
    assert idle.rate == 4.0  # nothing in flight and nothing finished says nothing
    assert idle.limit == 360


def test_retried_attempts_back_the_limit_off_whatever_the_rate_says():
    # Expired attempts leave Processing too: they look like completions.
    state = Admission(limit=500, counted=300, counted_at=T0, rate=10.0)
    state, granted = admission.take(state, 100, T0 + timedelta(seconds=1), retries=40)

    after = _recount(state, 300, 10)

    assert granted == 100
    assert 6 < after.rate < 10  # 6/s since: the retries are not completions
    assert after.limit == 350  # x 0.7, though the rate would allow the cap


def test_a_retry_or_two_among_few_claims_is_no_trend_and_a_lull_no_stall():
    state = Admission(limit=300, counted=100, counted_at=T0, rate=2.0)
    state, _ = admission.take(state, 5, T0 + timedelta(seconds=1), retries=2)

    after = _recount(state, 105, 5)  # nothing finished in these 5 s

    assert after.limit == 210  # down by 0.7 at most, not to the floor


def test_a_lease_counts_until_a_count_begun_grace_after_it():
    taken = T0 + timedelta(seconds=1)
    state, _ = admission.take(Admission(limit=100, counted=0, counted_at=T0), 10, taken)

    soon = admission.recount(
        state, 10, taken + GRACE - timedelta(seconds=1), cap=100, floor=5, attempt_budget=BUDGET
    )
    later = admission.recount(state, 10, taken + GRACE, cap=100, floor=5, attempt_budget=BUDGET)

    assert soon.leases == (Lease(taken, 10),)  # its claims may not be in this count
    assert soon.estimate() == 20  # counted twice meanwhile: errs on the safe side
    assert later.leases == ()
    assert later.estimate() == 10
    assert admission.usable(taken, taken + LEASE_TTL - timedelta(seconds=1))
    assert not admission.usable(taken, taken + LEASE_TTL)
    assert LEASE_TTL < GRACE


def test_a_first_document_starts_at_the_floor_under_the_cap():
    assert admission.first(500, 50, 0, T0).limit == 50
    assert admission.first(20, 50, 0, T0).limit == 20


def test_a_fresh_document_takes_the_rate_of_its_first_counts_not_a_minute_to_warm_up():
    # The first count came half a second in, when 2 of 100 claims had
    # finished (4/s); the agents then finished 20/s. An average starting
    # from 4/s stayed under 10/s for about a minute, and the limit with it.
    state = admission.first(5000, 100, 0, T0)
    state, _ = admission.take(state, 100, T0)
    state = _recount(state, 98, 0.5, cap=5000)
    assert state.rate == 4.0
    for _ in range(2):
        state, _ = admission.take(state, 100, state.counted_at)
        state = _recount(state, state.counted, 5, cap=5000)  # 100 finished in 5 s
    assert 18 < state.rate <= 20
    assert state.limit >= 1600  # 18/s x 90 s
    assert state.covered == 10.5


def test_once_warm_the_rate_is_an_average_over_about_a_minute():
    state = Admission(limit=900, counted=100, counted_at=T0, rate=10.0, covered=60.0)
    state, _ = admission.take(state, 100, T0)
    after = _recount(state, 100, 5)  # 20/s for 5 s
    assert 10 < after.rate < 11  # one sample of 5 s moves a minute's average a little
    assert after.covered == 60.0
