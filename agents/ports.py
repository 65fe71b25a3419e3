"""The Agent's door to the remote service: a protocol the runners fill with
agents.remote_client.HttpRemoteService and unit tests with fakes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class RemoteCall:
    """One request to the remote service.

    Attributes:
        service, operation: `POST /{service}/{operation}`.
        idempotency_key: stable across retries and attempts (`{OrderID}/{step}`):
            the service applies one side effect per key and operation.
        fencing_token: the attempt number; the service refuses a token lower
            than one it has seen for the order.
        body: the JSON body.
    """

    service: str
    operation: str
    idempotency_key: str
    fencing_token: int
    body: dict[str, Any] = field(default_factory=dict)


class RemoteService(Protocol):
    async def call(self, call: RemoteCall, *, timeout: float) -> dict[str, Any]:
        """Make the call; return the JSON result.

        Raises:
            TransientError: worth retrying with the same key (5xx, 429, timeout,
                connection lost: the side effect may or may not have happened).
            PermanentError: retrying cannot help (4xx, fencing rejection).
        """
        ...
