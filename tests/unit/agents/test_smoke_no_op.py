"""The smoke application's steps are answered by the built-in no-op: a smoke
order never reaches the configured remote service, in either direction, and
every other application's order still does."""

from __future__ import annotations

import pytest

from domain.ids import SMOKE_APP_ID
from domain.models import ReplyOutcome
from tests.unit.agents.conftest import request


@pytest.mark.parametrize("action", ["do", "undo"])
@pytest.mark.parametrize("step", ["reserve-inventory", "charge-payment", "arrange-shipment"])
async def test_a_smoke_order_is_answered_without_calling_the_remote_service(
    agent, remote, step, action
):
    req = request(step, action=action).model_copy(update={"AppId": SMOKE_APP_ID})

    reply = await agent.handle(req)

    assert remote.calls == []
    assert reply.Outcome is ReplyOutcome.OK
    assert reply.AppId == SMOKE_APP_ID
    assert reply.Result is not None
    assert reply.Result["Reference"].startswith("smoke-no-op-")
    assert reply.Result["Status"] == "smoke-no-op"
    assert [call.Outcome for call in reply.Calls or []] == ["ok"]


async def test_a_smoke_order_known_by_its_key_alone_is_answered_by_the_no_op(agent, remote):
    """The in-app (INLINE_STEPS) path may build the request without an AppId."""
    req = request("arrange-shipment", order_id="smoke:SMOKE-1").model_copy(update={"AppId": None})

    reply = await agent.handle(req)

    assert remote.calls == []
    assert reply.Outcome is ReplyOutcome.OK
    assert reply.Result is not None
    assert reply.Result["Status"] == "smoke-no-op"


@pytest.mark.parametrize("key", ["webshop:SMOKE-1", "smoke", "smokey:O-1", "o-1"])
async def test_other_keys_still_call_the_remote_service(agent, remote, key):
    reply = await agent.handle(request("charge-payment", order_id=key))

    assert reply.Outcome is ReplyOutcome.OK
    assert len(remote.calls) == 1


async def test_another_applications_order_still_calls_the_remote_service(agent, remote):
    req = request("charge-payment").model_copy(update={"AppId": "webshop"})

    reply = await agent.handle(req)

    assert reply.Outcome is ReplyOutcome.OK
    [made] = remote.calls
    assert (made.call.service, made.call.operation) == ("payment", "charge")
