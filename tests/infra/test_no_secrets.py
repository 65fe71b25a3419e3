"""No key, SAS or connection string is read, output or set anywhere, and every
service refuses key-based access, so none could be used even if leaked.

The Application Insights connection string is the one exception the app
settings carry: it only locates the component (its instrumentation key is an
identifier, not a credential), and the component has local auth disabled, so
telemetry is accepted only with the app's Entra token
(APPLICATIONINSIGHTS_AUTHENTICATION_STRING=Authorization=AAD)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.infra.bicep_model import INFRA, bicep_files, parse, variable

FILES = bicep_files()
IDS = [str(p.relative_to(INFRA)) for p in FILES]

SECRET_SOURCES = re.compile(
    r"\blist\w*\(|listKeys|listConnectionStrings|listAccountSas|listServiceSas"
    r"|AccountKey|SharedAccessKey|primaryKey|secondaryKey|primaryMasterKey|connectionStrings"
    r"|InstrumentationKey",
    re.IGNORECASE,
)
SECRET_WORDS = re.compile(r"key|secret|password|sas|connection_?string|token", re.IGNORECASE)


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_no_secret_is_read(path: Path):
    # Comments may explain; code may not read.
    code = "\n".join(line.split("//", 1)[0] for line in path.read_text().splitlines())
    assert not SECRET_SOURCES.findall(code), f"{path.name}: {SECRET_SOURCES.findall(code)}"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_no_output_carries_a_secret(path: Path):
    for name, output in parse(path).get("outputs", {}).items():
        assert not SECRET_WORDS.search(name), f"{path.name}: output {name}"
        assert "secure" not in {d["type"] for d in output.get("decorators", [])}
        assert not SECRET_SOURCES.search(json.dumps(output["value"])), f"{path.name}: output {name}"


# Settings whose names sound secret but whose values are not: the Application
# Insights pair (module docstring), and the scheduler's connection string,
# which is an endpoint plus "Authentication=ManagedIdentity" and the identity's
# client id, and the host.json override that names that setting.
NAMED_LIKE_SECRETS = {
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    "DURABLE_TASK_SCHEDULER_CONNECTION_STRING",
    "AzureFunctionsJobHost__extensions__durableTask__storageProvider__connectionStringName",
}


def _all_app_settings() -> dict:
    api = parse(INFRA / "app" / "api.bicep")
    backend = variable(api, "durableBackendSettings")["operator"]["operands"]
    # (durableBackend == 'durableTaskScheduler') ? {...} : {}
    return {**variable(api, "baseSettings"), **backend["true_value"], **backend["false_value"]}


# The app's own secrets (no access to any Azure service): each comes from a
# @secure() parameter of api.bicep (test_console_auth.py checks where its value
# comes from).
APP_OWN_SECRETS = {
    "CONSOLE_CSRF_SECRET": "consoleCsrfSecret",
    # The internal queues' keys (ADR 017e): @secure() parameters, best Key Vault references.
    "AGENT_SIGNING_KEYS": "agentSigningKeys",
    "REPLY_TOKEN_KEYS": "replyTokenKeys",
}


def test_app_settings_carry_no_key():
    settings = _all_app_settings()
    assert "DURABLE_TASK_SCHEDULER_CONNECTION_STRING" in settings
    api = parse(INFRA / "app" / "api.bicep")
    for name, value in settings.items():
        text = json.dumps(value)
        assert not re.search(r"AccountKey=|SharedAccessKey=|SharedAccessSignature|sig=", text), name
        if name in APP_OWN_SECRETS:
            assert value == APP_OWN_SECRETS[name], name
            decorators = api["parameters"][value].get("decorators", [])
            assert {"type": "secure"} in decorators or "secure" in json.dumps(decorators), name
            continue
        if SECRET_WORDS.search(name):
            assert name in NAMED_LIKE_SECRETS, name
    assert "Authentication=ManagedIdentity;" in settings["DURABLE_TASK_SCHEDULER_CONNECTION_STRING"]


def _properties(file: str, resource: str) -> dict:
    return parse(INFRA / file)["resources"][resource]["config"]["properties"]


def test_every_service_refuses_key_based_access():
    storage = _properties("core/storage/storage-account.bicep", "storage")
    assert storage["allowSharedKeyAccess"] is False
    assert storage["allowBlobPublicAccess"] is False
    assert _properties("core/messaging/servicebus.bicep", "namespace")["disableLocalAuth"] is True
    assert _properties("core/database/cosmos-account.bicep", "account")["disableLocalAuth"] is True
    assert _properties("core/monitor/monitoring.bicep", "appInsights")["DisableLocalAuth"] is True


def test_deployment_package_is_read_with_the_identity():
    site = _properties("core/host/flex-function.bicep", "site")
    storage = site["functionAppConfig"]["deployment"]["storage"]
    assert storage["authentication"] == {
        "type": "UserAssignedIdentity",
        "userAssignedIdentityResourceId": "identityId",
    }
    assert site["httpsOnly"] is True
