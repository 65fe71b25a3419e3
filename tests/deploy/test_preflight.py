"""The preflight (deploy/preflight.py) against a stub subscription: the ready
one passes, and each way a first deployment would fail prints exactly one
line that says what to do.

tests/deploy/subscriptions/ready.json describes a subscription and azd
environment that pass; each case below breaks it one way."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from deploy.preflight import (
    PROVIDERS,
    SCHEDULER_PROVIDER,
    AzureCli,
    KeyVaultReference,
    NotFound,
    Refused,
    Report,
    StubSubscription,
    Unavailable,
    parse_key_vault_reference,
    run_checks,
)
from tests.infra.bicep_model import ROOT, bicep_files, parse

READY = Path(__file__).with_name("subscriptions") / "ready.json"
CLIENT = "00000000-0000-0000-0000-00000000c11e"
GROUP = "00000000-0000-0000-0000-000000000a11"
ME = "00000000-0000-0000-0000-0000000000e1"


def ready() -> dict:
    return json.loads(READY.read_text())


def check(data: dict) -> tuple[Report, dict[str, str], StubSubscription]:
    report, written = Report(out=lambda _line: None), {}
    stub = StubSubscription(data)
    run_checks(stub, {k: str(v) for k, v in data["env"].items()}, report, written.__setitem__)
    return report, written, stub


def env(**values: str) -> Callable[[dict], None]:
    return lambda data: data["env"].update(values)


def _unregistered_and_refused(data: dict) -> None:
    data["providers"]["Microsoft.ServiceBus"] = "NotRegistered"
    data["canRegisterProviders"] = False
    data["providers"]["Microsoft.DurableTask"] = "Registered"


def _graph_unreadable(data: dict) -> None:
    data["unavailable"] = {"directory": "Insufficient privileges to complete the operation."}
    # azd's own user is typed by azd (AZURE_PRINCIPAL_TYPE); one bare operator.
    data["env"]["OPERATOR_PRINCIPAL_IDS"] = f"{GROUP},{ME}:User"


def _vault_refused(data: dict) -> None:
    data["keyVaults"]["kv-orders-dev"]["refused"] = True
    data["env"]["AGENT_SIGNING_KEYS"] = ""


def _secret_missing(data: dict) -> None:
    del data["keyVaults"]["kv-orders-dev"]["secrets"]["agent-signing-keys"]


def _secret_not_keys(data: dict) -> None:
    data["keyVaults"]["kv-orders-dev"]["secrets"]["reply-token-keys"] = "not base64!"


def _quota_full(data: dict) -> None:
    data["flexApps"].append(
        {"location": "swedencentral", "maximumInstanceCount": 200, "instanceMemoryMB": 2048}
    )


# (id, how the ready subscription is broken, what the one FAIL line says)
FAILURES = [
    (
        "not signed in",
        lambda d: d.setdefault("unavailable", {}).update(account="Please run 'az login'"),
        "az is not signed in: run `az login`",
    ),
    (
        "no location",
        env(AZURE_LOCATION=""),
        "AZURE_LOCATION is not set: azd env set AZURE_LOCATION",
    ),
    (
        "no resource group",
        env(AZURE_RESOURCE_GROUP=""),
        "AZURE_RESOURCE_GROUP is not set: azd env set AZURE_RESOURCE_GROUP",
    ),
    (
        "remote url unset",
        env(REMOTE_SERVICE_URL=""),
        "REMOTE_SERVICE_URL is not set: azd env set REMOTE_SERVICE_URL https://",
    ),
    ("remote url http", env(REMOTE_SERVICE_URL="http://remote.example.com"), "is not an https URL"),
    (
        "remote url loopback",
        env(REMOTE_SERVICE_URL="https://127.0.0.1:7081"),
        "is a loopback or private address",
    ),
    (
        "remote url private",
        env(REMOTE_SERVICE_URL="https://10.1.2.3"),
        "is a loopback or private address",
    ),
    (
        "remote url localhost",
        env(REMOTE_SERVICE_URL="https://localhost:7081"),
        "names a local host",
    ),
    (
        "bad backend",
        env(DURABLE_BACKEND="netherite"),
        "DURABLE_BACKEND 'netherite' is not a backend",
    ),
    (
        "provider refused",
        _unregistered_and_refused,
        "resource provider Microsoft.ServiceBus is NotRegistered and you may not register it: ask a subscription Owner",
    ),
    (
        "providers unlisted",
        lambda d: d.setdefault("unavailable", {}).update(providers="network"),
        "resource providers could not be listed",
    ),
    (
        "no client identity",
        env(WEBSHOP_PRINCIPAL_ID=""),
        "no client application has an identity, so no order can be sent: azd env set one of WEBSHOP_PRINCIPAL_ID, PARTNER_PORTAL_PRINCIPAL_ID",
    ),
    (
        "client is a user",
        env(WEBSHOP_PRINCIPAL_ID=ME),
        f"client webshop: {ME} is a User, not a service principal",
    ),
    (
        "client unknown",
        env(WEBSHOP_PRINCIPAL_ID="00000000-0000-0000-0000-0000000dead1"),
        "client webshop: no directory object",
    ),
    (
        "operator type unreadable",
        _graph_unreadable,
        f"operator {GROUP}: its type could not be read from Microsoft Graph",
    ),
    (
        "operator mistyped",
        env(OPERATOR_PRINCIPAL_IDS=f"{GROUP}:User"),
        f"operator {GROUP} is a Group, declared User: correct OPERATOR_PRINCIPAL_IDS",
    ),
    (
        "azd user mistyped",
        env(AZURE_PRINCIPAL_TYPE="ServicePrincipal"),
        f"operator {ME} is a User, declared ServicePrincipal: correct AZURE_PRINCIPAL_TYPE",
    ),
    (
        "operator bad type",
        env(OPERATOR_PRINCIPAL_IDS=f"{GROUP}:Team"),
        "has an unknown type: write each entry as <object id>",
    ),
    (
        "operator unknown",
        env(OPERATOR_PRINCIPAL_IDS="00000000-0000-0000-0000-0000000dead2"),
        "is not in the tenant's directory",
    ),
    (
        "no flex in region",
        env(AZURE_LOCATION="westus", DURABLE_BACKEND="azureStorage"),
        "region westus does not offer Flex Consumption",
    ),
    (
        "flex regions unlisted",
        lambda d: d.setdefault("unavailable", {}).update(flexLocations="az too old"),
        "Flex Consumption regions could not be listed",
    ),
    (
        "no scheduler in region",
        env(AZURE_LOCATION="eastus"),
        "region eastus does not offer the Durable Task Scheduler",
    ),
    (
        "key vault secret missing",
        _secret_missing,
        "AGENT_SIGNING_KEYS: the Key Vault reference to "
        "https://kv-orders-dev.vault.azure.net/secrets/agent-signing-keys names a secret the vault "
        "does not hold: create secret agent-signing-keys in vault kv-orders-dev",
    ),
    (
        "key vault refused",
        _vault_refused,
        "REPLY_TOKEN_KEYS: the Key Vault reference to "
        "https://kv-orders-dev.vault.azure.net/secrets/reply-token-keys cannot be read by you",
    ),
    (
        "key vault unknown",
        env(
            AGENT_SIGNING_KEYS="@Microsoft.KeyVault(VaultName=kv-nowhere;SecretName=agent-signing-keys)"
        ),
        "AGENT_SIGNING_KEYS: the Key Vault reference to "
        "https://kv-nowhere.vault.azure.net/secrets/agent-signing-keys cannot be read",
    ),
    (
        "key vault secret not keys",
        _secret_not_keys,
        "REPLY_TOKEN_KEYS: the Key Vault reference to "
        "https://kv-orders-dev.vault.azure.net/secrets/reply-token-keys does not hold usable keys "
        "(key 1 is not base64)",
    ),
    (
        "key vault reference malformed",
        env(REPLY_TOKEN_KEYS="@Microsoft.KeyVault(SecretUri=https://kv/secrets/x/)"),
        "REPLY_TOKEN_KEYS is a malformed Key Vault reference",
    ),
    (
        "key setting not keys",
        env(AGENT_SIGNING_KEYS="c2hvcnQ"),
        "AGENT_SIGNING_KEYS key 1 has 5 bytes; at least 32 are needed",
    ),
    (
        "another setting's reference unreadable",
        env(CONSOLE_AUTH_CLIENT_ID="@Microsoft.KeyVault(VaultName=kv-orders-dev;SecretName=nope)"),
        "CONSOLE_AUTH_CLIENT_ID: the Key Vault reference to "
        "https://kv-orders-dev.vault.azure.net/secrets/nope names a secret the vault does not hold",
    ),
    ("flex quota", _quota_full, "Flex memory quota of swedencentral"),
    (
        "flex apps unlisted",
        lambda d: d.setdefault("unavailable", {}).update(flexApps="403"),
        "the subscription's Flex apps could not be listed",
    ),
]


def test_the_ready_subscription_passes_and_gets_its_operator_types_written():
    report, written, stub = check(ready())
    assert report.failed == 0, report.lines
    assert report.warned == 0, report.lines
    assert stub.registered == [SCHEDULER_PROVIDER]
    # azd's own principal, listed again without a type, is one operator: one entry.
    assert written == {
        "OPERATOR_PRINCIPAL_IDS": f"{GROUP}:Group,00000000-0000-0000-0000-0000000000c1:ServicePrincipal"
    }
    assert f"preflight: ok   operator {ME} is listed twice: assigned once" in report.lines
    assert (
        "preflight: ok   AGENT_SIGNING_KEYS: Key Vault reference to kv-orders-dev/agent-signing-keys readable"
        in report.lines
    )
    assert (
        "preflight: ok   REPLY_TOKEN_KEYS: Key Vault reference to kv-orders-dev/reply-token-keys readable"
        in report.lines
    )


def test_empty_key_settings_are_the_templates_vault():
    data = ready()
    data["env"].update(AGENT_SIGNING_KEYS="", REPLY_TOKEN_KEYS="")
    data["keyVaults"] = {}
    report, _, _ = check(data)
    assert report.failed == 0, report.lines
    assert any(
        line.startswith("preflight: ok   AGENT_SIGNING_KEYS not set: the template's Key Vault")
        for line in report.lines
    )


def test_a_service_principal_deployer_is_typed_without_graph():
    """Issue 46, item 3: with AZURE_PRINCIPAL_TYPE unset and Graph unreadable,
    `az account show` tells the signed-in principal's type."""
    data = ready()
    data["account"]["user"] = {
        "name": "11111111-0000-0000-0000-0000000000a0",
        "type": "servicePrincipal",
    }
    data["unavailable"] = {"directory": "Insufficient privileges to complete the operation."}
    del data["env"]["AZURE_PRINCIPAL_TYPE"]
    data["env"]["OPERATOR_PRINCIPAL_IDS"] = f"{GROUP}:Group"
    report, written, _ = check(data)
    assert report.failed == 0, report.lines
    assert written == {"AZURE_PRINCIPAL_TYPE": "ServicePrincipal"}
    assert any(
        line.startswith(
            f"preflight: ok   operator {ME}: ServicePrincipal (the signed-in account's type"
        )
        for line in report.lines
    )
    # A user signed in: User, the same way.
    data["account"]["user"] = {"name": "dev@example.com", "type": "user"}
    report, written, _ = check(data)
    assert report.failed == 0, report.lines
    assert written == {"AZURE_PRINCIPAL_TYPE": "User"}


def test_a_deployer_with_rights_on_the_resource_group_only_passes_with_warnings():
    """Issue 46, item 5: subscription-level reads refused (AuthorizationFailed)
    skip those checks with a WARN line each; nothing fails."""
    data = ready()
    data["providers"]["Microsoft.DurableTask"] = "Registered"
    refused = (
        "(AuthorizationFailed) The client 'dev@example.com' does not have authorization to "
        "perform action 'Microsoft.Resources/subscriptions/providers/read'"
    )
    data["refused"] = {
        key: refused for key in ("providers", "flexLocations", "schedulerLocations", "flexApps")
    }
    report, _, _ = check(data)
    assert report.failed == 0, report.lines
    warns = [line for line in report.lines if line.startswith("preflight: WARN ")]
    assert len(warns) == 4, warns
    assert warns[0].startswith("preflight: WARN resource providers not checked")
    assert any("Flex memory quota of swedencentral not checked" in line for line in warns)
    assert report.warned == 4


def test_a_resource_group_only_deployer_passes_on_the_command_line(tmp_path):
    data = ready()
    data["refused"] = {"flexApps": "(AuthorizationFailed) does not have authorization"}
    path = tmp_path / "rg-only.json"
    path.write_text(json.dumps(data))
    done = subprocess.run(
        [sys.executable, "-m", "deploy.preflight", "--stub", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "preflight: all checks passed, 1 skipped with a warning"


def test_the_cli_adapter_tells_a_refusal_from_another_failure(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda _name: "/usr/bin/az")
    refused = AzureCli(
        run=_az(
            {
                "provider list": (
                    1,
                    "ERROR: (AuthorizationFailed) The client does not have authorization",
                )
            }
        )
    )
    with pytest.raises(Refused):
        refused.provider_states()
    down = AzureCli(run=_az({"provider list": (1, "ERROR: connection reset")}))
    with pytest.raises(Unavailable) as error:
        down.provider_states()
    assert not isinstance(error.value, Refused)
    reference = KeyVaultReference("kv-orders-dev", "agent-signing-keys")
    missing = AzureCli(
        run=_az(
            {
                "keyvault secret": (
                    1,
                    "ERROR: (SecretNotFound) A secret with (name/id) agent-signing-keys was not found in this key vault.",
                )
            }
        )
    )
    with pytest.raises(NotFound):
        missing.key_vault_secret(reference)
    forbidden = AzureCli(
        run=_az(
            {
                "keyvault secret": (
                    1,
                    "ERROR: (Forbidden) Caller is not authorized to perform action on resource. Code: ForbiddenByRbac",
                )
            }
        )
    )
    with pytest.raises(Refused):
        forbidden.key_vault_secret(reference)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("plain", None),
        (
            "@Microsoft.KeyVault(SecretUri=https://kv-a.vault.azure.net/secrets/s-1/)",
            ("kv-a", "s-1", ""),
        ),
        (
            "@Microsoft.KeyVault(SecretUri=https://kv-a.vault.azure.net/secrets/s-1/0123456789abcdef0123456789abcdef)",
            ("kv-a", "s-1", "0123456789abcdef0123456789abcdef"),
        ),
        ("@Microsoft.KeyVault(VaultName=kv-a;SecretName=s-1)", ("kv-a", "s-1", "")),
        (
            "@Microsoft.KeyVault(VaultName=kv-a; SecretName=s-1; SecretVersion=v9)",
            ("kv-a", "s-1", "v9"),
        ),
    ],
)
def test_key_vault_references_are_read_in_both_forms(text, parsed):
    got = parse_key_vault_reference(text)
    assert (got if got is None else (got.vault, got.name, got.version)) == parsed


@pytest.mark.parametrize(("label", "breaks", "says"), FAILURES, ids=[f[0] for f in FAILURES])
def test_each_failure_is_one_line_saying_what_to_do(label, breaks, says):
    data = copy.deepcopy(ready())
    breaks(data)
    report, _, _ = check(data)
    fails = [line for line in report.lines if line.startswith("preflight: FAIL ")]
    assert len(fails) == 1, fails
    assert says in fails[0], fails[0]
    assert report.failed == 1
    # what, then what to do
    assert ": " in fails[0].removeprefix("preflight: FAIL ")


def test_no_alert_addresses_is_a_note_not_a_failure():
    data = ready()
    data["env"]["ALERT_EMAIL_ADDRESSES"] = ""
    report, _, _ = check(data)
    assert report.failed == 0
    assert any("ALERT_EMAIL_ADDRESSES is empty" in line for line in report.lines)
    data["env"]["ALERT_EMAIL_ADDRESSES"] = "ops@example.com"
    report, _, _ = check(data)
    assert not any("ALERT_EMAIL_ADDRESSES" in line for line in report.lines)


def test_the_azure_storage_backend_needs_no_scheduler():
    data = ready()
    data["env"].update(DURABLE_BACKEND="azureStorage", AZURE_LOCATION="eastus")
    data["flexApps"] = []
    report, _, stub = check(data)
    assert report.failed == 0, report.lines
    assert stub.registered == []


def test_the_command_line_prints_the_lines_and_exits_nonzero_on_a_failure(tmp_path):
    passed = subprocess.run(
        [sys.executable, "-m", "deploy.preflight", "--stub", str(READY)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.splitlines()[-1] == "preflight: all checks passed"
    broken = ready()
    broken["env"]["REMOTE_SERVICE_URL"] = ""
    broken["env"]["WEBSHOP_PRINCIPAL_ID"] = ""
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    failed = subprocess.run(
        [sys.executable, "-m", "deploy.preflight", "--stub", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failed.returncode == 1
    fails = [line for line in failed.stdout.splitlines() if line.startswith("preflight: FAIL")]
    assert len(fails) == 2, failed.stdout
    assert failed.stdout.splitlines()[-1] == "preflight: 2 check(s) failed; nothing was provisioned"


def test_the_providers_are_those_of_every_resource_type_deployed():
    namespaces = {
        res["type"].split("/")[0]
        for path in bicep_files()
        for res in parse(path).get("resources", {}).values()
    }
    # Microsoft.Authorization and Microsoft.Resources (the resource groups of
    # infra/shards.bicep) are registered in every subscription.
    always = {"Microsoft.Authorization", "Microsoft.Resources"}
    assert namespaces - always == {*PROVIDERS, SCHEDULER_PROVIDER}


def test_the_client_list_is_read_from_main_parameters_json():
    data = ready()
    data["env"]["PARTNER_PORTAL_PRINCIPAL_ID"] = CLIENT
    data["env"]["WEBSHOP_PRINCIPAL_ID"] = ""
    report, _, _ = check(data)
    assert report.failed == 0
    assert f"preflight: ok   client partner-portal: service principal {CLIENT}" in report.lines


def _az(outputs: dict[str, tuple[int, str]]):
    """A stand-in for subprocess.run: az's JSON output (or error) by subcommand."""

    def run(args, **_kwargs):
        key = " ".join(args[1:3])
        code, text = outputs[key]
        return subprocess.CompletedProcess(
            args, code, text if code == 0 else "", text if code else ""
        )

    return run


def test_the_cli_adapter_reads_graph_types_and_not_found(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda _name: "/usr/bin/az")
    group = AzureCli(run=_az({"rest --method": (0, '{"@odata.type": "#microsoft.graph.group"}')}))
    assert group.principal_type(GROUP) == "Group"
    missing = AzureCli(
        run=_az(
            {
                "rest --method": (
                    1,
                    'ERROR: Not Found({"error":{"code":"Request_ResourceNotFound"}})',
                )
            }
        )
    )
    with pytest.raises(NotFound):
        missing.principal_type(GROUP)
    refused = AzureCli(
        run=_az({"rest --method": (1, "ERROR: Forbidden(Authorization_RequestDenied)")})
    )
    with pytest.raises(Unavailable):
        refused.principal_type(GROUP)


def test_no_client_application_may_take_the_smoke_applications_name(monkeypatch, tmp_path):
    from deploy import preflight
    from domain.ids import SMOKE_APP_ID

    assert preflight.SMOKE_APP_ID == SMOKE_APP_ID
    parameters = json.loads(preflight.PARAMETERS.read_text())
    parameters["parameters"]["clientApplications"]["value"][1]["appId"] = SMOKE_APP_ID
    path = tmp_path / "main.parameters.json"
    path.write_text(json.dumps(parameters))
    monkeypatch.setattr(preflight, "PARAMETERS", path)
    report, _, _ = check(ready())
    fails = [line for line in report.lines if line.startswith("preflight: FAIL ")]
    assert fails == [
        "preflight: FAIL client application 'smoke' is the smoke application's name: rename it "
        "in infra/main.parameters.json: the smoke application's orders are answered by a no-op "
        "and never reach the remote service"
    ]
