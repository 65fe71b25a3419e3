"""Alert rules exist for the events operators must see, and the log queries
match what the app actually writes.

The log alerts parse message text (it reaches Application Insights whatever
the worker does with structured fields), so this test pins the two formats
to the app's source: if the app's wording changes, the queries must too."""

from __future__ import annotations

from tests.infra.bicep_model import INFRA, MAIN, ROOT, module_params, parse, variable

ALERTS = INFRA / "app" / "alerts.bicep"


def _by_name(var: str) -> dict[str, dict]:
    return {a["name"]: a for a in variable(parse(ALERTS), var)}


def test_log_alerts_for_error_compensation_failed_and_backlog():
    alerts = _by_name("logAlerts")
    assert set(alerts) == {
        "order-error",
        "order-compensation-failed",
        "pending-backlog",
        "client-impersonation",
    }
    assert (
        'AlertKind in ("AppIdMismatch", "ReplyQueueNotAllowed")'
        in alerts["client-impersonation"]["query"]
    )
    assert 'AlertKind == "OrderError"' in alerts["order-error"]["query"]
    assert 'AlertKind == "CompensationFailed"' in alerts["order-compensation-failed"]["query"]
    assert alerts["pending-backlog"]["threshold"] == "pendingBacklogThreshold"


def test_queue_metric_alerts_for_dead_letters_and_pending_work():
    alerts = _by_name("queueAlerts")
    dead = alerts["dead-lettered-messages"]
    assert (dead["metricName"], dead["entities"], dead["threshold"]) == (
        "DeadletteredMessages",
        ["*"],
        0,
    )
    assert alerts["operator-alerts-pending"]["entities"] == ["alerts"]
    # Every ingress queue, and only those: there is no shared `orders` queue.
    assert alerts["orders-queue-backlog"]["entities"] == "ingressQueueNames"
    # main.bicep passes messaging.outputs.ingressQueueNames (pycep nests `a.b.c` as a.(b.c)).
    passed = module_params(parse(MAIN), "alerts")["ingressQueueNames"]["operator"]["operands"]
    assert passed["operand_1"] == "messaging"
    assert passed["operand_2"]["operator"]["operands"] == {
        "operand_1": "outputs",
        "operand_2": "ingressQueueNames",
    }
    # An empty list would be an alert rule with no dimension value: refused at deployment time.
    assert {"type": "min_length", "argument": 1} in parse(ALERTS)["parameters"][
        "ingressQueueNames"
    ]["decorators"]
    assert {"type": "min_length", "argument": 1} in parse(MAIN)["parameters"]["clientApplications"][
        "decorators"
    ]


def test_backlog_alert_fires_before_admission_control_rejects():
    params = parse(MAIN)["parameters"]
    assert "pendingBacklogLimit" in str(params["pendingBacklogAlertThreshold"]["default"])
    assert (
        module_params(parse(MAIN), "alerts")["pendingBacklogThreshold"]
        == "pendingBacklogAlertThreshold"
    )


def test_queries_match_the_apps_log_messages():
    queries = variable(parse(ALERTS), "operatorAlerts") + variable(parse(ALERTS), "pendingGauge")
    assert 'startswith "operator alert "' in queries
    assert '" for " Subject:string' in queries
    assert 'Subject startswith "order "' in queries
    assert 'startswith "starter: pending="' in queries
    alerts_source = (ROOT / "reporting" / "alerts.py").read_text()
    assert '"operator alert %s for %s: %s"' in alerts_source
    assert 'f"order {alert.OrderID}"' in alerts_source
    assert '"CompensationFailed"' in (ROOT / "orchestrators" / "order_workflow.py").read_text()
    # The Supervisor's Error and the workflow's Failed/CompensationFailed send
    # their alert from the record's outbox, with these kinds.
    outbox = (ROOT / "reporting" / "status.py").read_text()
    assert '"OrderError"' in outbox
    assert '"CompensationFailed"' in outbox
    assert (
        '"starter: pending=%d processing=%d' in (ROOT / "orchestrators" / "starter.py").read_text()
    )


def test_the_backlog_alert_reads_the_backlog_metric():
    query = variable(parse(ALERTS), "pendingGauge")
    assert "customMetrics" in query
    assert 'name == "orders.backlog"' in query
    assert 'customDimensions["state"]) == "Pending"' in query
    telemetry = (ROOT / "adapters" / "telemetry.py").read_text()
    assert '"orders.backlog"' in telemetry
    assert (
        '.backlog.set(report.pending, {"state": "Pending"})'
        in (ROOT / "orchestrators" / "starter.py").read_text()
    )


def test_alert_rules_notify_the_action_group():
    resources = parse(ALERTS)["resources"]
    log_rule = resources["logAlertRules"]["config"]["config"]["properties"]
    assert log_rule["actions"]["actionGroups"] == ["actionGroupId"]
    assert log_rule["scopes"] == ["applicationInsightsId"]
    metric_rule = resources["queueAlertRules"]["config"]["config"]["properties"]
    assert metric_rule["actions"] == [{"actionGroupId": "actionGroupId"}]
    assert metric_rule["scopes"] == ["serviceBusNamespaceId"]
