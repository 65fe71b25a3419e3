"""The one codec for everything on the wire: JSON bytes <-> contract models.
Decoding applies the client boundary (domain.boundary: size before parsing,
exact JSON), then strict validation, and says what failed in one line."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from domain.boundary import WIRE, BoundaryError, exact_json
from domain.errors import ValidationFailed

M = TypeVar("M", bound=BaseModel)

DEFAULT_MAX_BYTES = 64 * 1024


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json(exclude_none=False).encode("utf-8")


def decode(model_type: type[M], body: bytes | str, max_bytes: int = DEFAULT_MAX_BYTES) -> M:
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
    try:
        exact_json(raw, max_bytes)
    except BoundaryError as exc:
        raise ValidationFailed(f"{model_type.__name__}: {exc}") from None
    try:
        return model_type.model_validate_json(raw, strict=True, context=WIRE)
    except ValidationError as exc:
        raise ValidationFailed(describe(model_type, exc)) from exc


def describe(model_type: type[BaseModel], exc: ValidationError) -> str:
    """`OrderSubmitted: Lines.0.Quantity: Input should be a valid integer; ...`"""
    parts = []
    for err in exc.errors()[:10]:
        where = ".".join(str(p) for p in err["loc"]) or "(body)"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - len(parts)
    suffix = f"; and {more} more" if more > 0 else ""
    return f"{model_type.__name__}: " + "; ".join(parts) + suffix
