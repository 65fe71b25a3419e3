"""Order keys (domain.ids.order_key): an OrderID is unique per application,
so the key names both (docs/adr/017f-order-keys.md); a bare OrderID passes
for a key too (tests and tools name records so)."""

from __future__ import annotations

import pytest

from domain import ids


def test_two_applications_one_order_id_two_keys():
    a, b = ids.order_key("webshop", "ORD-1"), ids.order_key("partner-portal", "ORD-1")
    assert (a, b) == ("webshop:ORD-1", "partner-portal:ORD-1")
    assert ids.client_order_id(a) == ids.client_order_id(b) == "ORD-1"
    assert ids.idempotency_key(a, "charge-payment") != ids.idempotency_key(b, "charge-payment")
    assert ids.attempt_instance_id(a, 1) != ids.attempt_instance_id(b, 1)


def test_every_builder_takes_both_forms_and_the_client_sees_its_own_id():
    for key in ("webshop:ORD-1", "ORD-1"):
        instance = ids.attempt_instance_id(key, 3)
        assert ids.parse_attempt_instance_id(instance) == (key, 3)
        assert ids.idempotency_key(key, "charge-payment") == f"{key}/charge-payment"
        assert ids.status_message_id(key, "Processed", "3") == "ORD-1/status/Processed/3"


def test_a_long_app_id_gets_a_bounded_tag_and_ids_stay_within_their_limits():
    long_app = "a" * 64
    tag = ids.app_tag(long_app)
    assert len(tag) == ids.MAX_APP_TAG
    assert tag.startswith("aaaaaaa~")
    assert ids.app_tag("a" * 63 + "b") != tag  # the hash tells them apart
    key = ids.order_key(long_app, "X" * 64)
    assert len(key) == ids.ORDER_KEY_MAX_LENGTH
    instance = ids.attempt_instance_id(key, 999)
    assert len(instance) <= 100  # a Durable instance id
    assert len(ids.idempotency_key(key, "a" * 32)) <= 120  # AgentRequest.IdempotencyKey
    assert len(ids.agent_request_message_id(instance, "a" * 32, "undo-12")) <= 128


def test_the_outbox_alert_id_is_per_application_and_unchanged_for_bare_keys():
    status_id = ids.status_message_id("ORD-1", "Failed", "supervisor/4")
    webshop = ids.outbox_alert_message_id("webshop:ORD-1", status_id)
    partner = ids.outbox_alert_message_id("partner-portal:ORD-1", status_id)
    assert webshop != partner
    # The id an alert of a record written before keys named the application had.
    assert ids.outbox_alert_message_id("ORD-1", status_id) == f"alert/{status_id}"


@pytest.mark.parametrize("bad", ["Webshop", "web_shop", "", "-x", "a" * 65])
def test_app_ids_outside_the_alphabet_are_refused(bad):
    with pytest.raises(ValueError, match="AppId"):
        ids.app_tag(bad)
