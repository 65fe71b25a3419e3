"""docs/client-guide.md covers every contract, every status a client can
receive and every reason Submit dead-letters an order with."""

from __future__ import annotations

import re

import pytest

from domain import schemas
from domain.models import StatusKind

GUIDE = schemas.ROOT / "docs" / "client-guide.md"
SUBMIT = schemas.ROOT / "submit" / "handler.py"


def guide() -> str:
    return GUIDE.read_text()


@pytest.mark.parametrize("name", sorted(schemas.CONTRACTS))
def test_links_every_schema(name: str):
    assert f"contracts/{name}.schema.json" in guide()


@pytest.mark.parametrize("status", [s.value for s in StatusKind])
def test_explains_every_status(status: str):
    assert re.search(rf"^\| {status} \|", guide(), re.MULTILINE), status


def test_explains_every_dead_letter_reason_submit_uses():
    reasons = set(re.findall(r'Settle\.dead_letter\(\s*"(\w+)"', SUBMIT.read_text()))
    assert reasons >= {"InvalidMessage", "ReplyQueueNotAllowed", "OrderConflict"}
    for reason in reasons:
        assert re.search(rf"^\| `{reason}` \|", guide(), re.MULTILINE), reason


def test_names_the_per_application_ingress_queue():
    assert "orders-<AppId>" in guide()
    assert "MessageId" in guide()
    assert "application/json" in guide()
