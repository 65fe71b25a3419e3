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


def _state(run_dir, settings, owner_alive=True):
    """A stack.json as a running stack writes it; owner = this process (alive) or a
    pid that no longer exists."""
    import json
    import os

    import psutil

    run_dir.mkdir(parents=True)
    pid = os.getpid() if owner_alive else 2**22 + 17
    started = psutil.Process().create_time() if owner_alive else 0
    (run_dir / "stack.json").write_text(
        json.dumps({"owner": pid, "owner_started": started, "settings": str(settings)})
    )


def _settings_file(path, endpoint, written_by_devstack):
    import json

    data = {"Values": {"ServiceBusConnection": f"Endpoint={endpoint};SharedAccessKey=secret"}}
    if written_by_devstack:
        data["devstack"] = {"run_dir": "x"}
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def in_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOCAL_SETTINGS", raising=False)
    return tmp_path


def test_with_no_settings_file_the_running_stack_is_found(in_repo):
    from cli.config import choose_settings

    run = in_repo / ".devstack" / "up"
    _state(run, _settings_file(in_repo / "s.json", "sb://127.0.0.1:40001", True))
    source = choose_settings()
    assert source.stack == run
    assert source.path == in_repo / "s.json"


def test_a_settings_file_an_earlier_up_wrote_gives_way_to_the_running_stack(in_repo):
    from cli.config import choose_settings

    _settings_file(in_repo / "local.settings.json", "sb://127.0.0.1:5672", True)
    run = in_repo / ".devstack" / "up"
    _state(run, _settings_file(in_repo / "s.json", "sb://127.0.0.1:40001", True))
    assert choose_settings().path == in_repo / "s.json"


def test_your_own_settings_file_wins_over_a_running_stack(in_repo):
    from cli.config import choose_settings

    own = _settings_file(in_repo / "local.settings.json", "sb://remote:5671", False)
    _state(in_repo / ".devstack" / "up", _settings_file(in_repo / "s.json", "sb://x:1", True))
    assert choose_settings().path.resolve() == own.resolve()


def test_a_stack_whose_owner_is_gone_is_not_used(in_repo):
    from cli.config import choose_settings

    _state(
        in_repo / ".devstack" / "up",
        _settings_file(in_repo / "s.json", "sb://127.0.0.1:40001", True),
        owner_alive=False,
    )
    source = choose_settings()
    assert source.stack is None
    assert source.path is None


def test_a_connection_hint_names_the_setting_the_stack_and_make_status(in_repo, monkeypatch):
    from cli import config

    monkeypatch.delenv("ServiceBusConnection", raising=False)
    run = in_repo / ".devstack" / "up"
    _state(run, _settings_file(in_repo / "s.json", "sb://127.0.0.1:40001", True))
    config.SOURCE = config.choose_settings()
    hint = config.connection_hint("ServiceBusConnection")
    assert "ServiceBusConnection=sb://127.0.0.1:40001" in hint
    assert f"stack {run}" in hint
    assert "make status" in hint
    assert "secret" not in hint  # no keys in messages
