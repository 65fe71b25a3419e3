"""The Cosmos DB layout the state store and the Supervisor rely on:
orderState (partition key /id, composite index ProcessState + CompleteBy, TTL
on for finished records), the recoveryIndex container (partition key /bucket),
and the orders database, with names equal to the app's settings' defaults."""

from __future__ import annotations

from tests.infra.bicep_model import (
    INFRA,
    MAIN,
    literal_int,
    main_defaults,
    module_params,
    parse,
    passthrough_defaults,
    template_settings,
    variable,
)

STATE_STORE = INFRA / "app" / "state-store.bicep"
ACCOUNT = INFRA / "core" / "database" / "cosmos-account.bicep"
DATABASE = INFRA / "core" / "database" / "cosmos-sql-database.bicep"


def containers(var: str) -> dict[str, dict]:
    """Container name (resolved with main.bicep's defaults) -> its definition."""
    names = passthrough_defaults("stateStore")
    return {names[c["name"]]: c for c in variable(parse(STATE_STORE), var)}


def test_names_equal_the_app_settings_defaults():
    settings = template_settings()
    names = passthrough_defaults("stateStore")
    assert names["stateDatabaseName"] == settings["STATE_DATABASE_NAME"] == "orderprocessing"
    assert names["stateContainerName"] == settings["STATE_CONTAINER_NAME"] == "orderState"
    assert names["recoveryIndexContainerName"] == "recoveryIndex"
    assert names["ordersDatabaseName"] == settings["ORDERS_DATABASE_NAME"] == "orders"
    assert names["ordersContainerName"] == settings["ORDERS_CONTAINER_NAME"] == "orders"


def test_state_container_partition_key_index_and_ttl():
    state = containers("stateContainers")["orderState"]
    assert state["partitionKeyPath"] == "/id"
    assert literal_int(state["defaultTtl"]) == -1  # TTL on; only records that set `ttl` expire
    composite = state["indexingPolicy"]["compositeIndexes"]
    assert [
        {"path": "/ProcessState", "order": "ascending"},
        {"path": "/CompleteBy", "order": "ascending"},
    ] in composite
    policy = state["indexingPolicy"]
    assert policy["indexingMode"] == "consistent"
    assert policy["excludedPaths"] == [{"path": "/*"}]  # only what is named is indexed
    included = {p["path"] for p in policy["includedPaths"]}
    # The fields the Starter and Supervisor filter on are indexed.
    for field in ("ProcessState", "CompleteBy", "LockedBy", "NotBefore"):
        assert f"/{field}/?" in included, field
    # The large, only-read-whole parts are not.
    for field in ("Steps", "History", "Compensation", "Lines"):
        assert not any(path.split("/")[1] == field for path in included), field


def test_every_field_a_state_query_names_is_indexed():
    """A query on a path outside the policy still runs, as a scan; an ORDER BY
    on one fails in Azure (the local Cosmos server indexes everything, so only
    this test can tell). Every string in the modules that query the state
    container is read, whatever its quotes, lines or f-string parts."""
    import ast
    import re
    from pathlib import Path

    from adapters import cosmos_client

    root = Path(__file__).resolve().parents[2]
    named: set[str] = set()
    for module in ("adapters/state_store.py", "adapters/console_reads.py"):
        tree = ast.parse((root / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named |= set(re.findall(r"\bc\.([A-Z][A-Za-z]*)", node.value))
    assert {"ProcessState", "CompleteBy", "PendingStatus", "AppId"} <= named  # it reads them
    # Fields a query only selects (the console's list) need no index.
    selected_only = {"LongRetries", "LastError", "History"}
    assert named - selected_only <= set(cosmos_client.STATE_QUERIED_PATHS)


def test_recovery_index_container():
    from adapters import recovery_index

    recovery = containers("stateContainers")["recoveryIndex"]
    assert recovery["partitionKeyPath"] == "/bucket"
    assert recovery["indexingPolicy"] == recovery_index.INDEX_INDEXING_POLICY


def test_orders_container():
    from adapters import cosmos_client

    orders = containers("ordersContainers")["orders"]
    assert orders["partitionKeyPath"] == "/id"
    assert orders["indexingPolicy"] == cosmos_client.ORDERS_INDEXING_POLICY


def test_databases_get_their_containers():
    doc = parse(STATE_STORE)
    state = module_params(doc, "stateDatabase")
    orders = module_params(doc, "ordersDatabase")
    assert (state["databaseName"], state["containers"]) == ("stateDatabaseName", "stateContainers")
    assert (orders["databaseName"], orders["containers"]) == (
        "ordersDatabaseName",
        "ordersContainers",
    )
    container = parse(DATABASE)["resources"]["containerResources"]["config"]
    assert container["loop_type"]["detail"]["array_name"] == "containers"


def test_serverless_by_default_provisioned_as_an_option():
    params = parse(MAIN)["parameters"]["cosmosCapacityMode"]
    assert params["default"] == "Serverless"
    allowed = next(d["argument"] for d in params["decorators"] if d["type"] == "allowed")
    assert sorted(allowed) == ["Provisioned", "Serverless"]
    account = parse(ACCOUNT)["resources"]["account"]["config"]["properties"]
    capabilities = account["capabilities"]["operator"]["operands"]
    assert capabilities["true_value"] == [{"name": "EnableServerless"}]
    assert capabilities["false_value"] == []


def test_account_refuses_keys():
    account = parse(ACCOUNT)["resources"]["account"]["config"]["properties"]
    assert account["disableLocalAuth"] is True
    assert account["disableKeyBasedMetadataWriteAccess"] is True


def test_orders_database_may_live_in_its_own_account():
    assert main_defaults()["cosmosCapacityMode"] == "Serverless"
    assert parse(MAIN)["parameters"]["ordersInSeparateAccount"]["default"] is False
    doc = parse(STATE_STORE)
    assert doc["modules"]["ordersAccount"]["config"]["condition"] == "ordersInSeparateAccount"


def test_azure_containers_match_what_the_app_creates_locally():
    """The local stack's containers (created by the app's adapters when
    COSMOS_CREATE_CONTAINERS=true) and Azure's (created here) are the same."""
    from adapters import cosmos_client, recovery_index

    state = containers("stateContainers")["orderState"]
    assert state["indexingPolicy"] == cosmos_client.STATE_INDEXING_POLICY
    assert literal_int(state["defaultTtl"]) == cosmos_client.STATE_DEFAULT_TTL
    assert state["partitionKeyPath"] == cosmos_client.PARTITION_KEY_PATH
    assert (
        containers("ordersContainers")["orders"]["partitionKeyPath"]
        == cosmos_client.PARTITION_KEY_PATH
    )
    assert (
        containers("stateContainers")["recoveryIndex"]["partitionKeyPath"]
        == recovery_index.PARTITION_KEY_PATH
    )
