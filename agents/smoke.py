"""The smoke application's remote service: a built-in no-op.

An order of the smoke application (domain.ids.SMOKE_APP_ID, sent by
deploy/smoke.py after a deploy) goes through every part of the system a real
order does, except the remote service: the Agent answers each of its steps
from `NoOpRemoteService`, which makes no network call, so no reservation,
charge or shipment is ever made for it (docs/deploying.md, "The smoke test")."""

from __future__ import annotations

from typing import Any

from agents.ports import RemoteCall

SMOKE_REFERENCE_PREFIX = "smoke-no-op"


class NoOpRemoteService:
    """Answers every call at once, as the remote service answers a success,
    with a Reference that says it came from here; counts the calls it took."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, call: RemoteCall, *, timeout: float) -> dict[str, Any]:  # noqa: ARG002
        self.calls += 1
        return {
            "Reference": f"{SMOKE_REFERENCE_PREFIX}-{call.service}-{call.operation}",
            "Status": "smoke-no-op",
            "OrderID": call.body.get("OrderID"),
            "Step": call.body.get("Step"),
            "Operation": f"{call.service}/{call.operation}",
            "FencingToken": call.fencing_token,
        }
