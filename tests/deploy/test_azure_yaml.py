"""azure.yaml is valid for azd (its published schema, schemas/v1.0/azure.yaml.json
of the azure-dev repository, kept beside this file) and wires the preflight
before provisioning and the smoke test after deploying."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from tests.infra.bicep_model import ROOT

SCHEMA = Path(__file__).with_name("azure.yaml.schema.json")


def azure_yaml() -> dict:
    return yaml.safe_load((ROOT / "azure.yaml").read_text())


def test_azure_yaml_matches_azds_schema():
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft201909Validator(schema).validate(azure_yaml())


def test_a_broken_hook_fails_the_schema():
    """The check above means something only if a wrong hook fails it."""
    schema = json.loads(SCHEMA.read_text())
    broken = azure_yaml()
    broken["hooks"]["preprovision"]["posix"]["shell"] = "bash"
    errors = list(jsonschema.Draft201909Validator(schema).iter_errors(broken))
    assert errors


def test_the_hooks_run_the_preflight_and_the_smoke_test():
    hooks = azure_yaml()["hooks"]
    for os_name in ("posix", "windows"):
        assert hooks["preprovision"][os_name]["run"].endswith("-m deploy.preflight")
        assert hooks["postdeploy"][os_name]["run"].endswith("-m deploy.smoke --azure")
        # The keys exist in the vault before the app's first deploy.
        assert hooks["postprovision"][os_name]["run"].endswith("-m deploy.keys")
        assert hooks["postprovision"][os_name]["continueOnError"] is False
        # A failed check stops azd.
        assert hooks["preprovision"][os_name]["continueOnError"] is False
        assert hooks["postdeploy"][os_name]["continueOnError"] is False
    assert "deletes the resource group" in hooks["predown"]["posix"]["run"]
