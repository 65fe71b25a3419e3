"""REPLY_QUEUE_REGISTRY: each application's reply queue, and whether it opted
in to progress statuses (workflow 2.0 sends Processing and StepCompleted only
to those)."""

from __future__ import annotations

import json

import pytest

from adapters.settings import SettingsError, load_settings

BASE = {
    "CosmosDbConnection": "AccountEndpoint=https://127.0.0.1:8081/;AccountKey=a2V5",
    "ServiceBusConnection": "Endpoint=sb://127.0.0.1;SharedAccessKeyName=k;SharedAccessKey=a2V5",
}


def settings(registry):
    return load_settings({**BASE, "REPLY_QUEUE_REGISTRY": json.dumps(registry)})


def test_plain_entries_name_the_queue_and_opt_out_of_progress():
    s = settings({"webshop": "replies-webshop"})
    assert dict(s.reply_queues) == {"webshop": "replies-webshop"}
    assert s.progress_apps == frozenset()


def test_an_application_opts_in_to_progress_statuses():
    s = settings(
        {
            "webshop": "replies-webshop",
            "backoffice": {"queue": "replies-backoffice", "progress": True},
            "partner": {"queue": "replies-partner"},
        }
    )
    assert dict(s.reply_queues) == {
        "webshop": "replies-webshop",
        "backoffice": "replies-backoffice",
        "partner": "replies-partner",
    }
    assert s.progress_apps == frozenset({"backoffice"})


@pytest.mark.parametrize(
    "entry",
    [
        {"progress": True},
        {"queue": "q", "progress": "yes"},
        {"queue": "q", "other": 1},
        ["q"],
        3,
    ],
)
def test_malformed_entries_are_refused_by_name(entry):
    with pytest.raises(SettingsError, match="backoffice"):
        settings({"backoffice": entry})


def test_two_applications_may_not_share_a_reply_queue():
    """OrderIDs are unique per application only, and a status names just the
    OrderID: two applications on one reply queue could not tell theirs apart."""
    with pytest.raises(SettingsError, match="share the reply queue 'replies'"):
        settings({"webshop": "replies", "partner": {"queue": "replies"}})


def test_an_app_id_that_cannot_name_order_keys_is_refused():
    with pytest.raises(SettingsError, match="AppId 'Web Shop'"):
        settings({"Web Shop": "replies-web"})


def test_two_long_app_ids_whose_order_key_tags_meet_are_refused():
    # Found by search: the same first 7 characters and 8 hex digits of SHA-256.
    a, b = "collide-app-00014271", "collide-app-00110258"
    with pytest.raises(SettingsError, match="share the order-key tag"):
        settings({a: "replies-a", b: "replies-b"})
