"""Hardening: basic publishing off, diagnostic logs for Service Bus and Cosmos
DB, continuous backup on the Cosmos accounts, and alerts that reach someone."""

from __future__ import annotations

import json

from tests.infra.bicep_model import INFRA, MAIN, evaluate, module_params, parse

FLEX = INFRA / "core" / "host" / "flex-function.bicep"


def test_basic_publishing_credentials_are_off():
    resources = parse(FLEX)["resources"]
    policies = {
        r["config"]["name"]: r["config"]
        for r in resources.values()
        if r["type"] == "Microsoft.Web/sites/basicPublishingCredentialsPolicies"
    }
    assert set(policies) == {"ftp", "scm"}
    for policy in policies.values():
        assert policy["parent"] == "site"
        assert policy["properties"] == {"allow": False}


def _diagnostics(path):
    doc = parse(path)
    (diag,) = [
        r for r in doc["resources"].values() if r["type"] == "Microsoft.Insights/diagnosticSettings"
    ]
    return diag


def test_service_bus_and_cosmos_send_diagnostic_logs():
    for file, target in (
        ("core/messaging/servicebus.bicep", "namespace"),
        ("core/database/cosmos-account.bicep", "account"),
    ):
        diag = _diagnostics(INFRA / file)
        config = diag["config"]["config"] if "condition" in diag["config"] else diag["config"]
        assert config["scope"] == target, file
        props = config["properties"]
        assert props["workspaceId"] == "logAnalyticsWorkspaceId"
        # Every log by default; the production profile keeps metrics only
        # (resourceLogs=false: one log row per request is its largest cost).
        logs = props["logs"]["operator"]["operands"]
        assert logs["condition"] == "resourceLogs", file
        assert logs["true_value"] == [{"categoryGroup": "allLogs", "enabled": True}], file
        assert logs["false_value"] == [], file
        assert props["metrics"], file
        assert parse(INFRA / file)["parameters"]["resourceLogs"]["default"] is True, file
    # main.bicep wires the workspace through to both.
    main = parse(MAIN)
    for module in ("messaging", "stateStore"):
        assert "logAnalyticsWorkspaceId" in json.dumps(module_params(main, module)), module
    assert (
        module_params(parse(INFRA / "app" / "messaging.bicep"), "namespace")[
            "logAnalyticsWorkspaceId"
        ]
        == "logAnalyticsWorkspaceId"
    )


def test_cosmos_accounts_keep_continuous_backup():
    account = parse(INFRA / "core" / "database" / "cosmos-account.bicep")
    props = account["resources"]["account"]["config"]["properties"]
    assert props["backupPolicy"] == {
        "type": "Continuous",
        "continuousModeProperties": {"tier": "continuousBackupTier"},
    }
    assert account["parameters"]["continuousBackupTier"]["default"] in (
        "Continuous7Days",
        "Continuous30Days",
    )


def test_alert_emails_come_from_an_azd_variable():
    main = parse(MAIN)
    assert main["parameters"]["alertEmailAddresses"]["type"] == "string"
    given = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert given["alertEmailAddresses"]["value"] == "${ALERT_EMAIL_ADDRESSES}"
    assert module_params(main, "actionGroup")["emailAddresses"] == "alertEmails"
    assert evaluate(
        "alertEmails", {"alertEmailAddresses": "ops@example.com, oncall@example.com ,"}, main
    ) == [
        "ops@example.com",
        "oncall@example.com",
    ]
    assert evaluate("alertEmails", {"alertEmailAddresses": ""}, main) == []
