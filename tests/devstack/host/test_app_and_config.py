"""Indexing the app object, settings and host.json: pure, in-process."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devstack.host import HostError, index_app, load_app
from devstack.host.config import load_host_json, load_local_settings, resolve_binding_expression
from devstack.host.timers import Schedule

SAMPLE = Path(__file__).resolve().parent / "sample_app"


@pytest.fixture
def sample_catalog(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    monkeypatch.setenv("SAMPLE_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("SAMPLE_TICK_SCHEDULE", "0 */5 * * * *")
    monkeypatch.setenv("SAMPLE_SERVICEBUS", "1")
    saved = {name: sys.modules.pop(name, None) for name in ("function_app", "servicebus_functions")}
    try:
        yield index_app(load_app("function_app:app", str(SAMPLE)))
    finally:
        sys.path.remove(str(SAMPLE.resolve()))
        for name, module in saved.items():  # put back the product's modules, if a test loaded them
            sys.modules.pop(name, None)
            if module is not None:
                sys.modules[name] = module


def test_functions_and_bindings_come_from_the_app_object(sample_catalog: Any) -> None:
    kinds = {f.name: f.trigger_type for f in sample_catalog.functions}
    assert kinds == {
        "race": "orchestrationTrigger",
        "double": "activityTrigger",
        "record_effect": "activityTrigger",
        "retrying": "orchestrationTrigger",
        "fails_twice": "activityTrigger",
        "unstable": "orchestrationTrigger",
        "replay_flags": "orchestrationTrigger",
        "parent": "orchestrationTrigger",
        "unnamed_parent": "orchestrationTrigger",
        "child": "orchestrationTrigger",
        "counter": "orchestrationTrigger",
        "tick": "timerTrigger",
        "commands": "serviceBusTrigger",
        "events": "serviceBusTrigger",
    }
    commands = next(f for f in sample_catalog.functions if f.name == "commands")
    assert commands.trigger["queueName"] == "%SAMPLE_COMMANDS_QUEUE%"
    assert commands.trigger["connection"] == "ServiceBusConnection"
    assert commands.trigger["autoCompleteMessages"] is False
    assert commands.durable_client_param == "client"
    # Postponed annotations are resolved to the SDK types, as the worker resolves them.
    from azurefunctions.extensions.bindings.servicebus import (
        ServiceBusMessageActions,
        ServiceBusReceivedMessage,
    )

    assert commands.params["msg"] is ServiceBusReceivedMessage
    assert commands.params["message_actions"] is ServiceBusMessageActions
    tick = next(f for f in sample_catalog.functions if f.name == "tick")
    assert tick.trigger["schedule"] == "%SAMPLE_TICK_SCHEDULE%"
    assert tick.trigger["runOnStartup"] is False
    assert sample_catalog.activity("double").is_async
    assert not sample_catalog.activity("record_effect").is_async


def test_a_bad_app_reference_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="cannot import app module 'no_such_module'"):
        load_app("no_such_module:app", str(tmp_path))
    (tmp_path / "not_an_app.py").write_text("app = 42\n")
    with pytest.raises(HostError, match=r"not an azure\.functions FunctionApp"):
        load_app("not_an_app:app", str(tmp_path))
    sys.path.remove(str(tmp_path.resolve()))
    sys.path.remove(str(tmp_path.resolve()))


def test_the_app_is_found_by_type_as_the_worker_finds_it(tmp_path: Path) -> None:
    """`--app function_app` (the default): the module's one top-level FunctionApp, whatever
    its name (most official samples call it `myApp`), as the worker's index_function_app."""
    make = "import azure.functions as func\nimport azure.durable_functions as df\n"
    (tmp_path / "named_my_app.py").write_text(make + "myApp = df.DFApp()\nalias = myApp\n")
    (tmp_path / "two_apps.py").write_text(make + "one = func.FunctionApp()\ntwo = df.DFApp()\n")
    (tmp_path / "no_app.py").write_text(make + "bp = df.Blueprint()\n")
    try:
        app = load_app("named_my_app", str(tmp_path))
        assert app is sys.modules["named_my_app"].myApp
        with pytest.raises(HostError, match=r"More than one .* instances are defined.*one, two"):
            load_app("two_apps", str(tmp_path))
        with pytest.raises(HostError, match="Could not find top level function app instances"):
            load_app("no_app", str(tmp_path))
    finally:
        while str(tmp_path.resolve()) in sys.path:
            sys.path.remove(str(tmp_path.resolve()))


def test_local_settings_fill_the_environment_without_overriding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "local.settings.json"
    path.write_text(
        json.dumps(
            {"IsEncrypted": False, "Values": {"DEVSTACK_A": "from-file", "DEVSTACK_B": "file"}}
        )
    )
    monkeypatch.setenv("DEVSTACK_A", "")  # so that the end of the test puts it back absent
    monkeypatch.delenv("DEVSTACK_A")
    monkeypatch.setenv("DEVSTACK_B", "from-env")
    load_local_settings(str(path))
    assert os.environ["DEVSTACK_A"] == "from-file"
    assert os.environ["DEVSTACK_B"] == "from-env"
    monkeypatch.delenv("DEVSTACK_A")
    with pytest.raises(HostError, match="missing app setting 'DEVSTACK_MISSING' \\(queue name\\)"):
        resolve_binding_expression("%DEVSTACK_MISSING%", purpose="queue name")


def test_host_json_settings_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKHUB_NAME", "OrdersHub")
    path = tmp_path / "host.json"
    path.write_text(
        json.dumps(
            {
                "version": "2.0",
                "extensions": {
                    "serviceBus": {
                        "prefetchCount": 5,
                        "maxConcurrentCalls": 3,
                        "autoCompleteMessages": False,
                        "maxAutoLockRenewalDuration": "00:02:30",
                    },
                    "durableTask": {
                        "hubName": "%TASKHUB_NAME%",
                        "defaultVersion": "1.0",
                        "versionMatchStrategy": "CurrentOrOlder",
                        "maxConcurrentActivityFunctions": 4,
                    },
                },
            }
        )
    )
    config = load_host_json(str(path))
    assert (config.service_bus.prefetch_count, config.service_bus.max_concurrent_calls) == (5, 3)
    assert config.service_bus.auto_complete_messages is False
    assert config.service_bus.max_auto_lock_renewal_seconds == 150
    assert config.durable.hub_name == "OrdersHub"
    assert config.durable.default_version == "1.0"
    assert config.durable.version_match == "CurrentOrOlder"
    assert config.durable.max_concurrent_activities == 4


def test_ncrontab_has_six_fields_with_seconds_first() -> None:
    start = datetime(2026, 1, 1, 10, 0, 7, tzinfo=UTC)
    assert Schedule("*/10 * * * * *").next_after(start) == datetime(
        2026, 1, 1, 10, 0, 10, tzinfo=UTC
    )
    assert Schedule("0 30 9 * * 1-5").next_after(start) == datetime(2026, 1, 2, 9, 30, tzinfo=UTC)
    assert Schedule("00:05:00").next_after(start) == datetime(2026, 1, 1, 10, 5, 7, tzinfo=UTC)
    with pytest.raises(HostError, match="six-field"):
        Schedule("*/5 * * * *")


def test_version_strategies_default_to_the_documented_ones(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(
        json.dumps({"version": "2.0", "extensions": {"durableTask": {"defaultVersion": "1.0"}}})
    )
    config = load_host_json(str(path))
    assert (config.durable.version_match, config.durable.version_failure) == (
        "CurrentOrOlder",
        "Reject",
    )
    assert load_host_json(None).durable.version_match == "CurrentOrOlder"


def test_route_prefix_defaults_to_api_and_may_be_empty() -> None:
    from devstack.host.http_triggers import route_prefix

    assert route_prefix({}) == "api"
    assert route_prefix({"extensions": {"http": {"routePrefix": ""}}}) == ""
    assert route_prefix({"extensions": {"http": {"routePrefix": "v1/orders"}}}) == "v1/orders"
