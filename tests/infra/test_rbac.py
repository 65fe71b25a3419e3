"""Each identity's role assignments cover what it uses, and no more.

All assignments are made in app/rbac.bicep through four small modules under
core/security/. The test expands rbac.bicep's module loops with main.bicep's
default client applications (each given an identity) and compares the result
with the access the design calls for:

- the function app receives from the queues it triggers on (each
  application's ingress queue, agent-requests, agent-responses) and from
  alerts (the console peeks it and its dead letters), and sends to the queues
  it posts to (agent-requests, agent-responses, alerts, every reply queue, and
  the ingress queues for Submit's delayed retries); it holds Data Owner on its
  trigger queues only (the target-based scaler reads their message counts,
  which needs the Manage right), and never receives from a reply queue (only
  the client application may);
- the host's storage: Blob Data Owner, Queue and Table Data Contributor
  (AzureWebJobsStorage, the Durable task hub, the Flex deployment package);
- Application Insights: Monitoring Metrics Publisher (Entra-authenticated telemetry);
- Cosmos DB: the built-in Data Contributor on the state and orders databases
  only (not the account; no control-plane rights);
- the Durable Task Scheduler (durableTaskScheduler backend only): Durable Task
  Data Contributor;
- a client application sends to its own ingress queue `orders-<appId>` and
  receives from its own reply queue, nothing else;
- operators (AZURE_PRINCIPAL_ID and OPERATOR_PRINCIPAL_IDS) read and settle
  operator alerts (Receiver on `alerts`) and work on the state database
  (resubmit, compensate); they consume no work queue and send as no client;
- every Azure RBAC assignment names the principal's own type: the app's
  identity and client applications ServicePrincipal, each operator its own
  (User, Group or ServicePrincipal; empty when not given, and ARM looks it up).

The grants go to the user-assigned identity, which exists before the app.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.infra.bicep_model import (
    INFRA,
    MAIN,
    bicep_files,
    evaluate,
    main_applications,
    main_defaults,
    module_params,
    parse,
    variable,
)

RBAC = INFRA / "app" / "rbac.bicep"
SECURITY = INFRA / "core" / "security"

DATA_OWNER_GUID = "090c5cfd-751d-490a-894a-3ce6f1109419"
# Built-in role definition ids, from Azure's built-in roles reference.
BUILT_IN = {
    "d6a5505f-6ebb-45a4-896e-ac8274cfc0ac": "Durable Task Data Reader",
    "4633458b-17de-408a-b874-0445c86b69e6": "Key Vault Secrets User",
    "b86a8fe4-44ce-4948-aee5-eccb2c155cd7": "Key Vault Secrets Officer",
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Azure Service Bus Data Sender",
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Azure Service Bus Data Receiver",
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
    "00000000-0000-0000-0000-000000000002": "Cosmos DB Built-in Data Contributor",
    "0ad04412-c4d5-4796-b79c-f76d14c8d402": "Durable Task Data Contributor",
    DATA_OWNER_GUID: "Azure Service Bus Data Owner",
}
# Roles that would give more than data access to what the app uses.
TOO_BROAD = {
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
    "durabletask-role.bicep": "durabletask",
    "keyvault-role.bicep": "keyvault",
}

SENDER, RECEIVER = "Azure Service Bus Data Sender", "Azure Service Bus Data Receiver"
OWNER = "Azure Service Bus Data Owner"


DATA_CONTRIBUTOR = "Cosmos DB Built-in Data Contributor"
OPERATORS = [
    {"principalId": "operator-1", "principalType": "User"},
    {"principalId": "operator-2", "principalType": "Group"},
]


def expected_grants(
    clients: list[dict], operators: list[dict] = (), scheduler: bool = False
) -> set[tuple[str, str, str]]:
    app = {
        ("app", "queue:agent-requests", SENDER),
        ("app", "queue:agent-requests", RECEIVER),
        ("app", "queue:agent-requests", OWNER),  # the scaler counts messages
        ("app", "queue:agent-responses", SENDER),
        ("app", "queue:agent-responses", RECEIVER),
        ("app", "queue:agent-responses", OWNER),
        ("app", "queue:alerts", SENDER),
        # The console peeks alerts and alerts/$deadletterqueue (a queue's
        # Receiver covers its dead-letter queue: no finer scope exists).
        ("app", "queue:alerts", RECEIVER),
        ("app", "storage", "Storage Blob Data Owner"),
        ("app", "storage", "Storage Queue Data Contributor"),
        ("app", "storage", "Storage Table Data Contributor"),
        ("app", "appinsights", "Monitoring Metrics Publisher"),
        ("app", "cosmos-database:stateDatabaseName", DATA_CONTRIBUTOR),
        ("app", "cosmos-database:ordersDatabaseName", DATA_CONTRIBUTOR),
        # AGENT_SIGNING_KEYS and REPLY_TOKEN_KEYS: Key Vault references.
        ("app", "keyvault", "Key Vault Secrets User"),
    }
    if scheduler:
        app.add(("app", "durabletask", "Durable Task Data Contributor"))
    for c in clients:
        ingress = f"orders-{c['appId']}"
        app.add(("app", f"queue:{ingress}", RECEIVER))
        app.add(("app", f"queue:{ingress}", OWNER))
        app.add(("app", f"queue:{ingress}", SENDER))  # Submit's delayed retries
        app.add(("app", f"queue:{c['replyQueueName']}", SENDER))
        if c["principalId"]:
            # Its own ingress queue and its own reply queue, nothing else.
            app.add((f"client:{c['appId']}", f"queue:{c['replyQueueName']}", RECEIVER))
            app.add((f"client:{c['appId']}", f"queue:{ingress}", SENDER))
    smoke = any(c["appId"] == SMOKE for c in clients)
    if operators:
        # azd's principal (the first operator) creates the keys after provision
        # (deploy/keys.py) in the template's own vault.
        app.add(
            (f"operator:{operators[0]['principalId']}", "keyvault", "Key Vault Secrets Officer")
        )
    for op in operators:
        # python -m cli alerts (settles operator alerts), and
        # show/list/stuck/resubmit/compensate (the state database). Nothing else.
        who = f"operator:{op['principalId']}"
        app.add((who, "queue:alerts", RECEIVER))
        app.add((who, "cosmos-database:stateDatabaseName", DATA_CONTRIBUTOR))
        if scheduler:
            # The scheduler's dashboard, read-only.
            app.add((who, "durabletask", "Durable Task Data Reader"))
        if smoke:
            # The smoke test after a deploy (deploy/smoke.py), run as the deployer.
            app.add((who, "queue:orders-smoke", SENDER))
            app.add((who, "queue:replies-smoke", RECEIVER))
    return app


SMOKE = "smoke"


def _clients_with_identity() -> list[dict]:
    """main.bicep's applications as rbac.bicep gets them: the default client
    applications, each given an identity, and the smoke application (none)."""
    return [
        c if c["appId"] == SMOKE else dict(c, principalId=f"principal-of-{c['appId']}")
        for c in main_applications()
    ]


def _env(clients: list[dict], operators: list[dict], scheduler: bool) -> dict:
    return {
        "functionAppPrincipalId": "app",
        "clientApplications": clients,
        "operators": list(operators),
        "smokeAppId": SMOKE if any(c["appId"] == SMOKE for c in clients) else "",
        "keyVaultName": "kv",
        "keyVaultResourceGroupName": "rg",
        # main.bicep: azd's principal (first) on the template's own vault.
        "keyVaultSecretsOfficers": list(operators)[:1],
        "durableTaskSchedulerName": "dts" if scheduler else "",
        # Names of the scope, kept symbolic.
        "stateDatabaseName": "stateDatabaseName",
        "ordersDatabaseName": "ordersDatabaseName",
    }


def actual_grants(
    clients: list[dict], operators: list[dict] = (), scheduler: bool = False
) -> set[tuple[str, str, str]]:
    """Expand every role module of rbac.bicep (loops and conditions included)."""
    return {g[:3] for g in typed_grants(clients, operators, scheduler)}


def typed_grants(
    clients: list[dict], operators: list[dict] = (), scheduler: bool = False
) -> set[tuple[str, str, str, str | None]]:
    """(who, scope, role, principalType as deployed) of every grant; the
    principalType is None for Cosmos SQL role assignments, which have none."""
    doc = parse(RBAC)
    operator_ids = {op["principalId"] for op in operators}
    env = _env(clients, operators, scheduler)
    grants = set()
    for module in doc["modules"].values():
        kind = SCOPE_BY_MODULE[module["detail"]["path"].rsplit("/", 1)[-1]]
        config = module["config"]
        if config.get("condition") is not None and not evaluate(config["condition"], env, doc):
            continue
        iterations = [(env, config)]
        if "loop_type" in config:
            detail = config["loop_type"]["detail"]
            items = evaluate(detail["array_name"], env, doc)
            iterations = [({**env, detail["item_name"]: item}, config["config"]) for item in items]
        elif "condition" in config:
            iterations = [(env, config["config"])]
        for scope_env, body in iterations:
            params = {k: evaluate(v, scope_env, doc) for k, v in body["params"].items()}
            principal = params["principalId"]
            if principal == "app":
                who = "app"
            elif principal in operator_ids:
                who = f"operator:{principal}"
            else:
                who = next(f"client:{c['appId']}" for c in clients if c["principalId"] == principal)
            role = BUILT_IN[params.get("roleDefinitionId") or params["sqlRoleDefinitionId"]]
            scope = kind
            if kind == "queue":
                scope = f"queue:{params['queueName']}"
            elif kind == "cosmos-database":
                scope = f"cosmos-database:{params['databaseName']}"
            principal_type = None
            if kind != "cosmos-database":
                principal_type = params.get("principalType", _module_default_type(module))
            grants.add((who, scope, role, principal_type))
    return grants


def _module_default_type(module: dict) -> str:
    target = SECURITY / module["detail"]["path"].rsplit("/", 1)[-1]
    return parse(target)["parameters"]["principalType"]["default"]


@pytest.mark.parametrize("scheduler", [False, True], ids=["azureStorage", "durableTaskScheduler"])
@pytest.mark.parametrize("operators", [[], OPERATORS], ids=["no-operators", "operators"])
def test_grants_are_exactly_what_each_identity_uses(operators, scheduler):
    clients = _clients_with_identity()
    actual = actual_grants(clients, operators, scheduler)
    expected = expected_grants(clients, operators, scheduler)
    assert actual - expected == set(), "more access than the design uses"
    assert expected - actual == set(), "access the app needs is missing"


def test_a_client_can_send_only_to_its_own_ingress_and_read_only_its_own_replies():
    clients = _clients_with_identity()
    grants = actual_grants(clients)
    for c in clients:
        if c["appId"] == SMOKE:
            continue  # no identity: the operators send and read its queues
        mine = {g for g in grants if g[0] == f"client:{c['appId']}"}
        assert mine == {
            (f"client:{c['appId']}", f"queue:orders-{c['appId']}", SENDER),
            (f"client:{c['appId']}", f"queue:{c['replyQueueName']}", RECEIVER),
        }
    # There is no shared ingress queue: nobody holds any role on a queue named `orders`.
    assert not {g for g in actual_grants(clients, OPERATORS) if g[1] == "queue:orders"}


def test_the_app_never_reads_a_reply_queue():
    """DESIGN §2: only the client application may read its reply queue, so the
    console shows no reply queue in Azure rather than the app being granted it."""
    clients = _clients_with_identity()
    grants = actual_grants(clients, OPERATORS, True)
    replies = {f"queue:{c['replyQueueName']}" for c in clients}
    assert not {g for g in grants if g[0] == "app" and g[1] in replies and g[2] == RECEIVER}
    # Every queue whose dead letters the console lists in Azure is one the app may read.
    from console.views import WORK_QUEUES

    readable = {g[1].removeprefix("queue:") for g in grants if g[0] == "app" and g[2] == RECEIVER}
    assert set(WORK_QUEUES) <= readable, set(WORK_QUEUES) - readable


def test_app_identity_is_the_user_assigned_one():
    """The grants go to the identity created before the app, not to the site."""
    params = module_params(parse(MAIN), "rbac")
    # pycep reads identity.outputs.principalId as identity . (outputs . principalId)
    assert json.dumps(params["functionAppPrincipalId"], sort_keys=True) == json.dumps(
        {
            "operator": {
                "type": "property_accessor",
                "operands": {
                    "operand_1": "identity",
                    "operand_2": {
                        "operator": {
                            "type": "property_accessor",
                            "operands": {"operand_1": "outputs", "operand_2": "principalId"},
                        }
                    },
                },
            }
        },
        sort_keys=True,
    )
    assert (
        parse(MAIN)["modules"]["identity"]["detail"]["path"]
        == "core/identity/user-assigned-identity.bicep"
    )
    assert "api" not in str(params), "rbac must not wait for (or depend on) the site"
    api = parse(MAIN)["modules"]["api"]["config"]
    assert "rbac" in api.get("dependsOn", []), "the app should start with its grants in place"


def test_cosmos_sql_role_assignments_run_one_at_a_time():
    """Cosmos DB answers a concurrent control-plane operation on the same
    account with 412: every SQL role assignment waits for the one before."""
    modules = parse(RBAC)["modules"]
    cosmos = [
        name for name, m in modules.items() if m["detail"]["path"].endswith("cosmos-sql-role.bicep")
    ]
    assert len(cosmos) >= 3
    deps = {}
    for name in cosmos:
        config = modules[name]["config"]
        body = config["config"] if "loop_type" in config else config
        deps[name] = body.get("dependsOn", [])
        if "loop_type" in config:
            assert {"type": "batchSize", "argument": 1} in modules[name]["decorators"], (
                f"{name}: loop without @batchSize(1)"
            )
    # A single chain: one root, and each other assignment depends on exactly one earlier one.
    roots = [n for n in cosmos if not deps[n]]
    assert len(roots) == 1, roots
    order = [roots[0]]
    while len(order) < len(cosmos):
        nxt = [n for n in cosmos if deps[n] == [order[-1]]]
        assert len(nxt) == 1, f"after {order[-1]}: {nxt}"
        order.append(nxt[0])


def test_operators_come_from_azd_and_the_operator_list_each_with_its_type():
    main = parse(MAIN)
    env = {
        "principalId": "me",
        "principalType": "User",
        "operatorPrincipalIds": " ops-group:Group , me:User, ci-sp : ServicePrincipal, bare,",
    }
    assert evaluate("operators", env, main) == [
        {"principalId": "me", "principalType": "User"},
        {"principalId": "ops-group", "principalType": "Group"},
        {"principalId": "ci-sp", "principalType": "ServicePrincipal"},
        {"principalId": "bare", "principalType": ""},
    ]
    none = {"principalId": "", "principalType": "User", "operatorPrincipalIds": ""}
    assert evaluate("operators", none, main) == []


@pytest.mark.parametrize("listed", ["me", "me:User", "ops:Group,me,me:ServicePrincipal"])
def test_one_operator_listed_twice_gets_one_assignment_of_each_role(listed):
    """Issue 46, item 4: azd's own id listed again in OPERATOR_PRINCIPAL_IDS
    (without a type when the preflight's rewrite was skipped: --no-hooks, az
    deployment) made two assignments with one name. Each principal counts
    once, with the first type given (azd's)."""
    main = parse(MAIN)
    env = {"principalId": "me", "principalType": "User", "operatorPrincipalIds": listed}
    operators = evaluate("operators", env, main)
    assert [op["principalId"] for op in operators].count("me") == 1
    assert operators[0] == {"principalId": "me", "principalType": "User"}
    # Every role module's deployment name is unique, so no assignment is made twice.
    doc = parse(RBAC)
    rbac_env = _env(_clients_with_identity(), operators, True)
    for name, module in doc["modules"].items():
        config = module["config"]
        if "loop_type" not in config:
            continue
        detail = config["loop_type"]["detail"]
        items = evaluate(detail["array_name"], rbac_env, doc)
        names = [
            evaluate(config["config"]["name"], {**rbac_env, detail["item_name"]: item}, doc)
            for item in items
        ]
        assert len(names) == len(set(names)), (name, names)
    assert module_params(main, "rbac")["operators"] == "operators"
    given = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert given["principalId"]["value"] == "${AZURE_PRINCIPAL_ID}"
    assert given["operatorPrincipalIds"]["value"] == "${OPERATOR_PRINCIPAL_IDS}"
    assert given["principalType"]["value"].startswith("${AZURE_PRINCIPAL_TYPE")


def test_each_principal_is_assigned_with_its_own_type():
    """Issue 24, risk 2: one principalType for every operator (azd's user
    included) failed a group with UnmatchedPrincipalType."""
    operators = [
        *OPERATORS,
        {"principalId": "ci", "principalType": "ServicePrincipal"},
        {"principalId": "unknown", "principalType": ""},
    ]
    by_id = {op["principalId"]: op["principalType"] for op in operators}
    for who, scope, role, principal_type in typed_grants(_clients_with_identity(), operators, True):
        if who.startswith("operator:") and principal_type is not None:
            expected = by_id[who.removeprefix("operator:")]
            assert principal_type == expected, (who, scope, role)
        elif principal_type is not None:
            assert principal_type == "ServicePrincipal", (who, scope, role)
    # An empty type is left out, not sent as "".
    module = (SECURITY / "servicebus-queue-role.bicep").read_text()
    assert "principalType: empty(principalType) ? null : principalType" in module


def test_operators_consume_no_work_queue_and_send_as_no_client():
    """Issue 24, risk 6: Receiver on a queue is the right to consume it."""
    grants = actual_grants(_clients_with_identity(), OPERATORS, True)
    mine = {g for g in grants if g[0].startswith("operator:")}
    queues = {(g[1], g[2]) for g in mine if g[1].startswith("queue:")}
    # The alerts, and the smoke application's two queues (the smoke test).
    assert queues == {
        ("queue:alerts", RECEIVER),
        ("queue:orders-smoke", SENDER),
        ("queue:replies-smoke", RECEIVER),
    }


def test_data_owner_only_for_the_app_on_its_trigger_queues():
    """Issue 24, risk 5: the target-based scaler needs the Manage right to
    read a trigger queue's message count; Data Owner is the only built-in
    data role that has it, so the app holds it there and nowhere else."""
    clients = _clients_with_identity()
    owners = {g for g in actual_grants(clients, OPERATORS, True) if g[2] == OWNER}
    triggers = {"agent-requests", "agent-responses"} | {f"orders-{c['appId']}" for c in clients}
    assert owners == {("app", f"queue:{q}", OWNER) for q in triggers}
    for path in bicep_files():
        if path != RBAC:
            assert DATA_OWNER_GUID not in path.read_text(), path


def test_clients_without_identity_get_nothing():
    clients = main_defaults()["clientApplications"]
    assert all(c["principalId"] == "" for c in clients)
    assert {g for g in actual_grants(clients) if g[0] != "app"} == set()
    assert actual_grants(clients) == expected_grants(clients)
    fn = variable(parse(RBAC), "clientsWithIdentity")["function"]
    assert fn["type"] == "filter"
    assert fn["parameters"]["input_array"] == "clientApplications"


def test_role_ids_are_the_built_in_ones():
    doc = parse(RBAC)
    roles = variable(doc, "roles")
    assert {BUILT_IN[guid] for guid in roles.values()} == set(BUILT_IN.values()) - {
        DATA_CONTRIBUTOR
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
            if res["type"].endswith("roleAssignments") or res["type"].endswith(
                "sqlRoleAssignments"
            ):
                assert path.parent == SECURITY, (
                    f"{path.name}: {symbol} assigns a role outside core/security"
                )
    users = {p for p in bicep_files() if re.search(r"core/security/", p.read_text())}
    assert users == {RBAC}


def test_service_bus_roles_are_scoped_to_one_queue():
    doc = parse(SECURITY / "servicebus-queue-role.bicep")
    queue = doc["resources"]["queue"]
    assert queue["type"] == "Microsoft.ServiceBus/namespaces/queues"
    assert queue["existing"] is True
    assert queue["config"] == {"parent": "namespace", "name": "queueName"}
    assignment = doc["resources"]["assignment"]["config"]
    assert assignment["scope"] == "queue"


def test_data_roles_are_scoped_to_their_resource():
    for file, target in (
        ("storage-role.bicep", "storage"),
        ("appinsights-role.bicep", "appInsights"),
        ("durabletask-role.bicep", "scheduler"),
    ):
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


def test_deployment_names_stay_unique_within_64_characters():
    """Module deployment names are cut to 64 characters; two grants must never
    end up with one name (the second would overwrite the first)."""
    doc = parse(RBAC)
    clients = [
        dict(
            c,
            appId=f"{c['appId']}-with-a-long-suffix",
            replyQueueName=f"replies-{c['appId']}-with-a-long-suffix",
            principalId=f"principal-{i}",
        )
        for i, c in enumerate(_clients_with_identity())
    ]
    env = _env(
        clients,
        [
            {"principalId": "11111111-1111-1111-1111-111111111111", "principalType": "User"},
            {"principalId": "22222222-2222-2222-2222-222222222222", "principalType": "Group"},
        ],
        True,
    )
    names = []
    for module in doc["modules"].values():
        config = module["config"]
        if "loop_type" in config:
            detail = config["loop_type"]["detail"]
            for item in evaluate(detail["array_name"], env, doc):
                names.append(
                    evaluate(config["config"]["name"], {**env, detail["item_name"]: item}, doc)
                )
        else:
            names.append(evaluate((config.get("config") or config)["name"], env, doc))
    assert all(len(n) <= 64 for n in names)
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
