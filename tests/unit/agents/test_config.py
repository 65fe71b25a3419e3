from __future__ import annotations

import pytest

from adapters.settings import SettingsError
from agents.config import load_agent_settings, require_servicebus


def test_local_defaults_need_nothing_set():
    settings = load_agent_settings({})

    assert settings.remote_service_url == "http://127.0.0.1:7081"
    assert settings.policy.max_attempts == 8
    with pytest.raises(SettingsError, match="ServiceBusConnection"):
        require_servicebus(settings)


def test_settings_are_read_by_their_names():
    settings = load_agent_settings(
        {
            "REMOTE_SERVICE_URL": "http://remote:9000",
            "ServiceBusConnection__fullyQualifiedNamespace": "ns.servicebus.windows.net",
            "AGENT_CALL_TIMEOUT_SECONDS": "2.5",
            "AGENT_RETRY_MAX_ATTEMPTS": "4",
            "AGENT_BREAKER_FAIL_MAX": "3",
            "AGENT_MAX_CONCURRENCY": "2",
        }
    )

    assert settings.remote_service_url == "http://remote:9000"
    assert settings.servicebus.fully_qualified_namespace == "ns.servicebus.windows.net"
    assert settings.policy.call_timeout == 2.5
    assert settings.policy.max_attempts == 4
    assert settings.policy.breaker_fail_max == 3
    assert settings.max_concurrency == 2


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AGENT_RETRY_MAX_ATTEMPTS", "0"),
        ("AGENT_RETRY_MAX_ATTEMPTS", "2.5"),
        ("AGENT_CALL_TIMEOUT_SECONDS", "soon"),
        ("REMOTE_SERVICE_URL", "ftp://x"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(name, value):
    with pytest.raises(SettingsError, match=name):
        load_agent_settings({name: value})


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:7081", "https://localhost/api", "http://[::1]:80", "http://127.8.0.1"]
)
def test_a_loopback_remote_service_is_refused_in_azure(url):
    """Issue 24, risk 4: the local default must not reach Azure unnoticed."""
    azure = {"WEBSITE_SITE_NAME": "func-orders", "REMOTE_SERVICE_URL": url}
    with pytest.raises(SettingsError, match=r"REMOTE_SERVICE_URL .* loopback"):
        load_agent_settings(azure)
    # Locally the same URL is the devstack's fake remote service.
    assert load_agent_settings({"REMOTE_SERVICE_URL": url}).remote_service_url == url


def test_an_unset_remote_service_is_refused_in_azure():
    with pytest.raises(SettingsError, match="REMOTE_SERVICE_URL"):
        load_agent_settings({"IDENTITY_ENDPOINT": "http://169.254.0.1/msi"})


def test_a_public_remote_service_is_accepted_in_azure():
    azure = {"WEBSITE_SITE_NAME": "func-orders", "REMOTE_SERVICE_URL": "https://remote.example.com"}
    assert load_agent_settings(azure).remote_service_url == "https://remote.example.com"


def test_the_agent_keys_are_read_and_required_by_name():
    from agents.config import require_agent_keys
    from domain.signing import new_key, parse_keys

    current, previous = new_key(), new_key()
    settings = load_agent_settings({"AGENT_SIGNING_KEYS": f"{current}, {previous}"})
    keys = require_agent_keys(settings)
    assert keys.key_ids == (parse_keys(current).key_ids[0], parse_keys(previous).key_ids[0])
    assert current not in repr(settings)  # never printed
    with pytest.raises(SettingsError, match="set AGENT_SIGNING_KEYS"):
        require_agent_keys(load_agent_settings({}))


@pytest.mark.parametrize("value", ["not-a-key!", "c2hvcnQ", "a,,b"])
def test_a_bad_key_is_refused_naming_the_setting_not_quoting_it(value):
    with pytest.raises(SettingsError, match="AGENT_SIGNING_KEYS") as caught:
        load_agent_settings({"AGENT_SIGNING_KEYS": value})
    assert value not in str(caught.value)


def test_the_app_reads_both_key_settings_and_says_which_is_missing():
    from adapters.settings import load_settings
    from domain.signing import new_key

    base = {
        "CosmosDbConnection": "AccountEndpoint=https://x/;AccountKey=k",
        "ServiceBusConnection": "Endpoint=sb://x/;SharedAccessKeyName=a;SharedAccessKey=b",
    }
    with pytest.raises(SettingsError, match="set REPLY_TOKEN_KEYS"):
        load_settings(base).scheduler_keys()
    with pytest.raises(SettingsError, match="set AGENT_SIGNING_KEYS"):
        load_settings({**base, "REPLY_TOKEN_KEYS": new_key()}).scheduler_keys()
    keys = load_settings(
        {**base, "REPLY_TOKEN_KEYS": new_key(), "AGENT_SIGNING_KEYS": new_key()}
    ).scheduler_keys()
    assert keys.tokens.key_ids[0] != keys.agents.key_ids[0]


def test_a_service_may_live_at_its_own_base_url(tmp_path):
    from tests.added_step import write_catalog

    env = {
        "REMOTE_SERVICE_URL": "http://remote:9000",
        "REMOTE_SERVICE_URL__PAYMENT": "https://payments.example.com/api",
        "REMOTE_SERVICE_URL__WAREHOUSE": "http://warehouse:9100",
        "STEP_CATALOG_FILE": str(write_catalog(tmp_path / "steps.json")),
    }
    settings = load_agent_settings(env)

    assert settings.steps.names[-1] == "reserve-warehouse-slot"
    assert settings.remote_service_url == "http://remote:9000"
    assert settings.service_urls == {
        "payment": "https://payments.example.com/api",
        "warehouse": "http://warehouse:9100",
    }


def test_a_service_url_for_no_service_of_the_catalog_is_refused():
    """A typo would send the service's calls to the default URL unnoticed."""
    with pytest.raises(SettingsError, match=r"REMOTE_SERVICE_URL__PAYMNET names no service"):
        load_agent_settings({"REMOTE_SERVICE_URL__PAYMNET": "http://x"})
    # The shipped catalog has no warehouse: its URL is refused until the step is added.
    with pytest.raises(SettingsError, match="services: inventory, payment, shipping"):
        load_agent_settings({"REMOTE_SERVICE_URL__WAREHOUSE": "http://x"})


def test_a_service_url_is_checked_like_the_default():
    with pytest.raises(SettingsError, match="REMOTE_SERVICE_URL__PAYMENT must be an http"):
        load_agent_settings({"REMOTE_SERVICE_URL__PAYMENT": "payments:443"})
    azure = {
        "WEBSITE_SITE_NAME": "func-orders",
        "REMOTE_SERVICE_URL": "https://remote.example.com",
        "REMOTE_SERVICE_URL__PAYMENT": "http://127.0.0.1:7081",
    }
    with pytest.raises(SettingsError, match=r"REMOTE_SERVICE_URL__PAYMENT .* loopback"):
        load_agent_settings(azure)


def test_a_bad_catalog_file_is_refused_naming_the_setting_and_the_entry(tmp_path):
    bad = tmp_path / "steps.json"
    bad.write_text('{"steps": [{"name": "x", "service": "s", "do": "a", "undo": "a"}]}')
    with pytest.raises(SettingsError, match=r"STEP_CATALOG_FILE: step catalog .*steps\[0\] \(x\)"):
        load_agent_settings({"STEP_CATALOG_FILE": str(bad)})
    assert load_agent_settings({}).steps.names == (
        "reserve-inventory",
        "charge-payment",
        "arrange-shipment",
    )
