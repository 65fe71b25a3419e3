"""Fault injection: rules posted to `/_admin/faults`, matched per request.

A rule applies to calls of one service (or "*"), optionally one operation and
one order. Kinds:

| kind      | effect                                                     | fields                     |
|-----------|------------------------------------------------------------|----------------------------|
| latency   | wait before handling (the call may time out; the effect    | seconds                    |
|           | is still applied afterwards, as a slow real service would) |                            |
| transient | answer 5xx (default 503), no effect                         | status, rate, retry_after  |
| outage    | answer 503 for `seconds` from now, no effect               | seconds, retry_after       |
| permanent | answer 4xx (default 422), no effect                         | status, message            |
| crash     | apply the effect, then fail to answer: `drop` the          | mode                       |
|           | connection, answer 500 (`error`), or `exit` the process    |                            |
| ratelimit | serve at most `per_second` matching calls a second (a      | per_second, burst          |
|           | token bucket of `burst` tokens, default one second's       |                            |
|           | worth); a call over it gets 429 with Retry-After, no effect|                            |

`count` limits a rule to the next N calls it fires on (then it is removed);
without it the rule fires on every matching call (`rate`: with that
probability) until deleted or reset. Faults are kept in memory only: a
restarted service starts healthy. A ratelimit rule's bucket is shared by
every call it matches (`service` "*": the whole service's rate); `count`
does not apply to it. Retry-After is the whole seconds until a token is
free (at least 1), as real services send it."""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from devstack.remote_service.ledger import CATALOG, Operations

Kind = Literal["latency", "transient", "outage", "permanent", "crash", "ratelimit"]


class FaultRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Kind
    service: str = "*"
    operation: str | None = None
    order_id: str | None = None
    count: int | None = Field(default=None, ge=1)
    rate: float | None = Field(default=None, gt=0, le=1)
    seconds: float | None = Field(default=None, gt=0, le=3600)
    status: int | None = None
    retry_after: float | None = Field(default=None, ge=0)
    message: str | None = Field(default=None, max_length=300)
    mode: Literal["drop", "error", "exit"] = "drop"
    per_second: float | None = Field(default=None, gt=0, le=100_000)
    burst: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> FaultRule:
        # The service's own catalog when it validates (context "operations").
        served: Operations = (info.context or {}).get("operations") or CATALOG
        if self.service != "*" and self.service not in served:
            raise ValueError(f"unknown service {self.service!r}; known: {', '.join(served)}")
        if self.operation is not None:
            services = served if self.service == "*" else {self.service: served[self.service]}
            if not any(self.operation in ops for ops in services.values()):
                raise ValueError(f"unknown operation {self.operation!r} for {self.service!r}")
        if self.kind in ("latency", "outage") and self.seconds is None:
            raise ValueError(f"a {self.kind} rule needs seconds")
        if (self.kind == "ratelimit") != (self.per_second is not None):
            raise ValueError("per_second is for ratelimit rules, and a ratelimit rule needs it")
        if self.burst is not None and self.kind != "ratelimit":
            raise ValueError("burst applies to ratelimit rules only")
        if self.kind == "ratelimit" and self.count is not None:
            raise ValueError("a ratelimit rule has no count")
        if self.rate is not None and self.kind != "transient":
            raise ValueError("rate applies to transient rules only")
        if (
            self.kind == "transient"
            and self.status is not None
            and not 500 <= self.status <= 599
            and self.status not in (408, 429)
        ):
            raise ValueError("a transient rule's status must be 5xx, 408 or 429")
        if (
            self.kind == "permanent"
            and self.status is not None
            and (not 400 <= self.status <= 499 or self.status in (408, 409, 429))
        ):
            raise ValueError("a permanent rule's status must be 4xx other than 408, 409, 429")
        return self

    def matches(self, service: str, operation: str, order_id: str | None) -> bool:
        return (
            self.service in ("*", service)
            and self.operation in (None, operation)
            and self.order_id in (None, order_id, _client_part(order_id))
        )


@dataclass
class ActiveRule:
    id: int
    rule: FaultRule
    remaining: int | None
    until: float | None = None  # outage end, monotonic seconds
    tokens: float = 0.0  # a ratelimit rule's bucket
    filled_at: float | None = None  # when its bucket was last topped up, monotonic seconds

    def describe(self) -> dict[str, Any]:
        data = self.rule.model_dump(exclude_none=True)
        data.update(id=self.id, remaining=self.remaining)
        return data


@dataclass
class Failure:
    """An answer that replaces the real one (no side effect)."""

    status: int
    body: dict[str, Any]
    retry_after: float | None = None


@dataclass
class Plan:
    """What the faults do to one request."""

    delay: float = 0.0
    failure: Failure | None = None
    crash: Literal["drop", "error", "exit"] | None = None
    crash_rule: ActiveRule | None = None


@dataclass
class FaultBook:
    rng: random.Random = field(default_factory=random.Random)
    monotonic: Callable[[], float] = time.monotonic
    rules: list[ActiveRule] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def add(self, rule: FaultRule) -> ActiveRule:
        now = self.monotonic()
        until = now + rule.seconds if rule.kind == "outage" and rule.seconds else None
        active = ActiveRule(next(self._ids), rule, rule.count, until)
        if rule.kind == "ratelimit":
            active.tokens, active.filled_at = _capacity(rule), now
        self.rules.append(active)
        return active

    def remove(self, rule_id: int) -> bool:
        before = len(self.rules)
        self.rules = [r for r in self.rules if r.id != rule_id]
        return len(self.rules) != before

    def clear(self) -> None:
        self.rules.clear()

    def describe(self) -> list[dict[str, Any]]:
        self._expire()
        return [r.describe() for r in self.rules]

    def plan(self, service: str, operation: str, order_id: str | None) -> Plan:
        """Decide latency and any failure before the effect; a crash rule is
        only looked up here and consumed by `crashed` once an effect is applied."""
        self._expire()
        plan = Plan()
        for active in list(self.rules):
            rule = active.rule
            if not rule.matches(service, operation, order_id):
                continue
            if rule.kind == "latency":
                plan.delay += rule.seconds or 0.0
                self._consume(active)
            elif rule.kind == "crash":
                if plan.crash_rule is None:
                    plan.crash_rule = active
            elif rule.kind == "ratelimit":
                # Every matching call takes a token, whatever else answers it.
                refused = self._over_rate(active)
                if plan.failure is None and refused is not None:
                    plan.failure = refused
            elif plan.failure is None:
                failure = self._failure(rule)
                if failure is not None:
                    plan.failure = failure
                    self._consume(active)
        return plan

    def crashed(self, plan: Plan) -> Literal["drop", "error", "exit"] | None:
        """The effect was applied: fire the crash rule found by `plan`, if any."""
        active = plan.crash_rule
        if active is None or active not in self.rules:
            return None
        self._consume(active)
        return active.rule.mode

    def _failure(self, rule: FaultRule) -> Failure | None:
        if rule.kind == "outage":
            return Failure(
                503,
                {"code": "Outage", "error": rule.message or "service unavailable (outage)"},
                rule.retry_after,
            )
        if rule.kind == "transient":
            if rule.rate is not None and self.rng.random() >= rule.rate:
                return None
            status = rule.status or 503
            return Failure(
                status,
                {"code": "Transient", "error": rule.message or f"injected transient {status}"},
                rule.retry_after,
            )
        if rule.kind == "permanent":
            status = rule.status or 422
            return Failure(
                status,
                {"code": "Rejected", "error": rule.message or f"injected permanent {status}"},
            )
        return None

    def _over_rate(self, active: ActiveRule) -> Failure | None:
        """Take a token from the rule's bucket; without one, a 429 saying when
        the next is free."""
        rate = active.rule.per_second or 1.0
        now = self.monotonic()
        elapsed = now - (active.filled_at if active.filled_at is not None else now)
        active.tokens = min(_capacity(active.rule), active.tokens + elapsed * rate)
        active.filled_at = now
        if active.tokens >= 1:
            active.tokens -= 1
            return None
        wait = max(1, math.ceil((1 - active.tokens) / rate))
        return Failure(
            429,
            {"code": "TooManyRequests", "error": f"rate limit of {rate:g} calls/s exceeded"},
            wait,
        )

    def _consume(self, active: ActiveRule) -> None:
        if active.remaining is None:
            return
        active.remaining -= 1
        if active.remaining <= 0:
            self.remove(active.id)

    def _expire(self) -> None:
        now = self.monotonic()
        self.rules = [r for r in self.rules if r.until is None or now < r.until]


def _capacity(rule: FaultRule) -> float:
    return float(rule.burst or max(1, math.ceil(rule.per_second or 1)))


def _client_part(order_id: str | None) -> str | None:
    """A rule may name an order by its key (`{app}:{OrderID}`, the Idempotency-Key's
    order part) or by the client's OrderID alone."""
    return order_id.rpartition(":")[2] if order_id else None
