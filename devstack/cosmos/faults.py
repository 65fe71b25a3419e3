"""Fault injection on the local Cosmos DB server ("throttle the store").

The launcher answers requests matching a rule with the rule's status instead
of serving them, with the headers the service sends (x-ms-retry-after-ms,
x-ms-substatus). Rules are scoped by database/container so concurrent tests
using other databases are not affected. Only the dev-stack server has this;
never point these helpers at a real account."""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

CONTROL_PATH = "/_devstack/faults"


@dataclass(frozen=True)
class FaultRule:
    """Answer matching requests with `status`.

    Attributes:
        status: HTTP status to return (429 throttled, 503 unavailable, 408 timeout).
        db: only requests for this database (None: any).
        coll: only requests for this container (None: any).
        docs_only: only item operations and queries (not container metadata).
        method: only this HTTP method (GET reads, POST creates/queries, PUT replaces).
        retry_after_ms: value of x-ms-retry-after-ms, if any.
        fraction: probability that a matching request fails (1.0: all).
        count: fire this many times, then stop (None: no limit).
    """

    status: int = 429
    db: str | None = None
    coll: str | None = None
    docs_only: bool = True
    method: str | None = None
    retry_after_ms: int | None = 100
    fraction: float | None = None
    count: int | None = None

    def to_json(self) -> dict[str, Any]:
        raw = asdict(self)
        names = {"docs_only": "docsOnly", "retry_after_ms": "retryAfterMs"}
        return {names.get(k, k): v for k, v in raw.items() if v is not None}


def _request(endpoint: str, method: str, body: Any = None) -> dict[str, Any]:
    parts = urlsplit(endpoint)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"fault injection is for the local server only, not {parts.hostname}")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the dev server's certificate is self-signed
    connection = http.client.HTTPSConnection(
        parts.hostname, parts.port, context=context, timeout=10
    )
    try:
        payload = None if body is None else json.dumps(body)
        connection.request(
            method, CONTROL_PATH, body=payload, headers={"content-type": "application/json"}
        )
        response = connection.getresponse()
        data = json.loads(response.read() or b"{}")
        if response.status != 200:
            raise RuntimeError(f"fault control answered {response.status}: {data}")
        return data
    finally:
        connection.close()


def set_faults(endpoint: str, *rules: FaultRule) -> None:
    """Replace the server's fault rules."""
    _request(endpoint, "PUT", [rule.to_json() for rule in rules])


def clear_faults(endpoint: str) -> None:
    _request(endpoint, "DELETE")


def get_faults(endpoint: str) -> list[dict[str, Any]]:
    """The rules in force, each with `fired`: how many requests it failed."""
    return _request(endpoint, "GET")["rules"]
