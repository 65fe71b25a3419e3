"""Each identity's role assignments cover what it uses, and no more.

All assignments are made in app/rbac.bicep through four small modules under
core/security/. The test expands rbac.bicep's module loops with main.bicep's
default client applications (each given an identity) and compares the result
with the access the design calls for:

- the function app receives from the queues it triggers on (orders,
  agent-requests, agent-responses) and sends to the queues it posts to
  (agent-requests, agent-responses, alerts, every reply queue); it owns nothing;
- the host's storage: Blob Data Owner, Queue and Table Data Contributor
  (AzureWebJobsStorage, the Durable task hub, the Flex deployment package);
- Application Insights: Monitoring Metrics Publisher (Entra-authenticated telemetry);
- Cosmos DB: the built-in Data Contributor on the state and orders databases
  only (not the account; no control-plane rights);
- a client application sends to `orders` and receives from its own reply queue.
"""

from __future__ import annotations

import re

from tests.infra.bicep_model import INFRA, accessor, bicep_files, main_defaults, parse, variable

RBAC = INFRA / "app" / "rbac.bicep"
SECURITY = INFRA / "core" / "security"

# Built-in role definition ids, from Azure's built-in roles reference.
BUILT_IN = {
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Azure Service Bus Data Sender",
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Azure Service Bus Data Receiver",
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
    "00000000-0000-0000-0000-000000000002": "Cosmos DB Built-in Data Contributor",
}
# Roles that would give more than data access to what the app uses.
TOO_BROAD = {
    "090c5cfd-751d-490a-894a-3ce6f1109419": "Azure Service Bus Data Owner",
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "17d1049b-9a84-46fb-8f53-869881c3d3ab": "Storage Account Contributor",
    "5bd9cd88-fe45-4216-938b-f97437e15450": "DocumentDB Account Contributor",
}
SCOPE_BY_MODULE = {
    "servicebus-queue-role.bicep": "queue",
    "storage-role.bicep": "storage",
    "appinsights-role.bicep": "appinsights",
    "cosmos-sql-role.bicep": "cosmos-database",
}

SENDER, RECEIVER = "Azure Service Bus Data Sender", "Azure Service Bus Data Receiver"


def expected_grants(clients: list[dict]) -> set[tuple[str, str, str]]:
    app = {
        ("app", "queue:orders", RECEIVER),
        ("app", "queue:agent-requests", SENDER),
        ("app", "queue:agent-requests", RECEIVER),
        ("app", "queue:agent-responses", SENDER),
        ("app", "queue:agent-responses", RECEIVER),
        ("app", "queue:alerts", SENDER),
        ("app", "storage", "Storage Blob Data Owner"),
        ("app", "storage", "Storage Queue Data Contributor"),
        ("app", "storage", "Storage Table Data Contributor"),
        ("app", "appinsights", "Monitoring Metrics Publisher"),
        ("app", "cosmos-database:stateDatabaseName", "Cosmos DB Built-in Data Contributor"),
        ("app", "cosmos-database:ordersDatabaseName", "Cosmos DB Built-in Data Contributor"),
    }
    for c in clients:
        app.add(("app", f"queue:{c['replyQueueName']}", SENDER))
        app.add((f"client:{c['appId']}", f"queue:{c['replyQueueName']}", RECEIVER))
        app.add((f"client:{c['appId']}", "queue:orders", SENDER))
    return app


def _clients_with_identity() -> list[dict]:
    return [dict(c, principalId=f"principal-of-{c['appId']}") for c in main_defaults()["clientApplications"]]


def _value(value, env: dict, doc: dict):
    """Resolve a module parameter value within one loop iteration."""
    pair = accessor(value)
    if pair:
        base, field = pair
        base = env[base] if isinstance(base, str) and base in env else _value(base, env, doc)
        return base[field]
    if isinstance(value, dict) and value.get("operator", {}).get("type") == "index_accessor":
        ops = value["operator"]["operands"]
        return _value(ops["operand_1"], env, doc)[_value(ops["operand_2"], env, doc)]
    if isinstance(value, str) and value in env:
        return env[value]
    if isinstance(value, str) and value in doc["variables"]:
        return variable(doc, value)
    return value


def _iterations(config: dict, doc: dict, clients: list[dict]):
    if "loop_type" not in config:
        yield {}, config
        return
    detail = config["loop_type"]["detail"]
    array = detail["array_name"]
    if array == "clientApplications":
        items = clients
    elif array == "clientsWithIdentity":
        items = [c for c in clients if c["principalId"]]
    else:
        items = variable(doc, array)
    for item in items:
        yield {detail["item_name"]: item}, config["config"]


def actual_grants(clients: list[dict]) -> set[tuple[str, str, str]]:
    doc = parse(RBAC)
    grants = set()
    for module in doc["modules"].values():
        kind = SCOPE_BY_MODULE[module["detail"]["path"].rsplit("/", 1)[-1]]
        for env, config in _iterations(module["config"], doc, clients):
            env = dict(env, functionAppPrincipalId="app")
            params = {k: _value(v, env, doc) for k, v in config["params"].items()}
            principal = params["principalId"]
            if principal != "app":
                principal = next(f"client:{c['appId']}" for c in clients if c["principalId"] == principal)
            role = BUILT_IN[params.get("roleDefinitionId") or params["sqlRoleDefinitionId"]]
            scope = kind
            if kind == "queue":
                scope = f"queue:{params['queueName']}"
            elif kind == "cosmos-database":
                scope = f"cosmos-database:{params['databaseName']}"
            grants.add((principal, scope, role))
    return grants


def test_grants_are_exactly_what_each_identity_uses():
    clients = _clients_with_identity()
    actual, expected = actual_grants(clients), expected_grants(clients)
    assert actual - expected == set(), "more access than the design uses"
    assert expected - actual == set(), "access the app needs is missing"


def test_clients_without_identity_get_nothing():
    clients = main_defaults()["clientApplications"]
    assert all(c["principalId"] == "" for c in clients)
    assert {g for g in actual_grants(clients) if g[0] != "app"} == set()
    fn = variable(parse(RBAC), "clientsWithIdentity")["function"]
    assert fn["type"] == "filter" and fn["parameters"]["input_array"] == "clientApplications"


def test_role_ids_are_the_built_in_ones():
    doc = parse(RBAC)
    roles = variable(doc, "roles")
    assert {BUILT_IN[guid] for guid in roles.values()} == set(BUILT_IN.values()) - {
        "Cosmos DB Built-in Data Contributor"
    }
    assert variable(doc, "cosmosBuiltInDataContributor") == "00000000-0000-0000-0000-000000000002"


def test_no_broad_role_anywhere():
    for path in bicep_files():
        text = path.read_text().lower()
        for guid, name in TOO_BROAD.items():
            assert guid not in text, f"{path.name} grants {name}"


def test_role_assignments_are_made_only_in_the_security_modules():
    for path in bicep_files():
        for symbol, res in parse(path).get("resources", {}).items():
            if res["type"].endswith("roleAssignments") or res["type"].endswith("sqlRoleAssignments"):
                assert path.parent == SECURITY, f"{path.name}: {symbol} assigns a role outside core/security"
    users = {p for p in bicep_files() if re.search(r"core/security/", p.read_text())}
    assert users == {RBAC}


def test_service_bus_roles_are_scoped_to_one_queue():
    doc = parse(SECURITY / "servicebus-queue-role.bicep")
    queue = doc["resources"]["queue"]
    assert queue["type"] == "Microsoft.ServiceBus/namespaces/queues" and queue["existing"] is True
    assert queue["config"] == {"parent": "namespace", "name": "queueName"}
    assignment = doc["resources"]["assignment"]["config"]
    assert assignment["scope"] == "queue"


def test_data_roles_are_scoped_to_their_resource():
    for file, target in (("storage-role.bicep", "storage"), ("appinsights-role.bicep", "appInsights")):
        doc = parse(SECURITY / file)
        assert doc["resources"][target]["existing"] is True
        assert doc["resources"]["assignment"]["config"]["scope"] == target
        props = doc["resources"]["assignment"]["config"]["properties"]
        fn = props["roleDefinitionId"]["function"]
        assert fn["type"] == "subscription_resource_id"


def test_cosmos_role_is_scoped_to_one_database():
    text = (SECURITY / "cosmos-sql-role.bicep").read_text()
    assert "scope: '${account.id}/dbs/${databaseName}'" in text
    assert "roleDefinitionId: '${account.id}/sqlRoleDefinitions/${sqlRoleDefinitionId}'" in text
