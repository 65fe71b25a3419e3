"""The function app's settings in Azure cover every setting the app reads
locally, in identity-based form, with the same defaults.

The list of settings is local.settings.template.json. Each name maps to what
the Function App sets (app/api.bicep, `appSettings`):

| local (template)             | Azure (Flex Consumption, managed identity)                  |
|------------------------------|-------------------------------------------------------------|
| AzureWebJobsFeatureFlags     | local only: worker indexing is the default in Azure         |
| PYTHON_ENABLE_INIT_INDEXING  | local only                                                  |
| COSMOS_CREATE_CONTAINERS     | local only: never "true" in Azure (the templates create)    |
| FUNCTIONS_WORKER_RUNTIME     | not a setting on Flex: functionAppConfig.runtime python/3.11|
| AzureWebJobsStorage          | AzureWebJobsStorage__blobServiceUri/__queueServiceUri/      |
|                              | __tableServiceUri (blob: host; queue + table: Durable)      |
| ServiceBusConnection         | ServiceBusConnection__fullyQualifiedNamespace               |
| CosmosDbConnection           | CosmosDbConnection__accountEndpoint                         |
| COSMOS_VERIFY_TLS            | same name, and it must be "true"                            |
| REMOTE_SERVICE_URL           | same name, from a required parameter (local value is local) |
| AGENT_SIGNING_KEYS,          | same names: Key Vault references, by default to the         |
| REPLY_TOKEN_KEYS             | deployment's vault, resolved as the app's identity (017e)   |
| every other name             | same name, default equal to the template's value            |

On top of those: TASKHUB_NAME (host.json reads it), RECOVERY_INDEX_CONTAINER_NAME,
OrdersDbConnection__accountEndpoint, the Application Insights pair, the
user-assigned identity's client id on every connection, OpenTelemetry, and
(durableTaskScheduler backend only) the settings that switch Durable's provider.

CLAIM_TIMEOUT_SECONDS and STEP_TIMEOUT_SECONDS are the exception to "same
default": main.bicep raises them to what Flex's start-up latency needs
(test_timing.py). REPLY_QUEUE_REGISTRY and ORDER_INGRESS_QUEUES are built from
`clientApplications` and equal the template's with the default applications.

The other direction: every setting the app reads (adapters/settings.py,
bootstrap.py, console/security.py: their source scanned for reads, and
adapters.settings run against a recording environment for computed names) is
set in Azure, or listed in NOT_SET_IN_AZURE with the reason."""

from __future__ import annotations

import ast
import json
import re

import pytest

from adapters.settings import load_settings
from tests.infra.bicep_model import (
    HOST_JSON,
    INFRA,
    MAIN,
    ROOT,
    accessor,
    evaluate,
    function_call,
    main_applications,
    main_defaults,
    module_params,
    parse,
    template_settings,
    variable,
)

API = INFRA / "app" / "api.bicep"
FLEX = INFRA / "core" / "host" / "flex-function.bicep"

# COSMOS_CREATE_CONTAINERS: locally the app creates its containers; in Azure
# these templates do, and the app's Cosmos data-plane role could not.
LOCAL_ONLY = {"AzureWebJobsFeatureFlags", "PYTHON_ENABLE_INIT_INDEXING", "COSMOS_CREATE_CONTAINERS"}
RUNTIME = {"FUNCTIONS_WORKER_RUNTIME"}
IDENTITY_FORMS = {
    "AzureWebJobsStorage": {
        "AzureWebJobsStorage__blobServiceUri",
        "AzureWebJobsStorage__queueServiceUri",
        "AzureWebJobsStorage__tableServiceUri",
    },
    "ServiceBusConnection": {"ServiceBusConnection__fullyQualifiedNamespace"},
    "CosmosDbConnection": {"CosmosDbConnection__accountEndpoint"},
}
# Settings whose local value means nothing in Azure: set from a required
# main.bicep parameter (no default), which azd asks for.
DEPLOYMENT_SPECIFIC = {
    "REMOTE_SERVICE_URL": "remoteServiceUrl",
}
# The internal queues' keys (ADR 017e): a Key Vault reference per deployment,
# never a default every deployment would share. Unless given, a reference to
# the deployment's own vault (deploy/keys.py creates the secret after
# provision): setting -> (@secure() parameter, main.bicep variable, secret).
VAULT_BACKED = {
    "AGENT_SIGNING_KEYS": ("agentSigningKeys", "agentSigningKeysSetting", "agent-signing-keys"),
    "REPLY_TOKEN_KEYS": ("replyTokenKeys", "replyTokenKeysSetting", "reply-token-keys"),
}
# Parameter names that are not the camelCase of the setting.
PARAM_NAMES = {"TASKHUB_NAME": "taskHubName"}
# Settings main.bicep derives from its parameter of the same meaning (raised
# to the Flex floor) before passing it on: main.bicep variable per parameter.
DERIVED = {
    "claimTimeoutSeconds": "azureClaimTimeoutSeconds",
    "stepTimeoutSeconds": "azureStepTimeoutSeconds",
    "consoleOperators": "azureConsoleOperators",  # with every operator named for sign-in
}
# Names whose Azure value is a schedule built from an interval parameter.
SCHEDULES = {
    "STARTER_SCHEDULE": "starterIntervalSeconds",
    "SUPERVISOR_SCHEDULE": "supervisorIntervalSeconds",
}
# Forms that would put a key or connection string in settings, or that Flex
# Consumption refuses.
FORBIDDEN = {
    "AzureWebJobsStorage",
    "ServiceBusConnection",
    "CosmosDbConnection",
    "OrdersDbConnection",
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_EXTENSION_VERSION",
    "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    "APPINSIGHTS_INSTRUMENTATIONKEY",
}


def app_settings() -> dict:
    """The settings every deployment gets (appSettings = union(baseSettings, durableBackendSettings))."""
    call = function_call(variable(parse(API), "appSettings"))
    assert call == ("union", {"arg_1": "baseSettings", "arg_2": "durableBackendSettings"}), call
    return variable(parse(API), "baseSettings")


def camel(name: str) -> str:
    if name in PARAM_NAMES:
        return PARAM_NAMES[name]
    head, *rest = name.lower().split("_")
    return head + "".join(part.capitalize() for part in rest)


PLAIN = sorted(
    set(template_settings()) - LOCAL_ONLY - RUNTIME - set(IDENTITY_FORMS) - {"COSMOS_VERIFY_TLS"}
)


def test_every_template_setting_is_mapped():
    """A new setting in the template must be placed in one of the groups above."""
    assert set(template_settings()) <= LOCAL_ONLY | RUNTIME | set(IDENTITY_FORMS) | {
        "COSMOS_VERIFY_TLS"
    } | set(PLAIN)
    assert PLAIN, "the template has plain settings"


@pytest.mark.parametrize("name", sorted(IDENTITY_FORMS))
def test_connections_are_identity_based(name: str):
    settings = app_settings()
    assert IDENTITY_FORMS[name] <= set(settings), (
        f"{name}: Azure sets none of {IDENTITY_FORMS[name]}"
    )
    assert name not in settings


@pytest.mark.parametrize("name", PLAIN)
def test_plain_setting_is_set(name: str):
    assert name in app_settings(), f"the app reads {name}; the function app does not set it"


@pytest.mark.parametrize("name", PLAIN)
def test_plain_setting_default_equals_template(name: str):
    """Azure behaves like the local stack unless a parameter says otherwise:
    the setting comes from the main.bicep parameter of the same meaning, whose
    default is the template's value."""
    template = template_settings()[name]
    value = app_settings()[name]
    defaults = main_defaults()
    if name in SCHEDULES:
        param = SCHEDULES[name]
        assert value == f"*/${{{param}}} * * * * *"
        assert f"*/{defaults[param]} * * * * *" == template
        return
    if name in ("REPLY_QUEUE_REGISTRY", "ORDER_INGRESS_QUEUES"):
        return  # built from clientApplications: test_reply_queue_registry..., test_ingress_registry...
    if name in VAULT_BACKED:
        return  # test_the_keys_are_key_vault_references_to_the_deployments_vault
    call = function_call(value)
    param = call[1]["value_to_convert"] if call and call[0] == "string" else value
    assert param == camel(name), f"{name} is set from {param!r}, expected parameter {camel(name)}"
    # main.bicep passes its own parameter of the same name to app/api.bicep
    # (or the Flex-adjusted value derived from it).
    assert module_params(parse(MAIN), "api")[param] == DERIVED.get(param, param)
    if name in DEPLOYMENT_SPECIFIC:
        assert parse(MAIN)["parameters"][param]["default"] is None, (
            f"{param} must be given per deployment"
        )
        return
    assert str(defaults[param]) == template, (
        f"{name}: Bicep default {defaults[param]!r}, template {template!r}"
    )


@pytest.mark.parametrize("name", sorted(VAULT_BACKED))
def test_the_keys_are_key_vault_references_to_the_deployments_vault(name: str):
    """Issue 46, item 1: the first `azd up` works with the keys' vault the
    template owns (or keyVaultName's), the app's identity granted on it."""
    param, var, secret = VAULT_BACKED[name]
    main = parse(MAIN)
    assert app_settings()[name] == param
    assert module_params(main, "api")[param] == var
    spec = main["parameters"][param]
    assert spec["default"] == ""
    assert {"type": "secure"} in spec["decorators"]
    names = {"keyVault": "kv-orders-test"}
    assert evaluate(var, {param: "", "names": names}, main) == (
        f"@Microsoft.KeyVault(VaultName=kv-orders-test;SecretName={secret})"
    )
    given = "@Microsoft.KeyVault(SecretUri=https://mine.vault.azure.net/secrets/k/)"
    assert evaluate(var, {param: given, "names": names}, main) == given
    # deploy/keys.py creates that secret when absent, in the vault main.bicep names.
    from deploy.keys import SECRETS

    assert secret in SECRETS
    entries = evaluate(main["outputs"]["INTERNAL_VAULT_ENTRIES"]["value"], {}, main)
    assert secret in entries.split(",")


def test_forbidden_setting_names_are_absent():
    assert not FORBIDDEN & set(app_settings())


def test_local_only_settings_are_not_enabled_in_azure():
    settings = app_settings()
    for name in LOCAL_ONLY:
        assert settings.get(name, "false") in ("false", "0", ""), name


def test_runtime_is_python_311_on_flex():
    params = module_params(parse(API), "functionApp")
    assert (params["runtimeName"], params["runtimeVersion"]) == ("python", "3.11")
    assert template_settings()["FUNCTIONS_WORKER_RUNTIME"] == "python"
    site = parse(FLEX)["resources"]["site"]["config"]
    runtime = site["properties"]["functionAppConfig"]["runtime"]
    assert runtime == {"name": "runtimeName", "version": "runtimeVersion"}
    assert site["identity"]["type"] == "UserAssigned"
    assert site["kind"] == "functionapp,linux"


def test_flex_plan_sku():
    plan = parse(INFRA / "core" / "host" / "flex-plan.bicep")["resources"]["plan"]["config"]
    assert plan["sku"] == {"name": "FC1", "tier": "FlexConsumption"}


def test_cosmos_tls_is_verified_in_azure():
    assert app_settings()["COSMOS_VERIFY_TLS"] == "true"


def test_settings_the_design_adds():
    settings = app_settings()
    assert settings["TASKHUB_NAME"] == "taskHubName"
    assert main_defaults()["taskHubName"] == "OrderProcessing"
    assert settings["RECOVERY_INDEX_CONTAINER_NAME"] == "recoveryIndexContainerName"
    assert main_defaults()["recoveryIndexContainerName"] == "recoveryIndex"
    assert "OrdersDbConnection__accountEndpoint" in settings
    assert (
        settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"]
        == "ClientId=${identityClientId};Authorization=AAD"
    )
    assert accessor(settings["APPLICATIONINSIGHTS_CONNECTION_STRING"]) is not None


@pytest.mark.parametrize(
    "connection",
    ["AzureWebJobsStorage", "ServiceBusConnection", "CosmosDbConnection", "OrdersDbConnection"],
)
def test_every_connection_names_the_user_assigned_identity(connection: str):
    """With a user-assigned identity the host needs <connection>__clientId, or it
    looks for a system-assigned identity the app does not have."""
    settings = app_settings()
    assert settings[f"{connection}__credential"] == "managedidentity"
    assert settings[f"{connection}__clientId"] == "identityClientId"


def test_sdk_clients_use_the_user_assigned_identity():
    settings = app_settings()
    assert settings["AZURE_CLIENT_ID"] == "identityClientId"
    main = module_params(parse(MAIN), "api")
    assert main["identityClientId"]["operator"]["operands"]["operand_1"] == "identity"
    site = parse(FLEX)["resources"]["site"]["config"]
    assert site["identity"] == {
        "type": "UserAssigned",
        "userAssignedIdentities": {"'${identityId}'": {}},
    }


def test_worker_dependencies_are_isolated():
    """The Service Bus SDK-type binding needs a newer protobuf and grpcio than
    the 3.11 worker ships; without isolation the app indexes no function
    (docs/adr/017c-worker-dependency-isolation.md, tests/deploy/test_worker_pins.py)."""
    assert app_settings()["PYTHON_ISOLATE_WORKER_DEPENDENCIES"] == "1"


def test_opentelemetry_reaches_application_insights():
    settings = app_settings()
    assert settings["AzureFunctionsJobHost__telemetryMode"] == "OpenTelemetry"
    assert settings["PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY"] == "true"
    assert settings["OTEL_SERVICE_NAME"]


def _backend_settings() -> dict:
    ops = variable(parse(API), "durableBackendSettings")["operator"]["operands"]
    assert ops["condition"] == {
        "operator": {
            "type": "equals",
            "operands": {"operand_1": "durableBackend", "operand_2": "durableTaskScheduler"},
        }
    }
    return ops


def test_azure_storage_backend_sets_only_its_partition_count():
    """host.json names the Azure Storage provider; Azure adds only its
    partitionCount (4, the extension's default, unless a profile says 16)."""
    prefix = "AzureFunctionsJobHost__extensions__durableTask__storageProvider__"
    assert _backend_settings()["false_value"] == {
        prefix + "partitionCount": {
            "function": {
                "type": "string",
                "parameters": {"value_to_convert": "durablePartitionCount"},
            }
        }
    }
    provider = json.loads(HOST_JSON.read_text())["extensions"]["durableTask"]["storageProvider"]
    assert provider["type"] == "AzureStorage"
    assert "partitionCount" not in provider
    assert main_defaults()["durableBackend"] == "azureStorage"
    assert main_defaults()["durablePartitionCount"] == 4
    assert module_params(parse(MAIN), "api")["durablePartitionCount"] == "durablePartitionCount"


def test_scheduler_backend_overrides_the_provider_by_app_setting():
    """AzureFunctionsJobHost__<path> overrides host.json's value at <path>, so
    the scheduler is selected without a second host.json."""
    chosen = _backend_settings()["true_value"]
    prefix = "AzureFunctionsJobHost__extensions__durableTask__storageProvider__"
    assert chosen[prefix + "type"] == "azureManaged"
    assert chosen[prefix + "connectionStringName"] == "DURABLE_TASK_SCHEDULER_CONNECTION_STRING"
    assert chosen["DURABLE_TASK_SCHEDULER_CONNECTION_STRING"] == (
        "Endpoint=${durableTaskSchedulerEndpoint};Authentication=ManagedIdentity;ClientID=${identityClientId}"
    )
    # The hub name comes from the same TASKHUB_NAME host.json reads.
    assert "%TASKHUB_NAME%" in HOST_JSON.read_text()


def test_scheduler_resources_exist_only_for_that_backend():
    main = parse(MAIN)
    dts = main["modules"]["durableTaskScheduler"]
    assert dts["config"]["condition"] == "useScheduler"
    assert variable(main, "useScheduler") == {
        "operator": {
            "type": "equals",
            "operands": {"operand_1": "durableBackend", "operand_2": "durableTaskScheduler"},
        }
    }
    params = dts["config"]["config"]["params"]
    assert params["taskHubName"] == "taskHubName"
    assert params["ipAllowlist"] == "durableTaskSchedulerIpAllowlist"
    scheduler = parse(INFRA / "core" / "durable" / "durable-task-scheduler.bicep")
    assert (
        scheduler["resources"]["scheduler"]["config"]["properties"]["ipAllowlist"] == "ipAllowlist"
    )
    allow = scheduler["parameters"]["ipAllowlist"]
    assert {"type": "min_length", "argument": 1} in allow["decorators"] or any(
        d["type"] in ("minLength", "min_length") and d["argument"] == 1 for d in allow["decorators"]
    ), "an empty allow-list admits nobody"
    assert scheduler["resources"]["taskHub"]["config"] == {
        "parent": "scheduler",
        "name": "taskHubName",
    }


def test_ingress_registry_is_built_from_client_applications():
    """ORDER_INGRESS_QUEUES in Azure is messaging.bicep's registry of the queues
    it creates; with main.bicep's default applications it equals the template's
    (so Submit listens on the same queues locally and in Azure)."""
    settings = app_settings()
    assert function_call(settings["ORDER_INGRESS_QUEUES"]) == (
        "string",
        {"value_to_convert": "ingressQueueRegistry"},
    )
    passed = module_params(parse(MAIN), "api")["ingressQueueRegistry"]["operator"]["operands"]
    assert passed["operand_1"] == "messaging"
    assert passed["operand_2"]["operator"]["operands"] == {
        "operand_1": "outputs",
        "operand_2": "ingressQueueRegistry",
    }
    messaging = parse(INFRA / "app" / "messaging.bicep")
    registry = evaluate(
        messaging["outputs"]["ingressQueueRegistry"]["value"],
        {"clientApplications": main_applications()},
        messaging,
    )
    assert registry == json.loads(template_settings()["ORDER_INGRESS_QUEUES"])
    # The queues the registry names are the ones messaging.bicep creates.
    ingress = variable(messaging, "ingressQueues")
    item = ingress["loop_type"]["detail"]["item_name"]
    assert ingress["config"]["name"] == f"orders-${{{item}.appId}}"
    assert set(registry.values()) == {f"orders-{app['appId']}" for app in main_applications()}


# --- every setting the app reads is set in Azure, or excluded here with a reason ---

# Modules that read the app's settings from the environment. (agents/config.py
# reads the Agent's tuning knobs, AGENT_*, whose code defaults are what Azure
# runs; adapters/settlement.py reads REDELIVERY_DELAYS_SECONDS and
# MAX_DELIVERY_COUNT the same way. They are left out on purpose.)
READERS = [ROOT / "adapters" / "settings.py", ROOT / "console" / "security.py"]
# The composition root and the entry layer build from Settings and read no setting themselves.
ROOTS = [ROOT / "bootstrap.py", ROOT / "function_app.py", *sorted((ROOT / "triggers").glob("*.py"))]
# Read by the app, deliberately not an Azure app setting.
NOT_SET_IN_AZURE = {
    "AzureFunctionsJobHost__extensions__durableTask__defaultVersion": "optional override of host.json's defaultVersion, which the deployed host.json already sets; the app reads host.json when it is not set",
    "ServiceBusConnection": "connection-string form; Azure sets ServiceBusConnection__fullyQualifiedNamespace",
    "CosmosDbConnection": "connection-string form; Azure sets CosmosDbConnection__accountEndpoint",
    "OrdersDbConnection": "connection-string form; Azure sets OrdersDbConnection__accountEndpoint",
    "COSMOS_CREATE_CONTAINERS": "local only: the templates create the containers",
    "CONSOLE_LOCAL_MODE": "local only: set by devstack/stack.py, ignored where an Azure hint is set",
    "CONSOLE_PUBLIC_URL": "optional: only behind a custom domain or proxy (docs/adr/012)",
    "ALERT_WINDOW_SECONDS": "optional: the alerts' aggregation window, 60 s unset (docs/settings.md); the e2e stack shortens it",
}
# Set by the platform, not by us.
PLATFORM = {"IDENTITY_ENDPOINT", "MSI_ENDPOINT", "WEBSITE_SITE_NAME", "WEBSITE_HOSTNAME"}
_ENV_FUNCS = {
    "_int": 1,
    "_bool": 1,
    "_choice": 1,
    "_float": 1,
}  # helper -> index of the name argument


def _is_environment(node: ast.AST) -> bool:
    """`env` (any variable of that name), `os.environ`, or `(env if ... else os.environ)`."""
    if isinstance(node, ast.Name):
        return node.id == "env"
    if isinstance(node, ast.IfExp):
        return _is_environment(node.body) or _is_environment(node.orelse)
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def setting_names_in_source(source: str) -> tuple[set[str], int]:
    """The setting names a module reads with a literal (or module-constant, or
    f-string of constants) name: `env.get(N)`, `os.environ.get(N)`,
    `env[N]`, `os.getenv(N)`, `_int(env, N, ...)` and the like. Also the count
    of reads whose name it cannot resolve (a variable), which
    test_settings_read_with_computed_names_are_set checks by running the code."""
    tree = ast.parse(source)
    constants: dict[str, str] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = node.value.value

    def resolve(arg: ast.AST) -> str | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.Name):
            return constants.get(arg.id)
        if isinstance(arg, ast.JoinedStr):
            parts = []
            for value in arg.values:
                if isinstance(value, ast.Constant):
                    parts.append(str(value.value))
                elif (
                    isinstance(value, ast.FormattedValue)
                    and isinstance(value.value, ast.Name)
                    and value.value.id in constants
                ):
                    parts.append(constants[value.value.id])
                else:
                    return None
            return "".join(parts)
        return None

    names: set[str] = set()
    unresolved = 0
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "get"
                and _is_environment(func.value)
                and node.args
            ) or (isinstance(func, ast.Attribute) and func.attr == "getenv" and node.args):
                arg = node.args[0]
            elif (
                isinstance(func, ast.Name)
                and func.id in _ENV_FUNCS
                and len(node.args) > _ENV_FUNCS[func.id]
            ):
                arg = node.args[_ENV_FUNCS[func.id]]
        elif isinstance(node, ast.Subscript) and _is_environment(node.value):
            arg = node.slice
        if arg is None:
            continue
        name = resolve(arg)
        if name is None:
            unresolved += 1
        else:
            names.add(name)
    return names, unresolved


class _RecordingEnv(dict):
    """An environment that remembers every name looked up in it."""

    def __init__(self, values: dict[str, str]):
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def _azure_like_environment() -> dict[str, str]:
    """The template's values in the shape Azure has: identity-based
    connections instead of connection strings."""
    values = {k: v for k, v in template_settings().items() if k not in IDENTITY_FORMS}
    values.update(
        {
            "ServiceBusConnection__fullyQualifiedNamespace": "sb-orders.servicebus.windows.net",
            "CosmosDbConnection__accountEndpoint": "https://cosmos-orders.documents.azure.com:443/",
            "OrdersDbConnection__accountEndpoint": "https://cosmos-orders.documents.azure.com:443/",
            "AZURE_CLIENT_ID": "00000000-0000-0000-0000-000000000001",
        }
    )
    return values


def _missing_in_azure(names: set[str]) -> set[str]:
    return names - set(app_settings()) - set(NOT_SET_IN_AZURE) - PLATFORM


@pytest.mark.parametrize("reader", READERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_setting_the_app_reads_is_set_in_azure(reader):
    names, _ = setting_names_in_source(reader.read_text())
    assert names, f"{reader.name}: no setting found; has the way it reads settings changed?"
    assert _missing_in_azure(names) == set(), (
        f"{reader.relative_to(ROOT)} reads these, but infra/app/api.bicep does not set them "
        "(add them to baseSettings, or to NOT_SET_IN_AZURE with the reason)"
    )


@pytest.mark.parametrize("root", ROOTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_composition_root_reads_no_setting_itself(root):
    names, _ = setting_names_in_source(root.read_text())
    assert names == set(), f"{root.name} reads {sorted(names)}: read them in adapters/settings.py"


def test_settings_read_with_computed_names_are_set():
    """The reads whose name is computed (`f"{name}__accountEndpoint"`) are
    found by running adapters.settings against a recording environment."""
    from adapters.settings import MANAGED_IDENTITY_ENDPOINTS, ingress_queues, load_settings

    env = _RecordingEnv(_azure_like_environment())
    load_settings(env)
    ingress_queues(env)
    assert {
        "CosmosDbConnection__accountEndpoint",
        "ServiceBusConnection__fullyQualifiedNamespace",
        "ORDER_INGRESS_QUEUES",
    } <= env.read
    assert _missing_in_azure(env.read) == set(), env.read
    assert set(MANAGED_IDENTITY_ENDPOINTS) <= PLATFORM


def test_the_check_catches_a_setting_missing_from_bicep():
    """The source scan sees each way a setting is read, so a new one fails
    the test above until Bicep sets it."""
    source = (ROOT / "adapters" / "settings.py").read_text() + (
        "\nNEW_CONST = 'NEW_FROM_CONSTANT'\n"
        "def _new(env):\n"
        "    return (env.get('NEW_PLAIN'), _int(env, 'NEW_INT', 1), env['NEW_INDEXED'],\n"
        "            env.get(f'{NEW_CONST}__suffix'), os.environ.get('NEW_OS'), env.get(NEW_CONST))\n"
    )
    names, _ = setting_names_in_source(source)
    assert _missing_in_azure(names) == {
        "NEW_PLAIN",
        "NEW_INT",
        "NEW_INDEXED",
        "NEW_FROM_CONSTANT__suffix",
        "NEW_OS",
        "NEW_FROM_CONSTANT",
    }


def test_host_json_setting_references_are_set():
    """host.json's %NAME% placeholders resolve from app settings."""
    referenced = set(re.findall(r"%(\w+)%", HOST_JSON.read_text()))
    assert referenced <= set(app_settings()), referenced - set(app_settings())


def test_reply_queue_registry_is_built_from_client_applications():
    settings = app_settings()
    call = function_call(settings["REPLY_QUEUE_REGISTRY"])
    assert call == ("string", {"value_to_convert": "replyQueueRegistry"})
    fn, args = function_call(variable(parse(API), "replyQueueRegistry"))
    assert fn == "toObject"
    assert args["arg_1"] == "clientApplications"
    key, value = (args[k]["detail"] for k in ("arg_2", "arg_3"))
    assert accessor(key["expression"]) == (key["var_1"], "appId")
    # An application with `progress: true` is registered as {queue, progress: true}, the
    # form the app reads as opting in to progress statuses; any other, by its queue's name.
    chosen = value["expression"]["operator"]
    assert chosen["type"] == "conditional"
    assert "app.?progress ?? false" in API.read_text()
    branches = chosen["operands"]
    assert accessor(branches["false_value"]) == (value["var_1"], "replyQueueName")
    opted = branches["true_value"]
    assert accessor(opted["queue"]) == (value["var_1"], "replyQueueName")
    assert opted["progress"] is True
    opted_in = {"webshop": {"queue": "replies-webshop", "progress": True}}
    settings = load_settings({**template_settings(), "REPLY_QUEUE_REGISTRY": json.dumps(opted_in)})
    assert settings.progress_apps == frozenset({"webshop"})
    # With main.bicep's default client applications and the smoke application,
    # the registry equals the template's.
    assert module_params(parse(MAIN), "api")["clientApplications"] == "applications"
    registry = {app["appId"]: app["replyQueueName"] for app in main_applications()}
    assert registry == json.loads(template_settings()["REPLY_QUEUE_REGISTRY"])
