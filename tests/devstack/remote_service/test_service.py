"""The remote service's guarantees (idempotency, fencing, side-effect counts)
and each fault kind, over real HTTP."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.devstack.remote_service.helpers import add_fault, call, effect_count, effects

# --- idempotency --------------------------------------------------------------------


async def test_same_key_twice_applies_one_side_effect_and_replays_the_answer(client):
    first = await call(client, "/inventory/reserve")
    second = await call(client, "/inventory/reserve")

    assert first.status == second.status == 200
    assert await first.json() == await second.json()
    assert "Idempotent-Replayed" not in first.headers
    assert second.headers["Idempotent-Replayed"] == "true"
    report = await effects(client)
    assert report["effects"] == [
        {
            "order_id": "o1",
            "step": "reserve-inventory",
            "operation": "inventory/reserve",
            "count": 1,
        }
    ]
    assert report["duplicates"] == []
    assert report["replays"] == 1


async def test_one_key_for_a_step_and_its_undo_applies_each_once(client):
    reserve = await call(client, "/inventory/reserve")
    release = await call(client, "/inventory/release")
    again = await call(client, "/inventory/release")

    assert (await reserve.json())["Status"] == "reserved"
    assert (await release.json())["Status"] == "released"
    assert await again.json() == await release.json()
    assert await effect_count(client, "o1", "reserve-inventory", "inventory/reserve") == 1
    assert await effect_count(client, "o1", "reserve-inventory", "inventory/release") == 1


async def test_undo_of_what_never_happened_succeeds_without_a_side_effect(client):
    response = await call(client, "/payment/refund", key="o9/charge-payment")

    assert response.status == 200
    assert (await response.json())["Status"] == "nothing-to-undo"
    assert (await effects(client))["total"] == 0


async def test_a_forward_call_after_its_compensation_is_refused(client):
    await call(client, "/payment/refund", key="o9/charge-payment")
    late = await call(client, "/payment/charge", key="o9/charge-payment")

    assert late.status == 409
    assert (await late.json())["code"] == "AlreadyCompensated"
    assert (await effects(client))["total"] == 0


async def test_different_orders_are_independent(client):
    await call(client, "/payment/charge", key="a/charge-payment")
    await call(client, "/payment/charge", key="b/charge-payment")

    report = await effects(client)
    assert report["total"] == 2
    assert [row["order_id"] for row in (await effects(client, "a"))["effects"]] == ["a"]


# --- fencing ------------------------------------------------------------------------


async def test_a_lower_fencing_token_is_rejected_with_409_and_a_reason(client):
    newer = await call(client, "/payment/charge", key="o1/charge-payment", token=3)
    stale = await call(client, "/shipping/arrange", key="o1/arrange-shipment", token=2)

    assert newer.status == 200
    assert stale.status == 409
    body = await stale.json()
    assert body["code"] == "FencingTokenRejected"
    assert body["token"] == 2
    assert body["highest"] == 3
    assert "newer attempt" in body["error"]
    assert await effect_count(client, "o1", "arrange-shipment", "shipping/arrange") == 0


async def test_a_stale_token_gets_no_replay_of_a_stored_answer_either(client):
    await call(client, "/payment/charge", key="o1/charge-payment", token=1)
    await call(client, "/inventory/reserve", key="o1/reserve-inventory", token=2)
    stale_retry = await call(client, "/payment/charge", key="o1/charge-payment", token=1)

    assert stale_retry.status == 409


async def test_equal_and_higher_tokens_are_accepted(client):
    assert (await call(client, "/inventory/reserve", token=2)).status == 200
    assert (await call(client, "/inventory/reserve", token=2)).status == 200
    assert (await call(client, "/payment/charge", key="o1/charge-payment", token=5)).status == 200


async def test_fencing_is_per_order(client):
    await call(client, "/inventory/reserve", key="a/reserve-inventory", token=9)
    response = await call(client, "/inventory/reserve", key="b/reserve-inventory", token=1)

    assert response.status == 200


# --- request validation ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "key", "token", "body", "status", "code"),
    [
        ("/inventory/reserve", None, 1, None, 400, "MissingIdempotencyKey"),
        ("/inventory/reserve", "no-slash", 1, None, 400, "BadIdempotencyKey"),
        ("/inventory/reserve", "o1/step", None, None, 400, "BadFencingToken"),
        ("/inventory/reserve", "o1/step", "0", None, 400, "BadFencingToken"),
        ("/inventory/reserve", "o1/step", "x", None, 400, "BadFencingToken"),
        ("/inventory/reserve", "o1/step", 1, [1, 2], 400, "BadBody"),
        ("/inventory/teleport", "o1/step", 1, None, 404, "UnknownOperation"),
    ],
)
async def test_malformed_calls_are_refused_with_a_code(
    client, path, key, token, body, status, code
):
    response = await call(client, path, key=key, token=token, body=body)

    assert response.status == status
    assert (await response.json())["code"] == code
    assert (await effects(client))["total"] == 0


# --- faults -------------------------------------------------------------------------


async def test_transient_fault_for_the_next_n_calls_then_healthy(client):
    await add_fault(client, kind="transient", service="payment", count=2, retry_after=0.5)
    key = "o1/charge-payment"

    first = await call(client, "/payment/charge", key=key)
    second = await call(client, "/payment/charge", key=key)
    third = await call(client, "/payment/charge", key=key)

    assert [first.status, second.status, third.status] == [503, 503, 200]
    assert first.headers["Retry-After"] == "0.5"
    assert await effect_count(client, "o1", "charge-payment", "payment/charge") == 1
    assert (await (await client.get("/_admin/faults")).json())["rules"] == []


async def test_a_ratelimit_answers_429_with_retry_after_and_applies_nothing_over_it(client):
    await add_fault(client, kind="ratelimit", service="payment", per_second=0.5, burst=1)

    served = await call(client, "/payment/charge", key="a/charge-payment")
    over = await call(client, "/payment/charge", key="b/charge-payment")

    assert (served.status, over.status) == (200, 429)
    assert over.headers["Retry-After"] == "2"
    assert (await over.json())["code"] == "TooManyRequests"
    assert await effect_count(client, "b", "charge-payment", "payment/charge") == 0
    assert (await call(client, "/inventory/reserve")).status == 200  # another service's rate


async def test_transient_fault_with_rate_one_fails_every_call(client):
    await add_fault(client, kind="transient", service="inventory", rate=1.0, status=502)

    statuses = [(await call(client, "/inventory/reserve")).status for _ in range(5)]

    assert statuses == [502] * 5
    assert (await effects(client))["total"] == 0


async def test_faults_are_scoped_by_service_operation_and_order(client):
    await add_fault(client, kind="permanent", service="payment", order_id="bad")
    await add_fault(client, kind="transient", service="inventory", operation="release")

    assert (await call(client, "/payment/charge", key="bad/charge-payment")).status == 422
    assert (await call(client, "/payment/charge", key="good/charge-payment")).status == 200
    assert (await call(client, "/inventory/reserve", key="good/reserve-inventory")).status == 200
    assert (await call(client, "/inventory/release", key="good/reserve-inventory")).status == 503


async def test_outage_answers_503_until_removed(client):
    rule_id = await add_fault(client, kind="outage", service="shipping", seconds=600)
    key = "o1/arrange-shipment"

    during = [(await call(client, "/shipping/arrange", key=key)).status for _ in range(3)]
    await client.delete(f"/_admin/faults/{rule_id}")
    after = await call(client, "/shipping/arrange", key=key)

    assert during == [503, 503, 503]
    assert after.status == 200


async def test_permanent_fault_answers_4xx_with_its_message_and_no_effect(client):
    await add_fault(
        client, kind="permanent", service="payment", status=402, message="card declined"
    )

    response = await call(client, "/payment/charge", key="o1/charge-payment")

    assert response.status == 402
    assert (await response.json())["error"] == "card declined"
    assert (await effects(client))["total"] == 0


async def test_latency_lets_a_caller_time_out_and_the_effect_still_lands(client):
    await add_fault(client, kind="latency", service="inventory", seconds=0.3, count=1)

    with pytest.raises(asyncio.TimeoutError):
        await call(client, "/inventory/reserve", timeout=aiohttp.ClientTimeout(total=0.05))
    landed = False
    for _ in range(200):  # the slow call finishes on its own; wait for it, bounded
        if (await effects(client))["total"]:
            landed = True
            break
        await asyncio.sleep(0.05)
    retry = await call(client, "/inventory/reserve")

    assert landed
    assert retry.status == 200
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert await effect_count(client, "o1", "reserve-inventory", "inventory/reserve") == 1


async def test_crash_drop_applies_the_effect_and_drops_the_connection(client):
    await add_fault(client, kind="crash", service="payment", mode="drop")
    key = "o1/charge-payment"

    with pytest.raises(aiohttp.ClientConnectionError):
        await call(client, "/payment/charge", key=key)
    retry = await call(client, "/payment/charge", key=key)

    assert retry.status == 200
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert await effect_count(client, "o1", "charge-payment", "payment/charge") == 1


async def test_crash_error_applies_the_effect_and_answers_500(client):
    await add_fault(client, kind="crash", service="payment", mode="error", count=1)
    key = "o1/charge-payment"

    crashed = await call(client, "/payment/charge", key=key)
    retry = await call(client, "/payment/charge", key=key)

    assert crashed.status == 500
    assert retry.status == 200
    assert (await effects(client))["duplicates"] == []
    assert await effect_count(client, "o1", "charge-payment", "payment/charge") == 1


async def test_crash_exit_calls_exit_after_recording_the_effect(client, exits):
    await add_fault(client, kind="crash", service="shipping", mode="exit")

    await call(client, "/shipping/arrange", key="o1/arrange-shipment")

    assert exits == [75]
    assert await effect_count(client, "o1", "arrange-shipment", "shipping/arrange") == 1


# --- admin API ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "reason"),
    [
        ({"kind": "flood"}, "kind"),
        ({"kind": "latency"}, "needs seconds"),
        ({"kind": "transient", "service": "bank"}, "unknown service"),
        ({"kind": "transient", "status": 404}, "must be 5xx"),
        ({"kind": "permanent", "status": 503}, "must be 4xx"),
        ({"kind": "permanent", "rate": 0.5}, "rate applies"),
        ({"kind": "transient", "colour": "red"}, "colour"),
    ],
)
async def test_an_invalid_fault_rule_is_refused_with_the_reason(client, rule, reason):
    response = await client.post("/_admin/faults", json=rule)

    assert response.status == 400
    assert reason in (await response.json())["error"]


async def test_several_rules_at_once_are_listed_and_cleared(client):
    response = await client.post(
        "/_admin/faults",
        json={"rules": [{"kind": "transient", "count": 1}, {"kind": "outage", "seconds": 60}]},
    )
    listed = (await (await client.get("/_admin/faults")).json())["rules"]
    await client.delete("/_admin/faults")

    assert (await response.json())["ids"] == [1, 2]
    assert [rule["kind"] for rule in listed] == ["transient", "outage"]
    assert (await (await client.get("/_admin/faults")).json())["rules"] == []


async def test_requests_are_counted_even_when_faulted_or_refused(client):
    await add_fault(client, kind="transient", service="payment", count=1)
    await call(client, "/payment/charge", key="o1/charge-payment", token=2)  # faulted
    await call(client, "/payment/charge", key="o1/charge-payment", token=2)  # applied
    await call(client, "/payment/charge", key="o1/charge-payment", token=1)  # fenced
    await call(client, "/inventory/reserve", key="o2/reserve-inventory")  # other order

    counts = await (await client.get("/_admin/requests", params={"order_id": "o1"})).json()

    assert counts["requests"] == [
        {"service": "payment", "operation": "charge", "order_id": "o1", "count": 3}
    ]
    assert counts["total"] == 3
    assert counts["in_flight"] == 0


async def test_reset_forgets_effects_fences_and_faults(client):
    await call(client, "/inventory/reserve", token=5)
    await add_fault(client, kind="outage", seconds=60)

    await client.post("/_admin/reset")

    assert (await effects(client))["total"] == 0
    assert (await call(client, "/inventory/reserve", token=1)).status == 200
