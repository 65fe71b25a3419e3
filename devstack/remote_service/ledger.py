"""What the remote systems remember: applied side effects, stored answers per
idempotency key, the highest fencing token per order. Pure and synchronous:
the HTTP layer calls `apply` without awaiting in between, so on one event loop
the check-then-apply of a key cannot interleave with another request's."""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from domain.steps import DEFAULT_CATALOG, StepCatalog

Operations = dict[str, dict[str, str | None]]
"""service -> operation -> the operation it undoes (None for a forward one):
what the service serves, from the step catalog."""


def operations(catalog: StepCatalog) -> Operations:
    """What a remote service serving `catalog`'s steps serves."""
    served: Operations = {}
    for step in catalog.steps:
        ops = served.setdefault(step.service, {})
        ops[step.do_operation] = None
        ops[step.undo_operation] = step.do_operation
    return served


CATALOG: Operations = operations(DEFAULT_CATALOG)
"""The shipped step catalog's operations; a service started with another
catalog (--catalog, STEP_CATALOG_FILE) serves that one's."""


def done_status(operation: str) -> str:
    """What an applied operation answers as its Status: reserve -> reserved,
    charge -> charged, cancel -> cancelled, refund -> refunded."""
    if operation.endswith("e"):
        return f"{operation}d"
    if operation.endswith("l"):
        return f"{operation}led"
    return f"{operation}ed"


STATE_VERSION = 1


@dataclass
class Answer:
    """What the service answers; `applied` is True when this request made a
    new side effect (not a replay, not a refusal)."""

    status: int
    body: dict[str, Any]
    applied: bool = False
    replayed: bool = False


def _error(status: int, code: str, message: str, **extra: Any) -> Answer:
    return Answer(status, {"code": code, "error": message, **extra})


@dataclass
class Ledger:
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    fences: dict[str, int] = field(default_factory=dict)
    effects: Counter[str] = field(default_factory=Counter)
    requests: Counter[str] = field(default_factory=Counter)
    replays: int = 0
    sequence: int = 0
    operations: Operations = field(default_factory=lambda: CATALOG)

    # --- the business operation ---------------------------------------------------

    def apply(
        self, service: str, operation: str, key: str | None, token_text: str | None, body: Any
    ) -> Answer:
        """Validate, fence, de-duplicate, then apply one operation."""
        catalog = self.operations
        if service not in catalog or operation not in catalog[service]:
            return _error(404, "UnknownOperation", f"no operation {service}/{operation}")
        if not key:
            return _error(400, "MissingIdempotencyKey", "header Idempotency-Key is required")
        order_id, sep, step = key.partition("/")
        if not sep or not order_id or not step or "|" in key:
            return _error(
                400, "BadIdempotencyKey", f"Idempotency-Key {key!r} must be '{{OrderID}}/{{step}}'"
            )
        if not token_text or not token_text.isdigit() or int(token_text) < 1:
            return _error(
                400, "BadFencingToken", "header Fencing-Token must be a whole number >= 1"
            )
        if not isinstance(body, dict):
            return _error(400, "BadBody", "the body must be a JSON object")
        token = int(token_text)
        op = f"{service}/{operation}"

        highest = self.fences.get(order_id, 0)
        if token < highest:
            return _error(
                409,
                "FencingTokenRejected",
                f"fencing token {token} is lower than {highest}, already seen for order "
                f"{order_id}: a newer attempt owns this order",
                order_id=order_id,
                token=token,
                highest=highest,
            )
        self.fences[order_id] = token

        stored = self.results.get(_join(key, op))
        if stored is not None:
            self.replays += 1
            return Answer(stored["status"], stored["body"], replayed=True)

        undoes = catalog[service][operation]
        if undoes is None:
            undo_ops = [o for o, target in catalog[service].items() if target == operation]
            if any(_join(key, f"{service}/{u}") in self.results for u in undo_ops):
                # A late forward call after its compensation: refuse rather
                # than leave an effect nobody will undo.
                return _error(
                    409,
                    "AlreadyCompensated",
                    f"{op} for {key} was already compensated; refusing to apply it now",
                )
            answer = self._record_effect(order_id, step, op, operation, token)
        elif self.effects.get(_join(order_id, step, f"{service}/{undoes}"), 0) > 0:
            answer = self._record_effect(order_id, step, op, operation, token)
        else:
            # Undoing what never happened succeeds and changes nothing, so a
            # compensation log can be replayed blindly.
            answer = Answer(
                200,
                {"Status": "nothing-to-undo", "OrderID": order_id, "Step": step, "Operation": op},
            )
        self.results[_join(key, op)] = {"status": answer.status, "body": answer.body}
        return answer

    def _record_effect(
        self, order_id: str, step: str, op: str, operation: str, token: int
    ) -> Answer:
        self.sequence += 1
        self.effects[_join(order_id, step, op)] += 1
        body = {
            "Reference": f"{op.replace('/', '-')}-{self.sequence:06d}",
            "Status": done_status(operation),
            "OrderID": order_id,
            "Step": step,
            "Operation": op,
            "FencingToken": token,
        }
        return Answer(200, body, applied=True)

    def count_request(self, service: str, operation: str, key: str | None) -> None:
        """Count a business call as it arrives, before faults or checks, so a
        test can tell "the agent did not call" from "the call failed"."""
        if service in self.operations and operation in self.operations[service]:
            order_id = (key or "").partition("/")[0] or "(none)"
            self.requests[_join(service, operation, order_id.replace("|", "_"))] += 1

    # --- views for the admin API -------------------------------------------------

    def side_effects(self, order_id: str | None = None) -> dict[str, Any]:
        rows = []
        for joined, count in sorted(self.effects.items()):
            order, step, op = joined.split("|")
            if order_id is None or order == order_id:
                rows.append({"order_id": order, "step": step, "operation": op, "count": count})
        return {
            "effects": rows,
            "duplicates": [row for row in rows if row["count"] > 1],
            "total": sum(row["count"] for row in rows),
            "replays": self.replays,
        }

    def request_counts(self, order_id: str | None = None) -> dict[str, Any]:
        rows = []
        for joined, count in sorted(self.requests.items()):
            service, operation, order = joined.split("|")
            if order_id is None or order == order_id:
                rows.append(
                    {"service": service, "operation": operation, "order_id": order, "count": count}
                )
        return {"requests": rows, "total": sum(row["count"] for row in rows)}

    # --- persistence ---------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "results": self.results,
            "fences": self.fences,
            "effects": dict(self.effects),
            "requests": dict(self.requests),
            "replays": self.replays,
            "sequence": self.sequence,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], operations: Operations | None = None) -> Ledger:
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"state file version {data.get('version')!r} is not {STATE_VERSION}")
        return cls(
            operations=operations or CATALOG,
            results=dict(data["results"]),
            fences={k: int(v) for k, v in data["fences"].items()},
            effects=Counter({k: int(v) for k, v in data["effects"].items()}),
            requests=Counter({k: int(v) for k, v in data["requests"].items()}),
            replays=int(data["replays"]),
            sequence=int(data["sequence"]),
        )

    def save(self, path: Path) -> None:
        """Write atomically and durably: a kill at any moment leaves either the
        old or the new state, never half of one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(self.to_json(), out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path, operations: Operations | None = None) -> Ledger:
        if not path.exists():
            return cls(operations=operations or CATALOG)
        return cls.from_json(json.loads(path.read_text()), operations)


def _join(*parts: str) -> str:
    return "|".join(parts)
