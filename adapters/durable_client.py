"""The Durable client at its edge: azure-functions-durable 1.x tells that an
instance does not exist, or has finished, only by the text of a bare
Exception; that text is read here, once, and turned into InstanceGone."""

from __future__ import annotations

from typing import Any

from domain.errors import InstanceGone

# What the SDK's messages say of an instance that is not there or finished.
GONE_MARKERS = ("is gone", "No instance with ID")


async def raise_event(client: Any, instance_id: str, event_name: str, data: Any) -> None:
    """`client.raise_event`; InstanceGone if the instance is not there or has
    finished (a late event), every other failure as the SDK raised it."""
    try:
        await client.raise_event(instance_id, event_name, data)
    except Exception as exc:  # the durable client raises bare Exception with a message
        if any(marker in str(exc) for marker in GONE_MARKERS):
            raise InstanceGone(str(exc)) from exc
        raise
