"""HTTP outcomes -> domain errors (the translation table in remote_client)."""

from __future__ import annotations

import json

import pytest

from agents.remote_client import FencingRejected, _interpret
from domain.errors import PermanentError, TransientError


def interpret(status: int, body: object = None, retry_after: float | None = None):
    text = body if isinstance(body, str) else json.dumps(body) if body is not None else ""
    return _interpret("payment/charge for o1/charge-payment", status, text, retry_after, 2)


def test_2xx_with_a_json_object_is_the_result():
    assert interpret(200, {"Reference": "R"}) == {"Reference": "R"}


def test_2xx_without_a_json_object_is_transient_since_the_effect_may_have_happened():
    with pytest.raises(TransientError):
        interpret(200, "<html>")


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 429])
def test_server_errors_timeouts_and_throttling_are_transient(status):
    with pytest.raises(TransientError) as raised:
        interpret(status, {"error": "busy"}, retry_after=3)
    assert raised.value.retry_after == 3
    assert f"HTTP {status}: busy" in str(raised.value)


@pytest.mark.parametrize("status", [400, 402, 403, 404, 409, 422])
def test_other_4xx_are_permanent(status):
    with pytest.raises(PermanentError) as raised:
        interpret(status, {"error": "no", "code": "Rejected"})
    assert not isinstance(raised.value, FencingRejected)


def test_409_fencing_rejection_is_its_own_permanent_error():
    body = {"code": "FencingTokenRejected", "error": "lower than 3", "highest": 3}

    with pytest.raises(FencingRejected) as raised:
        interpret(409, body)

    assert isinstance(raised.value, PermanentError)
    assert "fencing token 2 rejected: lower than 3" in str(raised.value)
