"""The aiohttp application of the remote service.

Business calls: `POST /{service}/{operation}`, the operations of the step
catalog it was started with (domain/steps.json unless told otherwise).

Admin API (for tests and demos):

- `POST /_admin/faults` a rule object or `{"rules": [...]}` (faults.FaultRule)
  -> 201 `{"ids": [...]}`; 400 with the reason for a bad rule.
- `GET /_admin/faults` the active rules; `DELETE /_admin/faults[/{id}]`.
- `GET /_admin/side-effects[?order_id=]` applied effects per (order, step,
  operation), the `duplicates` (count > 1: must stay empty), totals.
- `GET /_admin/requests[?order_id=]` business calls received (including
  refused and faulted ones), to check that an agent did *not* call, and
  `in_flight`: calls being handled right now (all of them, any order).
- `POST /_admin/reset` forget everything (ledger and faults).
- `GET /_admin/health`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from devstack.remote_service.faults import FaultBook, FaultRule
from devstack.remote_service.ledger import Ledger, operations
from domain.steps import DEFAULT_CATALOG, StepCatalog

log = logging.getLogger("remote_service")

EXIT_CODE_CRASH = 75


@dataclass
class ServiceState:
    ledger: Ledger
    faults: FaultBook
    state_file: Path | None
    exit: Callable[[int], Any]
    in_flight: int = 0  # business calls being handled now (e.g. sleeping on a latency rule)

    def persist(self) -> None:
        if self.state_file is not None:
            self.ledger.save(self.state_file)


STATE = web.AppKey("state", ServiceState)


def create_app(
    state_file: Path | None = None,
    seed: int | None = None,
    exit: Callable[[int], Any] = os._exit,
    steps: StepCatalog = DEFAULT_CATALOG,
) -> web.Application:
    """Build the app; with `state_file` the ledger is loaded from it and
    written back after every change. `exit` is what a `crash` rule in mode
    `exit` calls (the real process exit, unless a test passes its own).
    `steps`: the catalog whose operations it serves."""
    app = web.Application()
    served = operations(steps)
    ledger = Ledger.load(state_file, served) if state_file else Ledger(operations=served)
    app[STATE] = ServiceState(ledger, FaultBook(rng=random.Random(seed)), state_file, exit)
    app.router.add_get("/_admin/health", _health)
    app.router.add_post("/_admin/faults", _add_faults)
    app.router.add_get("/_admin/faults", _list_faults)
    app.router.add_delete("/_admin/faults", _clear_faults)
    app.router.add_delete("/_admin/faults/{rule_id:\\d+}", _delete_fault)
    app.router.add_get("/_admin/side-effects", _side_effects)
    app.router.add_get("/_admin/requests", _requests)
    app.router.add_post("/_admin/reset", _reset)
    app.router.add_post("/{service:[a-z]+}/{operation:[a-z]+}", _operation)
    return app


async def _operation(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    state.in_flight += 1
    try:
        return await _apply(request, state)
    finally:
        state.in_flight -= 1


async def _apply(request: web.Request, state: ServiceState) -> web.StreamResponse:
    service = request.match_info["service"]
    operation = request.match_info["operation"]
    key = request.headers.get("Idempotency-Key")
    order_id = key.partition("/")[0] if key else None

    state.ledger.count_request(service, operation, key)
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    plan = state.faults.plan(service, operation, order_id)
    if plan.delay:
        # The handler is not cancelled when the client gives up (aiohttp's
        # default, kept by __main__): like a slow real service, the effect is
        # applied after the caller timed out.
        await asyncio.sleep(plan.delay)
    if plan.failure is not None:
        headers = {}
        if plan.failure.retry_after is not None:
            headers["Retry-After"] = f"{plan.failure.retry_after:g}"
        return web.json_response(plan.failure.body, status=plan.failure.status, headers=headers)

    # From here to the answer nothing is awaited: check-and-apply is atomic.
    answer = state.ledger.apply(service, operation, key, request.headers.get("Fencing-Token"), body)
    state.persist()
    log.info(
        "%s %s/%s key=%s token=%s -> %s%s",
        "applied" if answer.applied else "answered",
        service,
        operation,
        key,
        request.headers.get("Fencing-Token"),
        answer.status,
        " (replay)" if answer.replayed else "",
    )
    if answer.applied:
        mode = state.faults.crashed(plan)
        if mode == "exit":
            log.warning("crash rule: exiting after applying %s/%s for %s", service, operation, key)
            state.exit(EXIT_CODE_CRASH)
        if mode == "drop":
            # Close the connection without a byte of answer: the caller sees a
            # disconnect and cannot know whether the effect happened.
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError()
        if mode == "error":
            return web.json_response(
                {"code": "Crashed", "error": "internal error after applying the operation"},
                status=500,
            )
    headers = {"Idempotent-Replayed": "true"} if answer.replayed else {}
    return web.json_response(answer.body, status=answer.status, headers=headers)


async def _health(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _add_faults(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        data = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _bad("the body must be JSON")
    raw_rules = data.get("rules") if isinstance(data, dict) and "rules" in data else [data]
    if not isinstance(raw_rules, list) or not raw_rules:
        return _bad('send a rule object or {"rules": [rule, ...]}')
    try:
        context = {"operations": state.ledger.operations}
        rules = [FaultRule.model_validate(raw, context=context) for raw in raw_rules]
    except ValidationError as exc:
        reasons = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(rule)'}: {err['msg']}"
            for err in exc.errors()
        )
        return _bad(f"invalid fault rule: {reasons}")
    ids = [state.faults.add(rule).id for rule in rules]
    return web.json_response({"ids": ids}, status=201)


async def _list_faults(request: web.Request) -> web.Response:
    return web.json_response({"rules": request.app[STATE].faults.describe()})


async def _clear_faults(request: web.Request) -> web.Response:
    request.app[STATE].faults.clear()
    return web.json_response({"rules": []})


async def _delete_fault(request: web.Request) -> web.Response:
    if not request.app[STATE].faults.remove(int(request.match_info["rule_id"])):
        return web.json_response({"error": "no such rule"}, status=404)
    return web.json_response({"deleted": int(request.match_info["rule_id"])})


async def _side_effects(request: web.Request) -> web.Response:
    order_id = request.query.get("order_id")
    return web.json_response(request.app[STATE].ledger.side_effects(order_id))


async def _requests(request: web.Request) -> web.Response:
    state = request.app[STATE]
    counts = state.ledger.request_counts(request.query.get("order_id"))
    return web.json_response({**counts, "in_flight": state.in_flight})


async def _reset(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.ledger = Ledger(operations=state.ledger.operations)
    state.faults.clear()
    state.persist()
    return web.json_response({"status": "reset"})


def _bad(reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=400)
