"""The smoke application's remote service: a built-in no-op, so a smoke order
(domain.ids.SMOKE_APP_ID) goes through every part of the system but makes no
reservation, charge or shipment (docs/deploying.md, "The smoke test")."""

from __future__ import annotations

from typing import Any

from agents.ports import RemoteCall

SMOKE_REFERENCE_PREFIX = "smoke-no-op"


class NoOpRemoteService:
    """Answers every call at once, as the remote service answers a success,
    with a Reference that says it came from here."""

    async def call(self, call: RemoteCall, *, timeout: float) -> dict[str, Any]:  # noqa: ARG002
        return {
            "Reference": f"{SMOKE_REFERENCE_PREFIX}-{call.service}-{call.operation}",
            "Status": "smoke-no-op",
            "OrderID": call.body.get("OrderID"),
            "Step": call.body.get("Step"),
            "Operation": f"{call.service}/{call.operation}",
            "FencingToken": call.fencing_token,
        }
