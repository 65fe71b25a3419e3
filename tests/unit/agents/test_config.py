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
