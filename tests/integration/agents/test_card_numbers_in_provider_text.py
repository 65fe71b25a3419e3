"""A provider that quotes the card it declined (review defect 1), end to end
on the real servers: the remote service's 402 text reaches the agent's reply
masked, and the record the orchestration writes from it to the Cosmos server
holds no card number in LastError, History or the outbox."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta

import pytest

from adapters.clock import SystemClock
from agents.agent import Agent
from agents.remote_client import HttpRemoteService
from domain import state_machine as sm
from domain.codec import encode
from domain.models import ReplyOutcome
from tests.builders import agent_request, claim
from tests.integration.adapters.builders import NOW, POLICY, make_record
from tests.integration.agents.test_agent_against_remote_service import FAST

pytestmark = pytest.mark.integration

PAN = "4111 1111 1111 1111"


def holds_the_card(text: str) -> bool:
    """The card's digits, in any of the ways they could be written."""
    return "4111111111111111" in re.sub(r"[\s.\-\\u]+", "", text)


async def test_a_declined_card_quoted_by_the_provider_is_stored_nowhere(
    http, remote_admin, state_store
):
    await remote_admin.fault(
        kind="permanent",
        service="payment",
        status=402,
        message=f"card {PAN} declined: do not honour",
    )
    agent = Agent(
        HttpRemoteService(http, remote_admin.url), SystemClock(), FAST, rng=random.Random(3)
    )
    request = agent_request(
        "PAN-1",
        "charge-payment",
        1,
        "do",
        datetime.now(UTC) + timedelta(seconds=10),
        {"Total": "10.00"},
    )

    reply = await agent.handle(request)

    assert reply.Outcome is ReplyOutcome.PERMANENT
    assert "declined: do not honour" in reply.Error
    assert not holds_the_card(encode(reply).decode())

    await state_store.create_if_absent(make_record("PAN-1", NOW))
    claimed = await claim(state_store, "PAN-1", NOW, POLICY)
    reason = f"step charge-payment failed: {reply.Error}"
    await state_store.update(
        "PAN-1",
        lambda r: sm.mark_failed(r, claimed.LockedBy, "charge-payment", reason, NOW),
        claimed.LockedBy,
    )
    record, _ = await state_store.read("PAN-1")
    assert "declined: do not honour" in record.LastError
    assert not holds_the_card(record.model_dump_json())


async def test_a_provider_text_read_back_from_an_older_agent_is_masked_when_stored(state_store):
    """A reply from an agent without the masking (read as sent from the
    wire) still leaves no card number on the record."""
    await state_store.create_if_absent(make_record("PAN-2", NOW))
    claimed = await claim(state_store, "PAN-2", NOW, POLICY)
    reason = f"step charge-payment failed: card {PAN} declined"
    await state_store.update(
        "PAN-2",
        lambda r: sm.mark_failed(r, claimed.LockedBy, "charge-payment", reason, NOW),
        claimed.LockedBy,
    )
    record, _ = await state_store.read("PAN-2")
    assert not holds_the_card(record.model_dump_json())
    assert record.History[-1].Reason.endswith("card [card number removed] declined")
