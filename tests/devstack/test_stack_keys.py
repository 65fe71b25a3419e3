"""devstack generates a stack's internal-queue keys (ADR 017e): once, into
its run directory only, readable by its owner only, kept across restarts."""

from __future__ import annotations

import stat

from adapters.settings import AGENT_SIGNING_KEYS, REPLY_TOKEN_KEYS, load_settings
from devstack.__main__ import main
from devstack.stack import KEYS_FILE, Stack, stack_keys
from domain.signing import parse_keys


def test_a_stack_generates_its_keys_once_and_keeps_them(tmp_path):
    first = stack_keys(tmp_path)
    assert set(first) == {AGENT_SIGNING_KEYS, REPLY_TOKEN_KEYS}
    assert first[AGENT_SIGNING_KEYS] != first[REPLY_TOKEN_KEYS]
    for value in first.values():
        parse_keys(value)  # a valid key ring
    assert stat.S_IMODE((tmp_path / KEYS_FILE).stat().st_mode) == 0o600
    assert stack_keys(tmp_path) == first
    assert stack_keys(tmp_path / "other") != first


def test_the_stack_settings_carry_them_and_overrides_win(tmp_path):
    stack = Stack(tmp_path, overrides={REPLY_TOKEN_KEYS: "override"})
    settings = stack.settings
    assert settings[AGENT_SIGNING_KEYS] == stack_keys(tmp_path)[AGENT_SIGNING_KEYS]
    assert settings[REPLY_TOKEN_KEYS] == "override"
    cfg = load_settings({**Stack(tmp_path).settings})
    assert (
        cfg.scheduler_keys().agents.key_ids[0]
        == parse_keys(settings[AGENT_SIGNING_KEYS]).key_ids[0]
    )


def test_devstack_key_prints_a_new_key(capsys):
    assert main(["key"]) == 0
    assert main(["key"]) == 0
    one, two = capsys.readouterr().out.split()
    assert one != two
    parse_keys(one)
