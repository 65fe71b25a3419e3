"""deploy/keys.py, the postprovision hook that creates the internal-queue keys
in the deployment's vault: absent secrets get one new key the app can read,
present ones are left alone, a refusal is waited out while the role
assignment propagates (and said), and the az adapter never puts a key on a
command line."""

from __future__ import annotations

import json
import subprocess

import pytest

from deploy.keys import SECRETS, AzVault, Failed, Keys, Refused, main, shard_environments
from domain.signing import parse_keys


class MemoryVault:
    """A vault behind deploy.keys' own Vault interface; `refusals` calls are
    refused first, as Key Vault does before a new role assignment takes effect."""

    def __init__(self, present: dict[str, str] | None = None, refusals: int = 0) -> None:
        self.secrets = dict(present or {})
        self.refusals = refusals

    def _gate(self) -> None:
        if self.refusals:
            self.refusals -= 1
            raise Refused("(Forbidden) ForbiddenByRbac")

    def has(self, name: str) -> bool:
        self._gate()
        return name in self.secrets

    def create(self, name: str, value: str) -> None:
        self._gate()
        self.secrets[name] = value


def test_absent_keys_are_created_in_the_form_the_app_reads():
    vault = MemoryVault()
    said: list[str] = []
    assert Keys(vault, say=said.append).ensure() == list(SECRETS)
    for name in SECRETS:
        ring = parse_keys(vault.secrets[name])  # raises when the app could not use it
        assert len(ring.key_ids) == 1
    assert vault.secrets[SECRETS[0]] != vault.secrets[SECRETS[1]]
    assert said == [f"keys: {name} created (one new key)" for name in SECRETS]


def test_present_keys_are_left_as_they_are():
    vault = MemoryVault({"agent-signing-keys": "kept"})
    created = Keys(vault, say=lambda _line: None).ensure()
    assert created == ["reply-token-keys"]
    assert vault.secrets["agent-signing-keys"] == "kept"


def test_a_refusal_is_waited_out_while_the_role_propagates():
    vault = MemoryVault(refusals=2)
    said: list[str] = []
    slept: list[float] = []
    Keys(vault, say=said.append, pause=15, sleep=slept.append).ensure()
    assert slept == [15, 15]
    waits = [
        line for line in said if line.startswith("keys: waiting for Key Vault Secrets Officer")
    ]
    assert len(waits) == 2
    assert set(vault.secrets) == set(SECRETS)


def test_a_refusal_past_the_propagation_time_fails_naming_it():
    vault = MemoryVault(refusals=10**6)
    keys = Keys(vault, say=lambda _line: None, propagation=0.0, sleep=lambda _s: None)
    with pytest.raises(Refused, match="reading agent-signing-keys still refused"):
        keys.ensure()


def _az(outcomes: dict[str, tuple[int, str]], calls: list[list[str]]):
    def run(args, **_kwargs):
        calls.append(list(args))
        code, text = outcomes[args[3]]  # az keyvault secret <show|set>
        return subprocess.CompletedProcess(
            args, code, text if code == 0 else "", text if code else ""
        )

    return run


def test_the_az_adapter_reads_absence_and_writes_through_a_file(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda _name: "/usr/bin/az")
    calls: list[list[str]] = []
    vault = AzVault(
        "kv-orders-x",
        run=_az(
            {
                "show": (1, "ERROR: (SecretNotFound) A secret with (name/id) x was not found"),
                "set": (0, "{}"),
            },
            calls,
        ),
    )
    assert vault.has("agent-signing-keys") is False
    vault.create("agent-signing-keys", "the-key-value")
    write = calls[-1]
    assert write[:4] == ["az", "keyvault", "secret", "set"]
    assert "--file" in write
    assert "the-key-value" not in " ".join(write)
    forbidden = AzVault("kv", run=_az({"show": (1, "ERROR: (Forbidden) ForbiddenByRbac")}, []))
    with pytest.raises(Refused):
        forbidden.has("agent-signing-keys")
    broken = AzVault("kv", run=_az({"show": (1, "ERROR: (VaultNotFound) no such vault")}, []))
    with pytest.raises(Failed):
        broken.has("agent-signing-keys")


def test_the_command_needs_the_vault_name(capsys):
    assert main([], env={}) == 1
    assert "INTERNAL_VAULT_NAME is not set" in capsys.readouterr().out


def _deployment(code: int, out: str, calls: list[list[str]]):
    def run(args, **_kwargs):
        calls.append(list(args))
        return subprocess.CompletedProcess(
            args, code, out if code == 0 else "", out if code else ""
        )

    return run


def test_the_shards_vaults_are_read_from_the_subscription_deployments_output(monkeypatch):
    """infra/shards.bicep gives every shard a vault of its own (ADR 017e: keys per shard) and
    outputs SHARD_VAULTS; `--shards` reads that output and handles each shard."""
    monkeypatch.setattr("shutil.which", lambda _name: "/usr/bin/az")
    shards = [
        {"INTERNAL_VAULT_NAME": f"kv-orders-s{i}", "AZURE_FUNCTION_APP_NAME": f"func-s{i}"}
        for i in range(3)
    ]
    calls: list[list[str]] = []
    assert shard_environments("prod", _deployment(0, json.dumps(shards), calls)) == shards
    assert calls[0][:6] == ["az", "deployment", "sub", "show", "--name", "prod"]
    assert "properties.outputs.SHARD_VAULTS.value" in calls[0]


def test_a_deployment_without_the_shards_output_is_refused_by_name(monkeypatch, capsys):
    monkeypatch.setattr("shutil.which", lambda _name: "/usr/bin/az")
    assert main(["--shards"], env={}, run=_deployment(0, "null", [])) == 1
    assert "no output SHARD_VAULTS" in capsys.readouterr().out
    missing = _deployment(
        1, "ERROR: (DeploymentNotFound) Deployment 'shards' could not be found", []
    )
    assert main(["--shards"], env={}, run=missing) == 1
    assert "FAIL deployment shards: ERROR: (DeploymentNotFound)" in capsys.readouterr().out
