"""The remote services: `SimRemote`, the services themselves (the devstack
ledger's idempotency and fencing, the seed's outages, declines, odd
references and undo blackouts), and below the product's HTTP adapter (issue 21) an
aiohttp.ClientSession as `agents.remote_client.HttpRemoteService` uses it
(`session.post(url, json=, headers=, timeout=)` as an async context manager
whose response has `status`, `headers` and `text()`), answering with the
simulation's remote services (`SimRemote.answer`). So the adapter's
own code (headers, timeout, status mapping, its handling of a timeout) runs.

Its own fault (the fallible world's `slow_answers`): the answer comes after
the client's timeout, with the effect applied or not; the client sees
`asyncio.TimeoutError` after the timeout's worth of world time, as aiohttp
raises it for `ClientTimeout(total=...)`."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from agents.ports import RemoteCall
from agents.remote_client import FENCING_TOKEN_HEADER, IDEMPOTENCY_KEY_HEADER, _interpret
from devstack.remote_service.ledger import Ledger, operations
from domain.steps import DEFAULT_CATALOG, StepCatalog

from .options import BLACKOUT_UNDO_BUDGETS
from .world import World

BASE_URL = "http://remote.sim.invalid"


class _Response:
    def __init__(self, status: int, text: str) -> None:
        self.status = status
        self._text = text
        self.headers: dict[str, str] = {}

    async def text(self) -> str:
        return self._text


class _Request:
    """The async context manager `session.post(...)` returns."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer

    async def __aenter__(self) -> _Response:
        return await self._answer()

    async def __aexit__(self, *exc: object) -> None:
        return None


class SimSession:
    """What HttpRemoteService needs of aiohttp.ClientSession."""

    def __init__(self, remote: Any) -> None:
        self.remote = remote

    def post(self, url: str, *, json: Any = None, headers: dict | None = None, timeout: Any = None):
        remote, sent = self.remote, dict(headers or {})

        # Defined here so that the fault surface finds `post` on the stack.
        async def answer() -> _Response:
            world = remote.world
            service, _, operation = urlsplit(url).path.strip("/").partition("/")
            call = RemoteCall(
                service,
                operation,
                sent[IDEMPOTENCY_KEY_HEADER],
                int(sent[FENCING_TOKEN_HEADER]),
                json if isinstance(json, dict) else {},
            )
            total = float(getattr(timeout, "total", None) or 10.0)
            slow = world.faults.slow_answer(f"{service}/{operation} {call.idempotency_key}")
            if slow == "lost":
                # The request never reached the service (a dropped connection, a
                # stalled proxy): nothing applied; the client gives up at its timeout.
                if remote.on_call is not None:
                    remote.on_call(call, total)
                await world.point(f"remote.{service}.{operation} no answer", delay=total)
                world.log(
                    f"remote {service}/{operation} {call.idempotency_key}: no answer in {total}s"
                )
                # No answer in time: a failure a breaker may count, when the
                # client sees it (a process paused across a host outage sees it
                # 8 days after the call began: seed 24000072).
                remote.failed(service)
                remote.told(call, None, total)
                raise TimeoutError()
            status, text = await remote.answer(call, timeout=total)
            response = _Response(status, text)
            if status == 429:
                response.headers["Retry-After"] = _retry_after_of(text)
            if slow == "applied":
                # The service did it; its answer comes after the client stopped waiting.
                await world.point(f"remote.{service}.{operation} slow", delay=total)
                world.log(
                    f"remote {service}/{operation} {call.idempotency_key}: answered {status} "
                    f"after the client's {total}s timeout"
                )
                remote.failed(service)  # as above, when the client gives up
                remote.told(call, None, total)
                raise TimeoutError()
            if remote.on_answer is not None:
                remote.on_answer(call, status)  # the answer the client reads
            remote.told(call, status, total, int(response.headers.get("Retry-After") or 0))
            return response

        return _Request(answer)

    async def close(self) -> None:
        return None


def _retry_after_of(text: str) -> str:
    """The Retry-After header of a rate limit's 429 (SimRemote._rate_limited),
    from its body (here, not in `post`, whose `json` parameter hides the module)."""
    return str(json.loads(text)["retryAfter"])


def http_remote(remote: Any):
    """The product's HttpRemoteService over the simulated remote services."""
    from agents.remote_client import HttpRemoteService

    return HttpRemoteService(SimSession(remote), BASE_URL)  # type: ignore[arg-type]


def status_ok(status: int) -> bool:
    return 200 <= status < 300


# What providers really send back as a reference now and then.
ODD_REFERENCES: tuple[Any, ...] = (
    "R" * 5000,
    "",
    "   ",
    "réf-ünïcødé-参照-🧾" * 20,
    "line\nbreak\x00nul\u202etrl",
    "4111 1111 1111 1111",
    12345678901234567890,
    {"nested": {"Reference": ["a", 1, None]}},
    None,
)


class SimRemote:
    """The remote services (the RemoteService port): the devstack ledger's
    idempotency and fencing, answers interpreted by the product's own HTTP
    client rules, and the seed's faults (outage, permanent decline)."""

    def __init__(
        self,
        world: World,
        declines: dict[str, tuple[tuple[str, ...], str]],
        steps: StepCatalog = DEFAULT_CATALOG,
    ) -> None:
        self.world = world
        self.ledger = Ledger(operations=operations(steps))
        self.declines = declines
        self.applied_declines = False  # Options.applied_declines
        # "service/operation" of every step's do and undo
        self.do_paths = frozenset(s.do.path.lstrip("/") for s in steps.steps)
        self.undo_paths = frozenset(s.undo.path.lstrip("/") for s in steps.steps)
        self.calls: list[tuple[str, str, int, str]] = []  # (key, op, token, outcome)
        # The simulation's checks: a call as it starts (with its timeout), and
        # the HTTP status of an answer the client reads (not one after its timeout).
        self.on_call: Callable[[RemoteCall, float | None], None] | None = None
        self.on_answer: Callable[[RemoteCall, int], None] | None = None
        # What the client saw of each call as it ends: the HTTP status (None:
        # no answer within its timeout), its timeout, a 429's Retry-After.
        self.on_outcome: Callable[[RemoteCall, int | None, float, int], None] | None = None
        self.undo_budget = 60.0  # seconds; the simulation sets its own (undo_budget)
        # Per service, when its next call may be served (FaultConfig.rate_limit).
        self.next_slot: dict[str, datetime] = {}
        # Per service, when it failed a call (a 5xx, no answer in time): what
        # a circuit breaker is for, unlike a 429 (sim.checks, breaker check).
        self.failures: dict[str, list[datetime]] = {}

    async def call(self, call: RemoteCall, *, timeout: float) -> dict[str, Any]:
        status, text = await self.answer(call, timeout=timeout)
        what = f"{call.service}/{call.operation} for {call.idempotency_key}"
        retry_after = float(json.loads(text)["retryAfter"]) if status == 429 else None
        return _interpret(what, status, text, retry_after, call.fencing_token)

    async def answer(self, call: RemoteCall, *, timeout: float) -> tuple[int, str]:
        """The service's HTTP answer (status, body text) to one call; what the
        product's HttpRemoteService reads through sim.remote.SimSession."""
        if self.on_call is not None:
            self.on_call(call, timeout)
        self._undo_blackout(call)
        await self.world.point(
            f"remote.{call.service}.{call.operation}", delay=self.world.rng.choice((0.05, 0.2, 1.0))
        )
        op = f"{call.service}/{call.operation}"
        paced = self._rate_limited(call)
        if paced is not None:
            self.calls.append((call.idempotency_key, op, call.fencing_token, "paced"))
            self.world.log(f"remote {op} {call.idempotency_key} -> 429 (retry after {paced} s)")
            return 429, json.dumps(
                {"code": "TooManyRequests", "error": "rate limit", "retryAfter": paced}
            )
        outage = self.world.faults.outage
        order_id = call.idempotency_key.partition("/")[0]
        down = (
            bool(outage)
            and outage[0] <= self.world.clock.now < outage[1]
            and outage[2] == call.service
        )
        # A partial outage: most calls fail outright; some are applied and
        # their answer is lost on the way back (a gateway timeout).
        lost = down and self.world.rng.random() < self.world.faults.outage_lost
        if down:
            self.world.faults.hit("outage_lost" if lost else "outage")  # the fault surface
        if down and not lost:
            status, text = 503, json.dumps({"code": "Unavailable", "error": "service unavailable"})
        elif op in self.declines.get(order_id, ((),))[0]:
            self.world.faults.hit("decline")
            if self.applied_declines and op in self.do_paths:
                # Applied, then refused (idempotent: a retry applies nothing more).
                self.ledger.apply(
                    call.service,
                    call.operation,
                    call.idempotency_key,
                    str(call.fencing_token),
                    call.body,
                )
            status, text = (
                402,
                json.dumps({"code": "Declined", "error": self.declines[order_id][1]}),
            )
        else:
            answer = self.ledger.apply(
                call.service,
                call.operation,
                call.idempotency_key,
                str(call.fencing_token),
                call.body,
            )
            body = answer.body
            if status_ok(answer.status) and self.world.faults.draw(
                self.world.faults.config.odd_answers, "odd_answer", call.idempotency_key
            ):
                body = {**body, "Reference": self.world.rng.choice(ODD_REFERENCES)}
            status, text = answer.status, json.dumps(body)
            if lost:
                status, text = (
                    504,
                    json.dumps({"code": "GatewayTimeout", "error": "no answer from upstream"}),
                )
        outcome = "ok" if status < 300 else "transient" if status >= 500 else "permanent"
        if status >= 500:
            self.failed(call.service)
        self.calls.append((call.idempotency_key, op, call.fencing_token, outcome))
        self.world.log(f"remote {op} {call.idempotency_key} token {call.fencing_token} -> {status}")
        return status, text

    def told(
        self, call: RemoteCall, status: int | None, timeout: float, retry_after: int = 0
    ) -> None:
        if self.on_outcome is not None:
            self.on_outcome(call, status, timeout, retry_after)

    def failed(self, service: str) -> None:
        self.failures.setdefault(service, []).append(self.world.clock.now)

    def _rate_limited(self, call: RemoteCall) -> int | None:
        """The service's rate limit (FaultConfig.rate_limit), while faults
        last: at most so many calls a second are served, one slot each; a call
        before its service's next free slot applies nothing and is told, in
        whole seconds (Retry-After), when that slot comes. None: served."""
        throttled = self.world.faults.throttled
        now = self.world.clock.now
        if (
            throttled is not None
            and self.world.faults.active
            and throttled[2] == call.service
            and throttled[0] <= now < throttled[1]
        ):
            # The provider throttles the whole tenant (FaultConfig.tenant_throttle).
            self.world.faults.hit("rate_limited")
            self.world.counters["tenant throttled"] += 1
            return self.world.rng.choice((1, 2))
        rate = self.world.faults.config.rate_limit
        if not rate or not self.world.faults.active:
            return None
        free = self.next_slot.get(call.service, now)
        if now < free:
            self.world.faults.hit("rate_limited")
            self.world.counters["rate_limited"] += 1
            return max(1, math.ceil((free - now).total_seconds()))
        self.next_slot[call.service] = now + timedelta(seconds=1 / rate)
        return None

    def _undo_blackout(self, call: RemoteCall) -> None:
        """The schedule's first undo call starts its undo blackout
        (FaultConfig.undo_blackout): an outage of that service longer than the
        whole undo budget, every call in it applied and its answer lost."""
        faults = self.world.faults
        if (
            not faults.config.undo_blackout
            or faults.outage is not None
            or call.operation not in ("release", "refund", "cancel")
            or not faults.draw(1.0, "undo_blackout", call.service)
        ):
            return
        length = self.world.data_rng.uniform(*BLACKOUT_UNDO_BUDGETS) * self.undo_budget
        now = self.world.clock.now
        faults.outage = (now, now + timedelta(seconds=length), call.service)
        faults.outage_lost = 1.0
        self.world.log(f"undo blackout of {call.service} for {length:.0f} s")


def random_text(rng: random.Random) -> str:
    length = rng.choice((0, 10, 200, 230, 600, 4096))
    if length == 0:
        return ""
    alphabets = [
        (0x20, 0x7E),
        (0xA0, 0x2FF),
        (0x3040, 0x30FF),
        (0x1F300, 0x1F64F),
        (0x4E00, 0x9FFF),
    ]
    out = []
    for _ in range(length):
        lo, hi = rng.choice(alphabets)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)
