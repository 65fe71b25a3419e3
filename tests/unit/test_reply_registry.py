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
