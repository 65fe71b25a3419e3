"""Admission: how many orders may be in flight (Processing) at once, on every
host (docs/design.md, "Admission control"). Under the MAX_PROCESSING ceiling
the limit follows the completion rate (Little's law: rate x half an attempt's
budget); orders over it wait in Pending, not in `agent-requests`.

The figures live in one `_admission` document of the state container, written
only conditionally, so two hosts never both take the last slot: `Counted` /
`CountedAt` (the Starter's COUNT of Processing and when it began), `Leases`
(the slots taken since; a lease counts until a COUNT begun GRACE after it,
by when every claim it allowed is counted), `Limit` and `Rate`. A lease's
slots are usable for LEASE_TTL < GRACE, so the estimate (Counted + leases)
is never below the records in Processing (none enters without a slot)
while every COUNT sees every claim that has landed. Session consistency
makes a COUNT see its own process's claims and nothing older than its
session saw before; another host's claim it has not seen yet, a lagging
replica can miss however old (docs/design.md: what the cap assumes).

Pure: the Starter reads and writes the document; every decision is here."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

# Short: a lease still in GRACE is counted twice once its claims land (in the
# count and as a lease), which holds the limit down by that many claims.
LEASE_TTL = timedelta(seconds=5)
GRACE = LEASE_TTL + timedelta(seconds=10)  # a claim's write lands within 10 s of its start
TARGET_SHARE = 0.5  # of the attempt's budget: the time an attempt should take in flight
RATE_WINDOW = 60.0  # seconds: the rate is a moving average over about this long
BACKOFF = 0.7  # the most one count lowers the limit by; its factor when retries show
RETRY_SHARE = 0.1  # of the claims since the last count, above which it backs off
MIN_RETRIES = 3  # and at least this many: one retry among five claims is no trend
MAX_LEASES = 200  # a document that stops growing even if no count comes


@dataclass(frozen=True)
class Lease:
    """Slots one claimer took at `at`; `retries`: how many of the records it
    took them for were retries of an attempt that did not finish."""

    at: datetime
    slots: int
    retries: int = 0


@dataclass(frozen=True)
class Admission:
    limit: int
    counted: int
    counted_at: datetime
    rate: float = 0.0
    leases: tuple[Lease, ...] = ()
    # Seconds of counts the rate has seen, up to RATE_WINDOW: below it, the
    # rate is the mean of its samples so far (warming up), not an average
    # that starts from the first count's few completions.
    covered: float = RATE_WINDOW

    def estimate(self) -> int:
        """Records that may be Processing: the count, and every slot taken
        since that the count may not include."""
        return self.counted + sum(lease.slots for lease in self.leases)

    def room(self) -> int:
        return max(0, self.limit - self.estimate())


def first(cap: int, floor: int, counted: int, now: datetime) -> Admission:
    """The document's first version: the limit starts at the floor (a
    batch), and the counts that follow raise it as completions show."""
    return Admission(limit=min(cap, max(floor, 1)), counted=counted, counted_at=now, covered=0.0)


def take(state: Admission, want: int, now: datetime, retries: int = 0) -> tuple[Admission, int]:
    """Take up to `want` slots at `now`: the state to write and the slots
    granted (0: none; nothing to write)."""
    granted = min(want, state.room())
    if granted <= 0 or len(state.leases) >= MAX_LEASES:
        return state, 0
    lease = Lease(at=now, slots=granted, retries=min(retries, granted))
    return replace(state, leases=(*state.leases, lease)), granted


def usable(taken_at: datetime, now: datetime) -> bool:
    """Whether slots taken at `taken_at` may still start a claim."""
    return now < taken_at + LEASE_TTL


def recount(
    state: Admission,
    counted: int,
    began: datetime,
    *,
    cap: int,
    floor: int,
    attempt_budget: timedelta,
) -> Admission:
    """A new COUNT of Processing (`counted`, the query begun at `began`): the
    leases it surely includes dropped, the completion rate and the limit
    updated. Completions since the last count = the last count + the claims
    since - this count; a timed-out attempt back in Pending is not goodput,
    so when over RETRY_SHARE (and MIN_RETRIES) of the claims were retries the
    limit backs off (x BACKOFF); otherwise one count lowers it by that at most."""
    since = [lease for lease in state.leases if lease.at >= state.counted_at]
    claims = sum(lease.slots for lease in since)
    retries = sum(lease.retries for lease in since)
    seconds = (began - state.counted_at).total_seconds()
    rate, covered = state.rate, state.covered
    finished = state.counted + claims - counted
    if seconds > 0 and (finished > 0 or counted > 0):
        # No work and no completions say nothing: the rate is kept. A sample
        # weighs by the time it covers, so counts every 5 s or 30 s see one rate.
        sample = max(0, finished - retries) / seconds
        if state.rate == 0 or covered < RATE_WINDOW:
            # Warming up: the mean of the samples so far, by the time each
            # covers. An average from the first count's few completions held a
            # fresh deployment's limit near the floor for a minute while the
            # agents kept up (issue 44: the limit at 100-400 through a 50 s
            # bench run of 200 orders in flight).
            weight = 1.0 if state.rate == 0 else seconds / (covered + seconds)
        else:
            weight = 1 - math.exp(-seconds / RATE_WINDOW)
        rate = weight * sample + (1 - weight) * state.rate
        covered = min(RATE_WINDOW, covered + seconds)
    low = min(cap, max(floor, 1))
    limit = state.limit
    if rate > 0:
        # Down by at most BACKOFF a count: a lull in completions is not a stall.
        target = round(rate * attempt_budget.total_seconds() * TARGET_SHARE)
        limit = max(target, int(state.limit * BACKOFF))
    if retries >= MIN_RETRIES and retries > RETRY_SHARE * claims:
        limit = min(limit, int(state.limit * BACKOFF))
    kept = tuple(lease for lease in state.leases if lease.at > began - GRACE)
    return Admission(
        limit=max(low, min(cap, limit)),
        counted=counted,
        counted_at=began,
        rate=rate,
        leases=kept,
        covered=covered,
    )
