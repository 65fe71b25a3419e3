"""HTTP adapter for the remote service: HTTP outcomes become the domain's error
vocabulary here (TransientError, PermanentError, FencingRejected), so the Agent
decides on meaning and never looks at a status code. The mapping and why a
fencing rejection is permanent: docs/adr/011-agent-retry-budget.md."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from adapters import telemetry
from agents.ports import RemoteCall
from domain.errors import PermanentError, TransientError

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
FENCING_TOKEN_HEADER = "Fencing-Token"
FENCING_REJECTED_CODE = "FencingTokenRejected"

_TRANSIENT_4XX = {408, 429}
_MAX_ERROR_TEXT = 300


class FencingRejected(PermanentError):
    """The remote service has seen a higher fencing token for this order: a
    newer attempt owns the work, so this one must stop (the service's reason
    names the highest token it has seen)."""


class HttpRemoteService:
    """The RemoteService port over aiohttp: a call goes to
    `{base URL}/{service}/{operation}`, the base URL being the service's own
    in `service_urls` where it has one. It does not retry: the Agent owns the
    one retry loop (ADR 011). The session is the runner's, one per process."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        service_urls: Mapping[str, str] | None = None,
    ) -> None:
        self._session = session
        self._base_url = base_url.rstrip("/")
        self._service_urls = {s: u.rstrip("/") for s, u in (service_urls or {}).items()}

    def base_url(self, service: str) -> str:
        return self._service_urls.get(service, self._base_url)

    async def call(self, call: RemoteCall, *, timeout: float) -> dict[str, Any]:
        url = f"{self.base_url(call.service)}/{call.service}/{call.operation}"
        headers = {
            IDEMPOTENCY_KEY_HEADER: call.idempotency_key,
            FENCING_TOKEN_HEADER: str(call.fencing_token),
        }
        what = f"{call.service}/{call.operation} for {call.idempotency_key}"
        order_id = call.body.get("OrderID") if isinstance(call.body, dict) else None
        with telemetry.span(
            f"POST {call.service}/{call.operation}",
            telemetry.SpanKind.CLIENT,
            **{
                "http.request.method": "POST",
                "url.full": url,
                "idempotency.key": call.idempotency_key,
                "fencing.token": call.fencing_token,
                telemetry.ORDER_ID: order_id,
            },
        ):
            headers.update(telemetry.inject())
            try:
                return await self._call(url, call, headers, what, timeout)
            except (TransientError, PermanentError) as exc:
                telemetry.failed(str(exc))
                raise

    async def _call(
        self, url: str, call: RemoteCall, headers: dict[str, str], what: str, timeout: float
    ) -> dict[str, Any]:
        try:
            async with self._session.post(
                url,
                json=call.body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=max(timeout, 0.001)),
            ) as response:
                text = await response.text()
                status = response.status
                retry_after = _retry_after(response.headers.get("Retry-After"))
                telemetry.annotate(**{"http.response.status_code": status})
        except TimeoutError:
            # The request may have reached the service; the next try carries
            # the same idempotency key, so it cannot apply the effect twice.
            raise TransientError(
                f"{what}: no answer within {timeout:.3g}s", no_answer_within=timeout
            ) from None
        except aiohttp.ClientError as exc:
            raise TransientError(f"{what}: {type(exc).__name__}: {exc}") from exc
        return _interpret(what, status, text, retry_after, call.fencing_token)


def _interpret(
    what: str, status: int, text: str, retry_after: float | None, token: int
) -> dict[str, Any]:
    body = _json_or_none(text)
    if 200 <= status < 300:
        if not isinstance(body, dict):
            # The effect may have been applied: ask again with the same key.
            raise TransientError(f"{what}: HTTP {status} with a body that is not a JSON object")
        return body
    reason = _reason(body, text)
    if status >= 500 or status in _TRANSIENT_4XX:
        # A 429 paces us: the service is up, so no breaker counts it.
        raise TransientError(
            f"{what}: HTTP {status}: {reason}", retry_after=retry_after, pacing=status == 429
        )
    if status == 409 and isinstance(body, dict) and body.get("code") == FENCING_REJECTED_CODE:
        raise FencingRejected(f"{what}: fencing token {token} rejected: {reason}")
    raise PermanentError(f"{what}: HTTP {status}: {reason}")


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _reason(body: Any, text: str) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"][:_MAX_ERROR_TEXT]
    return (text.strip() or "(no body)")[:_MAX_ERROR_TEXT]


def _retry_after(value: str | None) -> float | None:
    """Seconds form only; the HTTP-date form is rare from services like these."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
