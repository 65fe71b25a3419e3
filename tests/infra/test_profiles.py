"""The two deployment profiles: infra/main.parameters.json (dev: main.bicep's
serverless defaults) and infra/main.production.parameters.json (production,
docs/adr/019c-deployment-profiles.md). Bicep cannot be compiled here, so each
value is checked against the declaration it must satisfy, the production
profile's sizes against the capacity model (bench/capacity.py), and each new
parameter along its way to the resource or app setting it changes."""

from __future__ import annotations

import json

import pytest

from tests.infra.bicep_model import (
    INFRA,
    MAIN,
    evaluate,
    function_call,
    literal_int,
    main_defaults,
    module_params,
    parse,
    variable,
)
from tests.infra.test_queues import retry_budget_seconds

DEV = INFRA / "main.parameters.json"
PRODUCTION = INFRA / "main.production.parameters.json"
API = INFRA / "app" / "api.bicep"
MESSAGING = INFRA / "app" / "messaging.bicep"
STATE_STORE = INFRA / "app" / "state-store.bicep"
SCHEDULER = INFRA / "core" / "durable" / "durable-task-scheduler.bicep"

# What the production profile sets beyond the defaults, and nothing else.
PROFILE_PARAMETERS = {
    "cosmosCapacityMode",
    "cosmosAutoscaleMaxThroughput",
    "ordersCosmosAutoscaleMaxThroughput",
    "ordersTtlSeconds",
    "serviceBusSku",
    "serviceBusPremiumMessagingUnits",
    "durableBackend",
    "durableTaskSchedulerSku",
    "durableTaskSchedulerCapacity",
    "durableRetentionDaysCompleted",
    "durableRetentionDaysOther",
    "maximumInstanceCount",
    "maxProcessing",
    "supervisorScan",
    "hostLogLevel",
    "traceSamplingRatio",
    "resourceLogs",
    "vnetEnabled",
    "starterCountIntervalSeconds",
}


def given(path) -> dict:
    return {k: v["value"] for k, v in json.loads(path.read_text())["parameters"].items()}


def _decorators(name: str) -> dict:
    return {d["type"]: d.get("argument") for d in parse(MAIN)["parameters"][name]["decorators"]}


@pytest.mark.parametrize("path", [DEV, PRODUCTION], ids=lambda p: p.name)
def test_each_parameters_file_names_only_declared_parameters(path):
    declared = parse(MAIN)["parameters"]
    values = given(path)
    assert values, path.name
    assert set(values) <= set(declared), set(values) - set(declared)


@pytest.mark.parametrize("name", sorted(PROFILE_PARAMETERS))
def test_each_production_value_satisfies_its_declaration(name):
    """What the compiler would check: the type, @allowed, @minValue, @maxValue."""
    value = given(PRODUCTION)[name]
    spec = parse(MAIN)["parameters"][name]
    kind = {"int": int, "string": str, "bool": bool}[spec["type"]]
    assert type(value) is kind, (name, value)
    rules = _decorators(name)
    if "allowed" in rules:
        assert value in rules["allowed"], (name, value, rules["allowed"])
    if "min_value" in rules:
        assert value >= rules["min_value"], (name, value)
    if "max_value" in rules:
        assert value <= rules["max_value"], (name, value)


def test_the_production_file_holds_the_profile_only():
    """Per-deployment values (names, keys, the remote service, principals)
    come from the command line or azd's main.parameters.json; the production
    file is used with `az deployment group create`, which does not expand
    azd's ${VAR} placeholders, so it has none."""
    values = given(PRODUCTION)
    assert set(values) == PROFILE_PARAMETERS
    assert "${" not in PRODUCTION.read_text()


def test_dev_is_the_serverless_defaults():
    dev = given(DEV)
    assert not (set(dev) & PROFILE_PARAMETERS) - {"durableBackend"}
    assert dev["durableBackend"] == "${DURABLE_BACKEND=azureStorage}"
    defaults = main_defaults()
    assert defaults["cosmosCapacityMode"] == "Serverless"
    assert defaults["serviceBusSku"] == "Standard"
    assert defaults["durableBackend"] == "azureStorage"
    assert defaults["hostLogLevel"] == "Information"
    assert defaults["traceSamplingRatio"] == "1"
    assert defaults["ordersTtlSeconds"] == 0  # orders kept, as before profiles
    for name in ("durableRetentionDaysCompleted", "durableRetentionDaysOther"):
        # -1: no retention policy, history kept as before profiles
        assert literal_int(parse(MAIN)["parameters"][name]["default"]) == -1, name
    assert parse(MAIN)["parameters"]["resourceLogs"]["default"] is True


def test_production_is_what_the_issue_asks_for():
    prod = given(PRODUCTION)
    # Issue 46, item 6: private networking as in the official Flex templates.
    assert prod["vnetEnabled"] is True
    assert parse(MAIN)["parameters"]["vnetEnabled"]["default"] is False
    assert prod["cosmosCapacityMode"] == "Provisioned"
    assert prod["serviceBusSku"] == "Premium"
    assert (prod["durableBackend"], prod["durableTaskSchedulerSku"]) == (
        "durableTaskScheduler",
        "Dedicated",
    )
    # Completed histories purged by the scheduler's own policy; failed ones kept a week.
    assert prod["durableRetentionDaysCompleted"] == 0
    assert 0 < prod["durableRetentionDaysOther"] <= 90
    assert prod["hostLogLevel"] == "Warning"
    assert float(prod["traceSamplingRatio"]) < 1
    assert prod["resourceLogs"] is False
    assert prod["supervisorScan"] == "index"


def test_orders_outlive_everything_that_reads_them():
    """The Scheduler reads an order's document for every attempt and an
    operator's compensation can start one while the state record lives (90
    days after the order finished; a live record never expires). Cosmos
    counts TTL from the document's last write, Submit's, so the TTL must cover
    the order's longest life (the retry budget) plus the record's 90 days."""
    from domain.state_machine import FINISHED_RECORD_TTL_SECONDS

    ttl = given(PRODUCTION)["ordersTtlSeconds"]
    assert ttl >= FINISHED_RECORD_TTL_SECONDS + retry_budget_seconds() + 7 * 86400
    assert ttl == 120 * 86400


def test_the_orders_container_takes_the_ttl():
    orders = variable(parse(STATE_STORE), "ordersContainers")[0]
    doc = parse(STATE_STORE)
    assert evaluate(orders["defaultTtl"], {"ordersTtlSeconds": 0}, doc) is None
    ttl = evaluate(orders["defaultTtl"], {"ordersTtlSeconds": 10368000}, doc)
    assert ttl == 10368000
    assert module_params(parse(MAIN), "stateStore")["ordersTtlSeconds"] == "ordersTtlSeconds"


# --- the sizes against the capacity model ---------------------------------------------


@pytest.fixture(scope="module")
def production_model():
    from bench.capacity import Model

    return Model(1, "production", 1)


@pytest.fixture(scope="module")
def sized(production_model):
    return production_model.sized_parameters(production_model.p["orders_per_s_per_shard"])


@pytest.mark.parametrize(
    "name",
    [
        "cosmosAutoscaleMaxThroughput",
        "ordersCosmosAutoscaleMaxThroughput",
        "durableTaskSchedulerCapacity",
        "maximumInstanceCount",
        "maxProcessing",
    ],
)
def test_production_sizes_are_what_the_capacity_model_sizes(name, sized):
    """`python -m bench.capacity --size 400` prints these. The file must hold
    the design rate (no less than the model sizes) without paying for much
    more: past one rounding step and 10 % over, it is stale; regenerate it."""
    value, needed = given(PRODUCTION)[name], sized[name]
    step = {"cosmosAutoscaleMaxThroughput": 1000, "ordersCosmosAutoscaleMaxThroughput": 1000}
    assert needed <= value <= needed * 1.1 + step.get(name, 0), (
        f"{name}={value} in {PRODUCTION.name}, the model sizes {needed}: "
        "run python -m bench.capacity --size 400 and copy the figure"
    )


def test_the_model_reads_the_production_file(production_model):
    prod = given(PRODUCTION)
    p = production_model.p
    assert p["cosmos"]["state_max_ru_per_s"] == prod["cosmosAutoscaleMaxThroughput"]
    assert p["cosmos"]["orders_max_ru_per_s"] == prod["ordersCosmosAutoscaleMaxThroughput"]
    assert p["servicebus"]["messaging_units"] == prod["serviceBusPremiumMessagingUnits"]
    assert p["durable"]["cus_per_shard"] == prod["durableTaskSchedulerCapacity"]
    assert p["app"]["max_processing"] == prod["maxProcessing"]
    assert p["app"]["supervisor_scan"] == prod["supervisorScan"]


# --- each new parameter reaches what it changes ------------------------------------------


def test_new_parameters_are_passed_to_their_modules():
    main = parse(MAIN)
    wiring = {
        "messaging": {
            "premiumMessagingUnits": "serviceBusPremiumMessagingUnits",
            "resourceLogs": "resourceLogs",
        },
        "stateStore": {
            "autoscaleMaxThroughput": "cosmosAutoscaleMaxThroughput",
            "ordersAutoscaleMaxThroughput": "ordersCosmosAutoscaleMaxThroughput",
            "ordersTtlSeconds": "ordersTtlSeconds",
            "resourceLogs": "resourceLogs",
        },
        "durableTaskScheduler": {
            "skuCapacity": "durableTaskSchedulerCapacity",
            "retentionDaysCompleted": "durableRetentionDaysCompleted",
            "retentionDaysOther": "durableRetentionDaysOther",
        },
        "api": {
            "durablePartitionCount": "durablePartitionCount",
            "hostLogLevel": "hostLogLevel",
            "traceSamplingRatio": "traceSamplingRatio",
        },
    }
    for module, params in wiring.items():
        passed = module_params(main, module)
        for param, source in params.items():
            assert passed.get(param) == source, (module, param, passed.get(param))
    # ... and on to the resources.
    namespace = module_params(parse(MESSAGING), "namespace")
    assert (namespace["premiumCapacity"], namespace["resourceLogs"]) == (
        "premiumMessagingUnits",
        "resourceLogs",
    )
    store = parse(STATE_STORE)
    assert module_params(store, "ordersDatabase")["autoscaleMaxThroughput"] == "ordersThroughput"
    assert module_params(store, "stateDatabase")["autoscaleMaxThroughput"] == "throughput"
    for account in ("account", "ordersAccount"):
        assert module_params(store, account)["resourceLogs"] == "resourceLogs"


def test_orders_throughput_defaults_to_the_state_databases():
    spec = parse(MAIN)["parameters"]["ordersCosmosAutoscaleMaxThroughput"]
    assert spec["default"] == "cosmosAutoscaleMaxThroughput"


def test_the_log_level_and_sampling_reach_the_app_settings():
    settings = variable(parse(API), "baseSettings")
    assert settings["AzureFunctionsJobHost__logging__logLevel__default"] == "hostLogLevel"
    # The app's Python loggers at the same level (adapters.telemetry.apply_log_level).
    assert settings["APP_LOG_LEVEL"] == "hostLogLevel"
    # Issue 46, item 6: no setting name with dots (quoted in Bicep, and it may
    # not reach the host on Linux): host.json's default covers Durable's categories.
    assert not [name for name in settings if "." in name]
    assert settings["OTEL_TRACES_SAMPLER"] == "microsoft.fixed_percentage"
    assert settings["OTEL_TRACES_SAMPLER_ARG"] == "traceSamplingRatio"
    # The distro's own name for that sampler (what it compares the setting to).
    from azure.monitor.opentelemetry._constants import FIXED_PERCENTAGE_SAMPLER

    assert settings["OTEL_TRACES_SAMPLER"] == FIXED_PERCENTAGE_SAMPLER
    # host.json's only category is the one overridden.
    host = json.loads((INFRA.parent / "host.json").read_text())["logging"]["logLevel"]
    assert set(host) == {"default"}


def test_the_scheduler_gets_its_capacity_and_retention():
    doc = parse(SCHEDULER)
    sku = doc["resources"]["scheduler"]["config"]["properties"]["sku"]
    assert sku["operator"]["operands"]["true_value"] == {
        "name": "skuName",
        "capacity": "skuCapacity",
    }
    retention = doc["resources"]["retention"]["config"]
    assert retention["config"]["parent"] == "scheduler"
    assert retention["config"]["name"] == "default"
    assert retention["config"]["properties"]["retentionPolicies"] == "retentionPolicies"
    policies = variable(doc, "retentionPolicies")
    none = evaluate(policies, {"retentionDaysCompleted": -1, "retentionDaysOther": -1}, doc)
    assert none == []  # and then no policy resource: the condition is !empty(retentionPolicies)
    condition = retention["condition"]["operator"]
    assert condition["type"] == "not"
    assert function_call(condition["operands"]["bool_value"]) == (
        "empty",
        {"item_to_test": "retentionPolicies"},
    )
    prod = given(PRODUCTION)
    chosen = evaluate(
        policies,
        {
            "retentionDaysCompleted": prod["durableRetentionDaysCompleted"],
            "retentionDaysOther": prod["durableRetentionDaysOther"],
        },
        doc,
    )
    assert chosen == [
        {"retentionPeriodInDays": 7},
        {"orchestrationState": "Completed", "retentionPeriodInDays": 0},
    ]


NETWORK = INFRA / "app" / "network.bicep"


def test_vnet_enabled_integrates_the_app_and_gives_private_endpoints():
    """vnetEnabled, as the official Flex Consumption templates lay it out: a
    subnet delegated to Microsoft.App/environments for the app, private
    endpoints with private DNS zones for the host storage's blob, queue and
    table, the Service Bus namespace (Premium only) and each Cosmos DB
    account, and the host storage closed to the public network."""
    main = parse(MAIN)
    assert main["modules"]["network"]["config"]["condition"] == "vnetEnabled"
    assert module_params(main, "storage")["publicNetworkAccess"]["operator"]["operands"] == {
        "condition": "vnetEnabled",
        "true_value": "Disabled",
        "false_value": "Enabled",
    }
    api = module_params(main, "api")["virtualNetworkSubnetId"]["operator"]["operands"]
    assert api["condition"] == "vnetEnabled"
    assert (
        module_params(parse(INFRA / "app" / "api.bicep"), "functionApp")["virtualNetworkSubnetId"]
        == "virtualNetworkSubnetId"
    )
    vnet = parse(INFRA / "core" / "network" / "vnet.bicep")
    subnets = vnet["resources"]["vnet"]["config"]["properties"]["subnets"]
    app = next(s for s in subnets if s["name"] == "appSubnetName")
    assert app["properties"]["delegations"][0]["properties"]["serviceName"] == (
        "Microsoft.App/environments"
    )
    network = parse(NETWORK)
    storage = network["modules"]["storageEndpoints"]["config"]
    assert storage["loop_type"]["detail"]["array_name"] == ["blob", "queue", "table"]
    assert network["modules"]["serviceBusEndpoint"]["config"]["condition"] == "serviceBusPremium"
    sb = network["modules"]["serviceBusEndpoint"]["config"]["config"]["params"]
    assert sb["groupId"] == "namespace"
    cosmos = network["modules"]["cosmosEndpoints"]["config"]
    assert cosmos["config"]["params"]["groupId"] == "Sql"
    zones = variable(network, "zones")
    assert zones["namespace"] == "privatelink.servicebus.windows.net"
    assert zones["Sql"] == "privatelink.documents.azure.com"
    assert zones["blob"] == "privatelink.blob.${storageSuffix}"
    site = parse(INFRA / "core" / "host" / "flex-function.bicep")["resources"]["site"]
    assert "virtualNetworkSubnetId" in site["config"]["properties"]
