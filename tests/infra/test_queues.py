"""The queues the app and host.json rely on exist with the properties the
design needs, and their timing fits host.json and the retry budget.

Queue timing (infra/README.md, "Queue timing", has the same arithmetic):

- A consumer's lock must outlast its longest run. Submit and the reply bridge
  do a few store and Service Bus calls (bounded here at 30 s); the Agent works
  until the step deadline (STEP_TIMEOUT_SECONDS) and then posts its reply and
  settles (30 s more).
- host.json's maxAutoLockRenewalDuration lets the host renew a lock up to
  that long, so it must cover the longest run too.
- The agent queues de-duplicate over the whole retry budget: FAILURE_THRESHOLD
  attempts, each at most claim timeout + steps x step timeout + one Supervisor
  and one Starter tick, plus LONG_RETRIES x (LONG_RETRY_DELAY_SECONDS + one
  attempt). Service Bus allows at most 7 days.
- A poison message is dead-lettered after maxDeliveryCount deliveries, each at
  most one lock long: that must end inside the retry budget, so nothing is
  retried forever (design invariant 5).

The claim and step timeouts are the ones deployed to Azure (raised to the Flex
floor, test_timing.py), not the local template's.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.infra.bicep_model import (
    HOST_JSON,
    INFRA,
    MAIN,
    ROOT,
    SERVICEBUS_CONFIG,
    duration_seconds,
    eval_int,
    interpolate,
    main_applications,
    main_defaults,
    main_timing,
    parse,
    passthrough_defaults,
    template_settings,
    var_source,
    variable,
)

MESSAGING = INFRA / "app" / "messaging.bicep"
NAMESPACE = INFRA / "core" / "messaging" / "servicebus.bicep"
FIXED = ["agent-requests", "agent-responses", "alerts"]
# The default client applications and the smoke application (main.bicep's `applications`).
CLIENTS = main_applications()
INGRESS = [f"orders-{c['appId']}" for c in CLIENTS]
REPLIES = [c["replyQueueName"] for c in CLIENTS]
CONSUMED = [*INGRESS, "agent-requests", "agent-responses"]  # queues the app triggers on
DEDUPLICATED = ["agent-requests", "agent-responses"]
SHORT_RUN_SECONDS = 30
SETTLE_SECONDS = 30
MAX_DUPLICATE_WINDOW = 7 * 24 * 3600
MAX_LOCK = 5 * 60


def _messaging_names() -> dict[str, int]:
    """messaging.bicep's integer parameters and variables, evaluated with main.bicep's defaults."""
    names = {k: v for k, v in passthrough_defaults("messaging").items() if isinstance(v, int)}
    for var in (
        "attemptSeconds",
        "retryBudgetSeconds",
        "duplicateDetectionMarginMinutes",
        "duplicateDetectionWindowMinutes",
        "agentRequestLockMinutes",
    ):
        names[var] = eval_int(var_source(MESSAGING, var), names)
    return names


def _resolve(value, names: dict[str, int], doc: dict):
    if isinstance(value, str) and value in doc["variables"]:
        return _resolve(variable(doc, value), names, doc)
    if isinstance(value, str) and value in names:
        return names[value]
    if isinstance(value, str) and "${" in value:
        return interpolate(value, names)
    return value


def bicep_queues() -> dict[str, dict]:
    """Queue name -> properties, as deployed with main.bicep's defaults."""
    doc = parse(MESSAGING)
    names = _messaging_names()
    queues = {}
    for queue in variable(doc, "fixedQueues"):
        queues[queue["name"]] = {
            k: _resolve(v, names, doc) for k, v in _resolve(queue["properties"], names, doc).items()
        }
    ingress = variable(doc, "ingressQueues")
    assert ingress["loop_type"]["detail"]["array_name"] == "clientApplications"
    item = ingress["loop_type"]["detail"]["item_name"]
    assert ingress["config"]["name"] == f"orders-${{{item}.appId}}"
    for app in passthrough_defaults("messaging")["clientApplications"]:
        props = _resolve(ingress["config"]["properties"], names, doc)
        queues[f"orders-{app['appId']}"] = {k: _resolve(v, names, doc) for k, v in props.items()}
    reply_template = variable(doc, "replyQueues")
    # `[for app in clientApplications: {...}]`: one queue per default client application.
    for app in passthrough_defaults("messaging")["clientApplications"]:
        queues[app["replyQueueName"]] = {
            k: _resolve(v, names, doc) for k, v in _reply_properties(reply_template).items()
        }
    return queues


def _reply_properties(reply_template) -> dict:
    body = reply_template
    assert body.get("loop_type", {}).get("detail", {}).get("array_name") == "clientApplications", (
        body
    )
    item = body["config"]
    name = item["name"]["operator"]["operands"]
    assert name == {
        "operand_1": body["loop_type"]["detail"]["item_name"],
        "operand_2": "replyQueueName",
    }
    return item["properties"]


def local_queue_names() -> list[str]:
    """The queues the local emulators must serve: Bicep's, the per-application
    ingress queues included (Submit listens on them)."""
    return sorted(bicep_queues())


def config_json_queues() -> dict[str, dict]:
    config = json.loads(SERVICEBUS_CONFIG.read_text())
    (namespace,) = config["UserConfig"]["Namespaces"]
    return {q["Name"]: q["Properties"] for q in namespace["Queues"]}


def retry_budget_seconds() -> int:
    """The retry budget from the app's own settings (the template), computed here
    independently of the Bicep's formula."""
    s = {k: v for k, v in template_settings().items()}
    attempt = (
        azure_claim_timeout()
        + main_defaults()["maxRemoteStepsPerAttempt"] * azure_step_timeout()
        + int(s["SUPERVISOR_SCHEDULE"].split()[0].removeprefix("*/"))
        + int(s["STARTER_SCHEDULE"].split()[0].removeprefix("*/"))
    )
    return int(s["FAILURE_THRESHOLD"]) * attempt + int(s["LONG_RETRIES"]) * (
        int(s["LONG_RETRY_DELAY_SECONDS"]) + attempt
    )


def azure_claim_timeout() -> int:
    """Independently of main.bicep's formula: the template's value, or the Flex floor if higher."""
    from tests.infra.test_timing import expected_azure_timeouts

    return expected_azure_timeouts()[0]


def azure_step_timeout() -> int:
    from tests.infra.test_timing import expected_azure_timeouts

    return expected_azure_timeouts()[1]


def longest_run_seconds(queue: str) -> int:
    if queue == "agent-requests":
        return azure_step_timeout() + SETTLE_SECONDS
    return SHORT_RUN_SECONDS


def test_bicep_declares_the_fixed_queues_and_ingress_and_reply_queue_per_client():
    assert sorted(bicep_queues()) == sorted(FIXED + INGRESS + REPLIES)


def test_ingress_queues_are_alike():
    queues = bicep_queues()
    assert len(INGRESS) >= 1
    for name in INGRESS:
        assert queues[name] == queues[INGRESS[0]], name


def test_no_shared_ingress_queue():
    """Issue 17 item 7: a queue every client could send to would let one
    application pose as another. Only orders-<appId> queues take orders, in
    Azure and in both local emulators' configs."""
    assert "orders" not in bicep_queues()
    assert "orders" not in config_json_queues()
    official = json.loads((ROOT / "devstack" / "docker" / "servicebus-config.json").read_text())
    assert "orders" not in {
        q["Name"] for n in official["UserConfig"]["Namespaces"] for q in n["Queues"]
    }
    assert "'orders'" not in (INFRA / "app" / "rbac.bicep").read_text()
    assert "'orders'" not in (INFRA / "app" / "alerts.bicep").read_text()


def test_local_servicebus_config_names_the_same_queues():
    assert sorted(config_json_queues()) == local_queue_names()


def test_reply_queue_registry_of_the_template_names_bicep_queues():
    registry = json.loads(template_settings()["REPLY_QUEUE_REGISTRY"])
    assert set(registry.values()) <= set(bicep_queues())


def _queue_names_in_code() -> set[str]:
    """Queue names the app's code passes to Service Bus triggers and senders."""
    skip = {".venv", "node_modules", "tests", "devstack", "infra", ".git", "bench"}
    names = set()
    for path in ROOT.rglob("*.py"):
        if skip & set(path.relative_to(ROOT).parts):
            continue
        names |= set(re.findall(r"queue_name\s*=\s*[\"']([\w-]+)[\"']", path.read_text()))
        names |= set(
            re.findall(
                r"^[A-Z_]*QUEUE[A-Z_]*\s*=\s*[\"']([\w-]+)[\"']", path.read_text(), re.MULTILINE
            )
        )
    return names


def test_queues_named_in_code_exist():
    assert _queue_names_in_code() <= set(bicep_queues())


@pytest.mark.parametrize("queue", DEDUPLICATED)
def test_agent_queues_deduplicate_over_the_retry_budget(queue: str):
    props = bicep_queues()[queue]
    assert props["requiresDuplicateDetection"] is True
    window = duration_seconds(props["duplicateDetectionHistoryTimeWindow"])
    assert window >= retry_budget_seconds(), (window, retry_budget_seconds())
    assert window <= MAX_DUPLICATE_WINDOW


def test_bicep_retry_budget_matches_the_independent_arithmetic():
    assert _messaging_names()["retryBudgetSeconds"] == retry_budget_seconds()


def test_duplicate_window_follows_a_longer_budget():
    """The window is computed from the parameters, not fixed: a longer long-retry delay widens it."""
    names = {k: v for k, v in passthrough_defaults("messaging").items() if isinstance(v, int)}
    names["longRetryDelaySeconds"] = 6 * 3600
    assert names["stepTimeoutSeconds"] == main_timing()["azureStepTimeoutSeconds"]

    for var in ("attemptSeconds", "retryBudgetSeconds", "duplicateDetectionMarginMinutes"):
        names[var] = eval_int(var_source(MESSAGING, var), names)
    minutes = eval_int(var_source(MESSAGING, "duplicateDetectionWindowMinutes"), names)
    assert minutes * 60 >= names["retryBudgetSeconds"] > 6 * 3600


@pytest.mark.parametrize("queue", CONSUMED)
def test_lock_outlasts_the_longest_run(queue: str):
    lock = duration_seconds(bicep_queues()[queue]["lockDuration"])
    assert longest_run_seconds(queue) <= lock <= MAX_LOCK


@pytest.mark.parametrize("queue", CONSUMED)
def test_host_lock_renewal_covers_the_longest_run(queue: str):
    renewal = json.loads(HOST_JSON.read_text())["extensions"]["serviceBus"][
        "maxAutoLockRenewalDuration"
    ]
    hours, minutes, seconds = (int(x) for x in renewal.split(":"))
    assert (hours * 60 + minutes) * 60 + seconds >= longest_run_seconds(queue)


@pytest.mark.parametrize("queue", CONSUMED)
def test_poison_messages_are_dead_lettered_within_the_budget(queue: str):
    props = bicep_queues()[queue]
    assert 2 <= props["maxDeliveryCount"] <= 10
    assert (
        props["maxDeliveryCount"] * duration_seconds(props["lockDuration"])
        <= retry_budget_seconds()
    )
    assert props["deadLetteringOnMessageExpiration"] is True
    assert props["requiresSession"] is False


@pytest.mark.parametrize("queue", INGRESS)
def test_ingress_queue_is_bounded(queue: str):
    size = bicep_queues()[queue]["maxSizeInMegabytes"]
    assert isinstance(size, int)
    assert size <= 5120
    assert size == main_defaults()["ordersQueueMaxSizeInMegabytes"]
    allowed = parse(MAIN)["parameters"]["ordersQueueMaxSizeInMegabytes"]["decorators"]
    assert {"type": "allowed", "argument": [1024, 2048, 3072, 4096, 5120]} in allowed


@pytest.mark.parametrize("queue", INGRESS + REPLIES)
def test_client_facing_queues_deduplicate_resends(queue: str):
    assert bicep_queues()[queue]["requiresDuplicateDetection"] is True


def test_namespace_supports_duplicate_detection_and_refuses_keys():
    doc = parse(NAMESPACE)
    sku = doc["parameters"]["skuName"]
    allowed = next(d["argument"] for d in sku["decorators"] if d["type"] == "allowed")
    assert "Basic" not in allowed  # Basic has no duplicate detection
    assert "Basic" not in next(
        d["argument"]
        for d in parse(MAIN)["parameters"]["serviceBusSku"]["decorators"]
        if d["type"] == "allowed"
    )
    assert doc["resources"]["namespace"]["config"]["properties"]["disableLocalAuth"] is True


def test_readme_states_the_computed_numbers():
    readme = (INFRA / "README.md").read_text()
    window = bicep_queues()["agent-requests"]["duplicateDetectionHistoryTimeWindow"]
    assert window in readme, f"infra/README.md should state the window {window}"
    assert str(retry_budget_seconds()) in readme
    lock = bicep_queues()["agent-requests"]["lockDuration"]
    assert lock in readme


def test_namespace_module_deploys_every_queue_list():
    """bicep_queues() reads the three lists; this checks all three reach the namespace."""
    queues = parse(MESSAGING)["modules"]["namespace"]["config"]["params"]["queues"]
    assert queues == {
        "function": {
            "type": "concat",
            "parameters": {
                "arg_1": "fixedQueues",
                "arg_2": "ingressQueues",
                "arg_3": "replyQueues",
            },
        }
    }


_COMPARED = {
    "requiresDuplicateDetection": "RequiresDuplicateDetection",
    "maxDeliveryCount": "MaxDeliveryCount",
    "lockDuration": "LockDuration",
    "defaultMessageTimeToLive": "DefaultMessageTimeToLive",
    "deadLetteringOnMessageExpiration": "DeadLetteringOnMessageExpiration",
    "requiresSession": "RequiresSession",
}


# Their lock and detection window follow the step timeout and the retry budget
# (messaging.bicep), which are shorter locally (local.settings.template.json);
# test_timing.py checks each stack against its own settings.
_TIMED_BY_SETTINGS = frozenset({"agent-requests", "agent-responses"})


@pytest.mark.parametrize("queue", local_queue_names())
def test_the_local_queues_behave_as_deployed(queue: str):
    """The local emulator and the simulation (sim/bus.py) read Config.json; each
    queue must do there what the Bicep makes it do in Azure (issue 21: the
    alerts queue was assumed to drop repeats, and did not)."""
    bicep, local = bicep_queues()[queue], config_json_queues()[queue]
    compared = dict(_COMPARED)
    if queue in _TIMED_BY_SETTINGS:
        compared.pop("lockDuration")
    for bicep_key, local_key in compared.items():
        assert local.get(local_key) == bicep.get(bicep_key), (queue, bicep_key)
    if bicep["requiresDuplicateDetection"] and queue not in _TIMED_BY_SETTINGS:
        assert duration_seconds(local["DuplicateDetectionHistoryTimeWindow"]) == duration_seconds(
            bicep["duplicateDetectionHistoryTimeWindow"]
        ), queue


def test_the_alerts_queue_drops_a_repeated_incident():
    """Issue 21 item 5: an outbox entry's alert is sent again, under the same
    message id, each time the entry's status send fails; without detection one
    Error order whose reply queue was down paged operators 11 times in 5 minutes."""
    alerts = bicep_queues()["alerts"]
    assert alerts["requiresDuplicateDetection"] is True
    assert duration_seconds(alerts["duplicateDetectionHistoryTimeWindow"]) >= 86400
    assert config_json_queues()["alerts"]["RequiresDuplicateDetection"] is True
