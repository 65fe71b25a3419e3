"""The tool's settings: a missing local.settings.json is named, with the fix."""

from __future__ import annotations

import pytest

from adapters.settings import SettingsError
from cli.config import tool_settings


def test_a_missing_settings_file_says_so_and_how_to_make_it(tmp_path, monkeypatch):
    for name in (
        "CosmosDbConnection",
        "ServiceBusConnection",
        "CosmosDbConnection__accountEndpoint",
    ):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SettingsError) as info:
        tool_settings(tmp_path / "local.settings.json")
    assert "local.settings.json not found" in str(info.value)
    assert "cp local.settings.template.json local.settings.json" in str(info.value)


def test_a_present_but_incomplete_file_reports_the_missing_setting(tmp_path, monkeypatch):
    for name in (
        "CosmosDbConnection",
        "ServiceBusConnection",
        "CosmosDbConnection__accountEndpoint",
    ):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "local.settings.json"
    path.write_text('{"Values": {}}')
    with pytest.raises(SettingsError, match="CosmosDbConnection"):
        tool_settings(path)
