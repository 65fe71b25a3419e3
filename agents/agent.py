"""The Agent: calls one remote operation for one AgentRequest and answers with
one AgentReply, as well as it can inside the request's deadline (retries with
backoff, a circuit breaker per service); it decides nothing about the workflow.
How it spends its share of the one retry budget: docs/adr/011-agent-retry-budget.md."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pybreaker
from pydantic import ValidationError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from adapters.clock import Clock
from agents.ports import RemoteCall, RemoteService
from agents.smoke import NoOpRemoteService
from domain.codec import describe
from domain.errors import PermanentError, TransientError
from domain.ids import agent_reply_message_id, is_smoke_order
from domain.models import (
    MAX_AGENT_CALLS,
    AgentCall,
    AgentReply,
    AgentRequest,
    ReplyOutcome,
    mask_card_numbers,
)
from domain.steps import DEFAULT_CATALOG, RemoteStep, StepCatalog, UnknownStep

log = logging.getLogger(__name__)

MAX_ERROR_TEXT = 500
PACING_SPREAD = 1.25  # a paced retry waits Retry-After x 1 to this


def _is_permanent(exc: BaseException) -> bool:
    """A 4xx: the dependency is up, so the breaker does not count it."""
    return isinstance(exc, PermanentError)


def _is_pacing(exc: BaseException) -> bool:
    """A 429, or a call our own deadline cut short (TransientError.pacing):
    counted, they would open the breaker under a mere burst."""
    return isinstance(exc, TransientError) and exc.pacing


def _is_ending(exc: BaseException) -> bool:
    """The call's task or process ending (a cancellation at shutdown, a
    SystemExit, the simulation's crash) says nothing about the dependency."""
    return not isinstance(exc, Exception)


@dataclass(frozen=True)
class AgentPolicy:
    """How an Agent spends its share of the retry budget (ADR 011); each
    field is an AGENT_* setting of docs/agents.md's table, in seconds."""

    call_timeout: float = 10.0
    initial_backoff: float = 0.5
    max_backoff: float = 8.0
    max_attempts: int = 8
    reply_margin: float = 2.0
    breaker_fail_max: int = 5
    breaker_reset_timeout: float = 30.0
    min_call_time: float = 0.5


class DeadlineReached(Exception):
    """No time is left to start a call; never retried."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


class _ClockedOpenState(pybreaker.CircuitOpenState):
    """pybreaker's open state, its timeout measured on the breaker's clock."""

    _breaker: _ClockedBreaker

    def before_call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        timeout = timedelta(seconds=self._breaker.reset_timeout)
        opened_at = self._breaker._state_storage.opened_at
        if opened_at and self._breaker.now() < opened_at + timeout:
            raise pybreaker.CircuitBreakerError(
                "Timeout not elapsed yet, circuit breaker still open"
            )
        self._breaker.half_open()
        return self._breaker.call(func, *args, **kwargs)


class _ClockedBreaker(pybreaker.CircuitBreaker):
    """A pybreaker CircuitBreaker whose open timeout runs on `now` rather than
    the wall clock (the simulation's virtual time)."""

    def __init__(self, now: Callable[[], datetime], **kwargs: Any) -> None:
        self.now = now
        super().__init__(**kwargs)

    def _create_new_state(self, new_state: str, prev_state: Any = None, notify: bool = False):
        if new_state == pybreaker.STATE_OPEN:
            return _ClockedOpenState(self, prev_state=prev_state, notify=notify)
        return super()._create_new_state(new_state, prev_state, notify)

    def open(self) -> bool:
        with self._lock:
            self._state_storage.opened_at = self.now()
            self.state = self._state_storage.state = pybreaker.STATE_OPEN
            return self._throw_new_error_on_trip


class Breakers:
    """One circuit breaker per dependency, created on first use. `now`: the
    clock their open timeouts run on (the wall clock unless told)."""

    def __init__(
        self, fail_max: int, reset_timeout: float, now: Callable[[], datetime] = _utc_now
    ) -> None:
        self._fail_max = fail_max
        self._reset_timeout = reset_timeout
        self._now = now
        self._breakers: dict[str, pybreaker.CircuitBreaker] = {}

    def for_service(self, service: str) -> pybreaker.CircuitBreaker:
        breaker = self._breakers.get(service)
        if breaker is None:
            breaker = _ClockedBreaker(
                self._now,
                fail_max=self._fail_max,
                reset_timeout=self._reset_timeout,
                exclude=(_is_permanent, _is_pacing, _is_ending),
                name=service,
                # The call that trips the breaker surfaces its own error.
                throw_new_error_on_trip=False,
            )
            self._breakers[service] = breaker
        return breaker

    def reopens_in(self, service: str) -> float:
        """Seconds until `service`'s open breaker lets a trial call through
        (0 when it is not open)."""
        breaker = self.for_service(service)
        opened_at = breaker._state_storage.opened_at
        if breaker.current_state != pybreaker.STATE_OPEN or opened_at is None:
            return 0.0
        if opened_at.tzinfo is None:
            opened_at = opened_at.replace(tzinfo=UTC)
        reopen = opened_at + timedelta(seconds=breaker.reset_timeout)
        return max(0.0, (reopen - self._now()).total_seconds())


class _BackoffWithJitter(wait_base):
    """Exponential backoff with "equal jitter" (between half and all of the
    ceiling), or a 429's Retry-After spread a little (the service's pace, not a
    failure); a Retry-After on any other error is honoured when longer."""

    def __init__(self, initial: float, maximum: float, rng: random.Random) -> None:
        self._initial = initial
        self._maximum = maximum
        self._rng = rng

    def __call__(self, retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, TransientError) and exc.pacing and exc.retry_after:
            return self._rng.uniform(exc.retry_after, exc.retry_after * PACING_SPREAD)
        ceiling = min(self._maximum, self._initial * 2 ** (retry_state.attempt_number - 1))
        wait = self._rng.uniform(ceiling / 2, ceiling)
        if isinstance(exc, TransientError) and exc.retry_after:
            wait = max(wait, exc.retry_after)
        return wait


class _StopAfterFailures(stop_base):
    """Stop after `max_attempts` calls that failed; a paced call (_is_pacing)
    did not fail, and only the deadline stops those."""

    def __init__(self, max_attempts: int) -> None:
        self._max = max_attempts
        self._failed = 0

    def __call__(self, retry_state: RetryCallState) -> bool:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if exc is None or not _is_pacing(exc):
            self._failed += 1
        return self._failed >= self._max


class _UntilBreakerReopens(wait_base):
    """`backoff`, or after a call the open breaker refused, the time until it
    lets a trial call through: the request waits for the reset inside its
    deadline rather than answering "not called" while the service is about to
    be tried again."""

    def __init__(self, backoff: wait_base, breakers: Breakers, service: str) -> None:
        self._backoff = backoff
        self._breakers = breakers
        self._service = service

    def __call__(self, retry_state: RetryCallState) -> float:
        wait = self._backoff(retry_state)
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, pybreaker.CircuitBreakerError):
            wait = max(wait, self._breakers.reopens_in(self._service))
        return wait


class _StopBeforeDeadline(stop_base):
    """Stop when the next wait would end after `last_start` (tenacity computes
    the upcoming wait before asking `stop`)."""

    def __init__(self, clock: Clock, last_start: datetime) -> None:
        self._clock = clock
        self._last_start = last_start

    def __call__(self, retry_state: RetryCallState) -> bool:
        wake = self._clock.now() + timedelta(seconds=retry_state.upcoming_sleep)
        return wake > self._last_start


def reply_event_id(request: AgentRequest) -> str:
    """The reply's stable MessageId (duplicate detection drops a re-sent one)
    and the EventId the Scheduler de-duplicates on."""
    return agent_reply_message_id(request.InstanceId, request.ReplyEvent)


@dataclass
class _Tries:
    """One request's calls: how many, the last transient error, and each one
    for the reply's record (ADR 017d)."""

    calls: int = 0
    last_error: TransientError | None = None
    record: list[AgentCall] = field(default_factory=list)


class Agent:
    """Handles AgentRequests against the remote service, with the step catalog
    it serves; the smoke application's requests are answered by
    agents.smoke's no-op, never by `remote`."""

    def __init__(
        self,
        remote: RemoteService,
        clock: Clock,
        policy: AgentPolicy | None = None,
        breakers: Breakers | None = None,
        rng: random.Random | None = None,
        steps: StepCatalog = DEFAULT_CATALOG,
    ) -> None:
        self._remote = remote
        self._smoke_remote = NoOpRemoteService()
        self.steps = steps
        self._clock = clock
        self._policy = policy or AgentPolicy()
        self.breakers = breakers or Breakers(
            self._policy.breaker_fail_max, self._policy.breaker_reset_timeout
        )
        self._wait = _BackoffWithJitter(
            self._policy.initial_backoff, self._policy.max_backoff, rng or random.Random()
        )

    async def handle(self, request: AgentRequest, *, redelivered: bool = False) -> AgentReply:
        """`redelivered`: an earlier delivery of this very message did not
        finish (a crash, a lost lock), so it may never have answered."""
        try:
            step = self.steps.step_named(request.Step)
        except UnknownStep as exc:
            return self._reply(request, ReplyOutcome.PERMANENT, error=str(exc))
        operation = step.operation(request.Action)
        stop_at, last_start = self._budget(request, redelivered)
        if self._clock.now() > last_start:
            return self._reply(
                request,
                ReplyOutcome.TRANSIENT,
                error=f"too little time left before the deadline {request.Deadline.isoformat()}: "
                f"no call made to {operation.path}",
            )
        call = RemoteCall(
            service=operation.service,
            operation=operation.operation,
            idempotency_key=request.IdempotencyKey,
            fencing_token=request.FencingToken,
            body=_body(request, step),
        )
        # The in-app path may not carry the AppId: the order key names it too.
        smoke = is_smoke_order(request.OrderID, request.AppId)
        remote = self._smoke_remote if smoke else self._remote
        tries = _Tries()
        try:
            result = await self._call(remote, call, operation.service, stop_at, last_start, tries)
        except pybreaker.CircuitBreakerError:
            error = f"circuit open for {operation.service}: {operation.path} not called"
            if tries.last_error is not None:
                error += f" again after {tries.calls} calls; last error: {tries.last_error}"
            return self._reply(request, ReplyOutcome.TRANSIENT, error=error, calls=tries.record)
        except DeadlineReached:
            error = f"deadline reached after {tries.calls} calls to {operation.path}"
            if tries.last_error is not None:
                error += f"; last error: {tries.last_error}"
            return self._reply(request, ReplyOutcome.TRANSIENT, error=error, calls=tries.record)
        except TransientError as exc:
            return self._reply(
                request,
                ReplyOutcome.TRANSIENT,
                error=f"gave up after {tries.calls} calls within the deadline: {exc}",
                calls=tries.record,
            )
        except PermanentError as exc:
            return self._reply(request, ReplyOutcome.PERMANENT, error=str(exc), calls=tries.record)
        try:
            return self._reply(request, ReplyOutcome.OK, result=result, calls=tries.record)
        except ValidationError as exc:
            # The effect happened but its answer does not fit: retrying cannot fix it.
            return self._reply(
                request,
                ReplyOutcome.PERMANENT,
                error=f"{operation.path} answered a result the reply cannot carry: "
                f"{describe(AgentReply, exc)}",
                calls=tries.record,
            )

    def _budget(self, request: AgentRequest, redelivered: bool) -> tuple[datetime, datetime]:
        """When the agent stops (the reply must reach the Scheduler before its
        timer fires) and the last moment a call may start."""
        stop_at = request.Deadline - timedelta(seconds=self._policy.reply_margin)
        last_start = stop_at - timedelta(seconds=self._policy.min_call_time)
        if self._clock.now() > last_start and _late_undo_wanted(request, redelivered):
            # The undo's own budget (ADR 005). Only for a redelivery: a copy of
            # a request that already answered would reuse its reply id.
            assert request.ListenUntil is not None
            stop_at = request.ListenUntil - timedelta(seconds=self._policy.reply_margin)
            last_start = stop_at - timedelta(seconds=self._policy.min_call_time)
        return stop_at, last_start

    async def _call(
        self,
        remote: RemoteService,
        call: RemoteCall,
        service: str,
        stop_at: datetime,
        last_start: datetime,
        tries: _Tries,
    ) -> dict[str, Any]:
        """`call` with retries and backoff inside the budget, through the
        service's breaker; each call noted in `tries`. Raises what ended it."""
        result: dict[str, Any] = {}
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type((TransientError, pybreaker.CircuitBreakerError)),
            wait=_UntilBreakerReopens(self._wait, self.breakers, service),
            # The failures' count first: every outcome must reach it.
            stop=_StopAfterFailures(self._policy.max_attempts)
            | _StopBeforeDeadline(self._clock, last_start),
            sleep=self._clock.sleep,
            reraise=True,
        ):
            with attempt:
                # A sleep can wake late on a loaded machine: check again.
                if self._clock.now() > last_start:
                    raise DeadlineReached()
                remaining = (stop_at - self._clock.now()).total_seconds()
                with self.breakers.for_service(service).calling():
                    tries.calls += 1
                    started = self._clock.now()
                    try:
                        result = await remote.call(
                            call, timeout=min(self._policy.call_timeout, remaining)
                        )
                    except TransientError as exc:
                        tries.last_error = exc
                        if exc.no_answer_within is not None:
                            # Cut short by our deadline: slowness, not failure.
                            exc.pacing = exc.no_answer_within < self._policy.call_timeout
                        _note_call(tries.record, started, self._clock.now(), "transient")
                        raise
                    except PermanentError:
                        _note_call(tries.record, started, self._clock.now(), "permanent")
                        raise
                    except Exception:
                        _note_call(tries.record, started, self._clock.now(), "error")
                        raise
                    _note_call(tries.record, started, self._clock.now(), "ok")
        return result

    def _reply(
        self,
        request: AgentRequest,
        outcome: ReplyOutcome,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        calls: list[AgentCall] | None = None,
    ) -> AgentReply:
        # A provider may quote the card: masked before the log and the cut.
        error = mask_card_numbers(error) if error else error
        log.info(
            "agent reply order=%s step=%s action=%s attempt=%s outcome=%s error=%s",
            request.OrderID,
            request.Step,
            request.Action,
            request.Attempt,
            outcome.value,
            error,
        )
        return AgentReply(
            InstanceId=request.InstanceId,
            OrderID=request.OrderID,
            Step=request.Step,
            Action=request.Action,
            Attempt=request.Attempt,
            # Echoed so the reply bridge can check it answers this request.
            AppId=request.AppId,
            ReplyToken=request.ReplyToken,
            EventName=request.ReplyEvent,
            EventId=reply_event_id(request),
            Outcome=outcome,
            Result=result,
            Error=error[:MAX_ERROR_TEXT] if error else None,
            Calls=calls[-MAX_AGENT_CALLS:] if calls else None,
        )


def _note_call(record: list[AgentCall], started: datetime, ended: datetime, outcome: str) -> None:
    ms = max(0, round((ended - started).total_seconds() * 1000))
    record.append(AgentCall(At=started, Ms=min(ms, 86_400_000), Outcome=outcome))


def _late_undo_wanted(request: AgentRequest, redelivered: bool) -> bool:
    """An undo whose workflow listens past its Deadline (AgentRequest.ListenUntil),
    delivered again after an unfinished delivery. Never a "do": no new side
    effect starts after its deadline."""
    return (
        redelivered
        and request.Action == "undo"
        and request.ListenUntil is not None
        and request.ListenUntil > request.Deadline
    )


def _body(request: AgentRequest, step: RemoteStep) -> dict[str, Any]:
    """The call's body: the order, the step, and the order fields the step
    takes (its catalog entry's `payload`), in the order the request has them."""
    payload = request.Payload
    if isinstance(payload, dict):
        payload = {k: v for k, v in payload.items() if k in step.payload}
    return {
        "OrderID": request.OrderID,
        "Step": step.name,
        "Action": request.Action,
        "Payload": payload,
    }
