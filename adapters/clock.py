"""Wall-clock time for function code (never for orchestrator code, which reads
`context.current_utc_datetime`). One function, so tests can inject another."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> datetime:
    return datetime.now(UTC)
