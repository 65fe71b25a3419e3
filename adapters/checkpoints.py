"""Where the Supervisor keeps its scan position between runs: one small
document in the state container (`_checkpoint-<name>`, an id no OrderID can
take, with no ProcessState so no state query returns it). Last writer wins:
the timer trigger is a singleton, and two supervisors that race here at worst
re-scan a page, which the conditional recovery makes harmless."""

from __future__ import annotations

from datetime import datetime

from azure.cosmos.aio import ContainerProxy

from adapters.cosmos_client import SDK_ERRORS, RequestCharges, translate_error
from domain.errors import NotFoundError
from supervisor.supervisor import Checkpoint


class CosmosCheckpointStore:
    def __init__(self, container: ContainerProxy, charges: RequestCharges, name: str = "supervisor") -> None:
        self._container = container
        self._charges = charges
        self._id = f"_checkpoint-{name}"

    async def load(self) -> Checkpoint | None:
        try:
            doc = await self._container.read_item(
                self._id, partition_key=self._id, response_hook=self._charges.hook("checkpoint_read")
            )
        except SDK_ERRORS as exc:
            error = translate_error(exc, "read checkpoint", self._charges, "checkpoint_read")
            if isinstance(error, NotFoundError):
                return None
            raise error from exc
        if not doc.get("Upper"):
            return None
        return Checkpoint(
            upper=datetime.fromisoformat(doc["Upper"]),
            window_start=datetime.fromisoformat(doc["WindowStart"]),
            continuation=doc.get("Continuation"),
        )

    async def save(self, checkpoint: Checkpoint | None) -> None:
        body = {"id": self._id, "Upper": None, "WindowStart": None, "Continuation": None}
        if checkpoint is not None:
            body.update(
                Upper=checkpoint.upper.isoformat(),
                WindowStart=checkpoint.window_start.isoformat(),
                Continuation=checkpoint.continuation,
            )
        try:
            await self._container.upsert_item(body, response_hook=self._charges.hook("checkpoint_write"))
        except SDK_ERRORS as exc:
            raise translate_error(exc, "save checkpoint", self._charges, "checkpoint_write") from exc
