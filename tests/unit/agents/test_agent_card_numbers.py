"""The agent's reply log line carries the provider's words masked, like the
reply itself (review defect 1: logs are stored too), and the mask comes
before the reply's cut, so a card number at the cut is not half kept."""

from __future__ import annotations

import logging

from domain.errors import PermanentError
from domain.models import ReplyOutcome
from tests.unit.agents.conftest import request
from tests.unit.agents.fakes import Outcome

PAN = "4111 1111 1111 1111"


async def test_the_reply_log_line_has_no_card_number(agent, remote, caplog):
    remote.script = [
        Outcome(error=PermanentError(f"payment/charge: HTTP 402: card {PAN} declined"))
    ]
    with caplog.at_level(logging.INFO, logger="agents.agent"):
        reply = await agent.handle(request())
    assert reply.Outcome is ReplyOutcome.PERMANENT
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "card [card number removed] declined" in logged
    assert "4111" not in logged
    assert "4111" not in reply.Error


async def test_a_card_number_at_the_cut_is_masked_whole(agent, remote):
    said = "x" * 490 + f" {PAN} declined"
    remote.script = [Outcome(error=PermanentError(said))]
    reply = await agent.handle(request())
    assert "4111" not in reply.Error
    assert "1111" not in reply.Error
