"""Where the Supervisor keeps its scan position between runs: one document
`_checkpoint-<name>` in the state container, invisible to state queries.
Last writer wins: two supervisors racing here at worst re-scan a page."""

from __future__ import annotations

from azure.cosmos.aio import ContainerProxy

from adapters.cosmos_client import SDK_ERRORS, RequestCharges, translate_error
from domain.errors import NotFoundError


class CosmosCheckpointStore:
    def __init__(
        self, container: ContainerProxy, charges: RequestCharges, name: str = "supervisor"
    ) -> None:
        self._container = container
        self._charges = charges
        self._id = f"_checkpoint-{name}"

    async def load(self) -> str | None:
        try:
            doc = await self._container.read_item(
                self._id,
                partition_key=self._id,
                response_hook=self._charges.hook("checkpoint_read"),
            )
        except SDK_ERRORS as exc:
            error = translate_error(exc, "read checkpoint", self._charges, "checkpoint_read")
            if isinstance(error, NotFoundError):
                return None
            raise error from exc
        return doc.get("Cursor")

    async def save(self, cursor: str | None) -> None:
        body = {"id": self._id, "Cursor": cursor}
        try:
            await self._container.upsert_item(
                body, response_hook=self._charges.hook("checkpoint_write")
            )
        except SDK_ERRORS as exc:
            raise translate_error(
                exc, "save checkpoint", self._charges, "checkpoint_write"
            ) from exc
