"""`context.call_http`: the extension's built-in HTTP activity (`BuiltIn::HttpActivity`).

The orchestrator's `CallHttp` action is scheduled as that activity; it sends the request
and completes with the extension's `DurableHttpResponse` JSON (`statusCode`, `headers`
written by its HttpHeadersConverter: one value as a string, several as a list,
`content`). The Python SDK (1.x) sends no `asynchronousPatternEnabled`, and the
extension only follows `202 Accepted` + `Location` when the SDK asks for it
(azure-functions-durable-python#380), so a 202 is the call's result here too: the
orchestrator polls itself if it wants to.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

TIMEOUT_SECONDS = (
    300  # our cap on one request; the request's own `timeout` is not sent by the Python SDK
)


async def run_http_activity(request_json: str | None) -> str:
    """Send the request the orchestrator described; return the DurableHttpResponse JSON."""
    request: dict[str, Any] = json.loads(request_json or "{}")
    if request.get("tokenSource"):
        raise RuntimeError(
            "call_http with a token_source (managed identity) is not supported by devstack.host: "
            "it needs Entra ID; pass an Authorization header instead"
        )
    method = str(request.get("method") or "GET").upper()
    uri = request.get("uri")
    if not uri:
        raise ValueError("call_http: the request has no uri")
    headers = {str(k): str(v) for k, v in (request.get("headers") or {}).items()}
    content = request.get("content")
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.request(
            method,
            uri,
            headers=headers,
            data=content.encode() if isinstance(content, str) else None,
            allow_redirects=False,
        ) as response,
    ):
        body = await response.text()
        out_headers: dict[str, Any] = {}
        for name in response.headers:
            values = response.headers.getall(name)
            out_headers[name] = values[0] if len(values) == 1 else list(values)
        return json.dumps({"statusCode": response.status, "headers": out_headers, "content": body})
