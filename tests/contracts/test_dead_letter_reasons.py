"""One dead-letter reason table, rendered from domain.dead_letters into
docs/operations.md and docs/client-guide.md, naming every reason the app and the
broker dead-letter with."""

from __future__ import annotations

import re
import shutil
import typing
from pathlib import Path

from adapters import settlement
from devstack.servicebus import entities
from domain import dead_letters
from domain.dead_letters import DeadLetterReason
from domain.models import OperatorAlert


def stale_documents(documents: tuple[Path, ...] = dead_letters.DOCUMENTS) -> list[str]:
    return [p.name for p in documents if dead_letters.rendered(p.read_text()) != p.read_text()]


def test_both_documents_carry_the_current_table():
    assert stale_documents() == []
    for path in dead_letters.DOCUMENTS:
        assert path.read_text().count(dead_letters.BEGIN) == 1, path


def test_an_edited_table_is_caught(tmp_path):
    copies = []
    for path in dead_letters.DOCUMENTS:
        copy = tmp_path / path.name
        shutil.copy(path, copy)
        copies.append(copy)
    guide = copies[1]
    guide.write_text(guide.read_text().replace("Use your registered reply queue.", "Retry."))
    assert stale_documents(tuple(copies)) == ["client-guide.md"]


def test_every_reason_the_code_uses_is_explained():
    submit = (dead_letters.ROOT / "submit" / "handler.py").read_text()
    used = set(re.findall(r'Settle\.dead_letter\(\s*"(\w+)"', submit))
    assert used >= {"InvalidMessage", "ReplyQueueNotAllowed", "OrderConflict", "AppIdMismatch"}
    used |= {settlement.INVALID_MESSAGE, settlement.PROCESSING_FAILED, settlement.RETRIES_EXHAUSTED}
    used.add(entities.REASON_MAX_DELIVERY)
    explained = {entry.reason.value for entry in dead_letters.REASONS}
    assert used <= explained
    assert explained == {r.value for r in DeadLetterReason}


def test_every_dead_letter_alert_kind_is_a_reason():
    kinds = set(typing.get_args(OperatorAlert.model_fields["Kind"].annotation))
    not_dead_letters = {
        "OrderError",
        "CompensationFailed",
        "AgentFailure",
        "UnreadableRecord",
        "StatusUndeliverable",
    }
    assert kinds - not_dead_letters <= {r.value for r in DeadLetterReason}


def test_every_row_names_its_reason_once():
    table = dead_letters.table()
    for reason in DeadLetterReason:
        assert len(re.findall(rf"^\| `{reason.value}` \|", table, re.MULTILINE)) == 1
