"""Durable entities (function-based, as the Python SDK offers them).

An entity is addressed by its scheduler id `@name@key` (name lower-cased, as the SDK's
`EntityId.get_scheduler_id` writes it). Operations wait in the hub's `entity_ops` queue
in arrival order: signals from clients (`POST .../entities/{name}/{key}?op=`) and calls
and signals from orchestrations (committed with the orchestration's episode). A
dispatcher claims an entity, runs its queued operations as one batch through the
function the app registered (the SDK's `Entity.create` handle, given the batch JSON the
extension sends), and in one transaction stores the new state, removes the operations
and sends each call's response to its orchestration as the `EventRaised` the SDK waits
for (named by the request id recorded in the caller's `EventSent`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC
from typing import Any

from .app import ENTITY_TRIGGER, AppCatalog, FunctionSpec
from .clock import ENTITIES, ORCHESTRATIONS, Clock
from .invoke import call_function
from .store import Store

log = logging.getLogger("devstack.host.entities")

EVENT_RAISED = 15
BATCH_SIZE = 50


def scheduler_id(name: str, key: str) -> str:
    return f"@{name.lower()}@{key}"


def split_scheduler_id(entity_id: str) -> tuple[str, str]:
    _, name, key = entity_id.split("@", 2)
    return name, key


def entity_name(spec: FunctionSpec) -> str:
    return str(spec.trigger.get("entityName") or spec.name).lower()


def operation_input(input_json: str | None) -> str:
    """The batch item's `input`: the JSON of the input token the extension holds. The SDK
    decodes it twice (`get_input`), because that token is itself the JSON text the SDK wrote:
    an orchestration's action input is already JSON, and the client posts its input
    JSON-encoded a second time."""
    return input_json if input_json is not None else "null"


class EntityEngine:
    def __init__(
        self, store: Store, catalog: AppCatalog, clock: Clock, max_concurrent: int
    ) -> None:
        self.store = store
        self.clock = clock
        self.max_concurrent = max_concurrent
        self.functions = {entity_name(f): f for f in catalog.of_type(ENTITY_TRIGGER)}
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False

    def stop(self) -> None:
        self._stopping = True

    @property
    def tasks(self) -> set[asyncio.Task[None]]:
        return self._tasks

    async def run(self) -> None:
        while not self._stopping:
            free = self.max_concurrent - len(self._busy)
            claimed = self.store.claim_entities(free, self._busy)
            for eid in claimed:
                self._busy.add(eid)
                task = asyncio.create_task(self._run_batch(eid))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if claimed:
                await asyncio.sleep(0)
            else:
                # An app without entity functions gets operations only from its own
                # orchestrations' calls (answered "doesn't exist"), whose writes poke this loop:
                # its poll of the hub is a fallback, not the way work arrives.
                idle = 0.1 if self.functions else 1.0
                await self.clock.wait(None, max_wait=idle, topic=ENTITIES)

    async def _run_batch(self, entity_id: str) -> None:
        try:
            await self._batch(entity_id)
        except Exception:
            log.exception("entity %s: batch failed inside the host; retrying", entity_id)
            self.store.unlock_entity(entity_id)
            await asyncio.sleep(1)
        finally:
            self._busy.discard(entity_id)
            self.clock.poke(ENTITIES, ORCHESTRATIONS)  # more operations; callers' responses

    async def _batch(self, entity_id: str) -> None:
        exists, state, ops = self.store.entity_batch(entity_id, BATCH_SIZE)
        if not ops:
            self.store.unlock_entity(entity_id)
            return
        name, key = split_scheduler_id(entity_id)
        spec = self.functions.get(name)
        now_iso = self.clock.now().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if spec is None:
            error = (
                f"The function '{name}' doesn't exist, is disabled, or is not an entity function. "
                f"Additional info: the app's entity functions are: {', '.join(sorted(self.functions))}"
            )
            log.error("entity %s: %s", entity_id, error)
            responses = [
                self._response(op, json.dumps(error), True) for op in ops if op["request_id"]
            ]
            self.store.commit_entity_batch(
                entity_id,
                exists=exists,
                state=state,
                consumed=[op["id"] for op in ops],
                responses=[r for r in responses if r],
                now_iso=now_iso,
            )
            return
        context = {
            "self": {"name": name, "key": key},
            "state": state,
            "exists": exists,
            "batch": [
                {
                    "name": op["operation"],
                    "input": operation_input(op["input"]),
                    "signal": not op["request_id"],
                }
                for op in ops
            ],
        }
        raw = await call_function(spec, {spec.trigger["name"]: json.dumps(context)})
        result = json.loads(raw)
        if result.get("signals"):
            log.error("entity %s sent signals, which devstack.host does not deliver", entity_id)
        responses = []
        for op, outcome in zip(ops, result["results"], strict=True):
            if op["request_id"]:
                responses.append(self._response(op, outcome["result"], bool(outcome["isError"])))
            if outcome["isError"]:
                log.warning(
                    "entity %s operation %s failed: %s",
                    entity_id,
                    op["operation"],
                    outcome["result"],
                )
        ok = self.store.commit_entity_batch(
            entity_id,
            exists=bool(result["entityExists"]),
            state=result.get("entityState"),
            consumed=[op["id"] for op in ops],
            responses=responses,
            now_iso=now_iso,
        )
        if not ok:
            log.warning("entity %s: lost its lock; the batch will run again", entity_id)

    def _response(
        self, op: Any, result_json: str | None, is_error: bool
    ) -> tuple[str, str | None, dict[str, Any]]:
        """The EventRaised a calling orchestration's SDK turns into the call's result or exception."""
        message: dict[str, Any] = {"result": result_json}
        if is_error:
            message["exceptionType"] = "System.Exception"
        event = {
            "EventType": EVENT_RAISED,
            "EventId": -1,
            "IsPlayed": False,
            "Timestamp": self.clock.now().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "Name": op["request_id"],
            "Input": json.dumps(message),
        }
        return (op["reply_instance"], op["reply_execution"], event)
