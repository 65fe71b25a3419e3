"""Break the deployment files one way at a time and check that tests/infra fails.

Each mutation is a realistic regression of one point of issue 17. Run:

    .venv/bin/python -m tests.infra.mutate_bicep

It restores every file after each run and prints CAUGHT or MISSED per
mutation, with the first failing test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (label, file, text to replace, replacement)
MUTATIONS = [
    (
        "identity: system-assigned",
        "infra/core/host/flex-function.bicep",
        "type: 'UserAssigned'\n",
        "type: 'SystemAssigned'\n",
    ),
    (
        "package read w/o identity id",
        "infra/core/host/flex-function.bicep",
        "            userAssignedIdentityResourceId: identityId\n",
        "",
    ),
    (
        "storage clientId dropped",
        "infra/app/api.bicep",
        "  AzureWebJobsStorage__clientId: identityClientId\n",
        "",
    ),
    (
        "AI auth string w/o client",
        "infra/app/api.bicep",
        "'ClientId=${identityClientId};Authorization=AAD'",
        "'Authorization=AAD'",
    ),
    ("cosmos chain broken", "infra/app/rbac.bicep", "  dependsOn: [\n    appStateData\n  ]\n", ""),
    ("operator batchSize dropped", "infra/app/rbac.bicep", "@batchSize(1)\n", ""),
    (
        "rbac from site",
        "infra/main.bicep",
        "functionAppPrincipalId: identity.outputs.principalId",
        "functionAppPrincipalId: identity.outputs.clientId",
    ),
    (
        "always-ready removed",
        "infra/main.bicep",
        "        name: 'durable'\n",
        "        name: 'http'\n",
    ),
    (
        "step not raised (api)",
        "infra/main.bicep",
        "    maxProcessing: maxProcessing\n    claimTimeoutSeconds: azureClaimTimeoutSeconds\n    stepTimeoutSeconds: azureStepTimeoutSeconds",
        "    maxProcessing: maxProcessing\n    claimTimeoutSeconds: azureClaimTimeoutSeconds\n    stepTimeoutSeconds: stepTimeoutSeconds",
    ),
    (
        "step floor w/o bridge cold start",
        "infra/main.bicep",
        "var stepFloorSeconds = (2 * flexStartupSeconds)",
        "var stepFloorSeconds = (1 * flexStartupSeconds)",
    ),
    (
        "client sends to shared orders",
        "infra/app/rbac.bicep",
        "    queueName: 'orders-${app.appId}'\n    roleDefinitionId: roles.serviceBusDataSender\n    principalId: app.principalId",
        "    queueName: 'orders'\n    roleDefinitionId: roles.serviceBusDataSender\n    principalId: app.principalId",
    ),
    (
        "operators get orders db",
        "infra/app/rbac.bicep",
        "    databaseName: stateDatabaseName\n    sqlRoleDefinitionId: cosmosBuiltInDataContributor\n    principalId: operator",
        "    databaseName: ordersDatabaseName\n    sqlRoleDefinitionId: cosmosBuiltInDataContributor\n    principalId: operator",
    ),
    (
        "DTS role missing",
        "infra/app/rbac.bicep",
        "roleDefinitionId: roles.durableTaskDataContributor",
        "roleDefinitionId: roles.serviceBusDataReceiver",
    ),
    (
        "DTS provider not switched",
        "infra/app/api.bicep",
        "storageProvider__type: 'azureManaged'",
        "storageProvider__type: 'AzureStorage'",
    ),
    (
        "empty DTS allow-list allowed",
        "infra/core/durable/durable-task-scheduler.bicep",
        "@minLength(1)\nparam ipAllowlist",
        "param ipAllowlist",
    ),
    (
        "scm publishing on",
        "infra/core/host/flex-function.bicep",
        "  name: 'scm'\n  properties: {\n    allow: false",
        "  name: 'scm'\n  properties: {\n    allow: true",
    ),
    (
        "no cosmos diagnostics",
        "infra/core/database/cosmos-account.bicep",
        "        categoryGroup: 'allLogs'",
        "        categoryGroup: 'audit'",
    ),
    (
        "periodic backup",
        "infra/core/database/cosmos-account.bicep",
        "      type: 'Continuous'",
        "      type: 'Periodic'",
    ),
    (
        "alert emails ignored",
        "infra/main.bicep",
        "    emailAddresses: alertEmails",
        "    emailAddresses: []",
    ),
    (
        "ingress queues dropped",
        "infra/app/messaging.bicep",
        "concat(fixedQueues, ingressQueues, replyQueues)",
        "concat(fixedQueues, replyQueues)",
    ),
    ("bundle floor lowered", "host.json", "[4.26.0, 5.0.0)", "[4.*, 5.0.0)"),
    (
        "slow durable polling",
        "host.json",
        '"maxQueuePollingInterval": "00:00:02"',
        '"maxQueuePollingInterval": "00:00:30"',
    ),
    (
        "console auth not required",
        "infra/core/host/flex-function.bicep",
        "      requireAuthentication: true\n",
        "      requireAuthentication: false\n",
    ),
    (
        "console anonymous w/o client id",
        "infra/core/host/flex-function.bicep",
        "empty(authClientId) ? 'Return401'",
        "empty(authClientId) ? 'AllowAnonymous'",
    ),
    (
        "console auth resource dropped",
        "infra/core/host/flex-function.bicep",
        "  name: 'authsettingsV2'\n",
        "  name: 'authsettings'\n",
    ),
    ("all of /api excluded", "infra/app/api.bicep", "  '/admin/*'\n", "  '/admin/*'\n  '/api/*'\n"),
    (
        "durable webhooks need sign-in",
        "infra/app/api.bicep",
        "  '/runtime/webhooks/durabletask/*'\n",
        "",
    ),
    (
        "console open to the tenant",
        "infra/main.bicep",
        "consoleAllowedGroups: map(filter(operators, op => 'Group' == op.principalType), op => op.principalId)",
        "consoleAllowedGroups: []",
    ),
    (
        "csrf secret from names",
        "infra/main.bicep",
        "param consoleCsrfSecret string = newGuid()",
        "param consoleCsrfSecret string = uniqueString(resourceGroup().id)",
    ),
    (
        "csrf secret not set",
        "infra/app/api.bicep",
        "  CONSOLE_CSRF_SECRET: consoleCsrfSecret\n",
        "",
    ),
    (
        "settings not secure",
        "infra/core/host/flex-function.bicep",
        "@secure()\nparam appSettings object",
        "param appSettings object",
    ),
    (
        "no alerts receiver",
        "infra/app/rbac.bicep",
        "    queue: 'alerts'\n    role: 'serviceBusDataReceiver'",
        "    queue: 'alerts'\n    role: 'serviceBusDataSender'",
    ),
    (
        "app reads reply queues",
        "infra/app/rbac.bicep",
        "    queueName: app.replyQueueName\n    roleDefinitionId: roles.serviceBusDataSender\n    principalId: functionAppPrincipalId",
        "    queueName: app.replyQueueName\n    roleDefinitionId: roles.serviceBusDataReceiver\n    principalId: functionAppPrincipalId",
    ),
    (
        "shared orders queue back",
        "infra/app/messaging.bicep",
        "var fixedQueues = [\n",
        "var fixedQueues = [\n  {\n    name: 'orders'\n    properties: ingressQueueProperties\n  }\n",
    ),
    (
        "app scales on shared orders",
        "infra/app/rbac.bicep",
        "concat(['agent-requests',",
        "concat(['orders', 'agent-requests',",
    ),
    (
        "operators consume agent requests",
        "infra/app/rbac.bicep",
        "  queue: 'alerts'\n  role: 'serviceBusDataReceiver'\n})",
        "  queue: 'agent-requests'\n  role: 'serviceBusDataReceiver'\n})",
    ),
    (
        "one type for every operator",
        "infra/app/rbac.bicep",
        "    principalType: grant.principalType\n",
        "    principalType: 'User'\n",
    ),
    (
        "clients typed as users",
        "infra/app/rbac.bicep",
        "    principalId: app.principalId\n    principalType: 'ServicePrincipal'\n",
        "    principalId: app.principalId\n    principalType: 'User'\n",
    ),
    (
        "scaler cannot count messages",
        "infra/app/rbac.bicep",
        "    roleDefinitionId: roles.serviceBusDataOwner\n",
        "    roleDefinitionId: roles.serviceBusDataReceiver\n",
    ),
    (
        "worker dependencies not isolated",
        "infra/app/api.bicep",
        "  PYTHON_ISOLATE_WORKER_DEPENDENCIES: '1'\n",
        "",
    ),
    (
        "remote service URL may be empty",
        "infra/main.bicep",
        "@minLength(12)\nparam remoteServiceUrl string",
        "param remoteServiceUrl string",
    ),
    (
        "backlog alert on shared orders",
        "infra/app/alerts.bicep",
        "    entities: ingressQueueNames",
        "    entities: concat(['orders'], ingressQueueNames)",
    ),
    (
        "ingress registry not set",
        "infra/app/api.bicep",
        "  ORDER_INGRESS_QUEUES: string(ingressQueueRegistry)\n",
        "",
    ),
    (
        "app reads a setting Bicep lacks",
        "adapters/settings.py",
        'env.get("ORDERS_CONTAINER_NAME")',
        'env.get("ORDERS_CONTAINER")',
    ),
    (
        "console on by default in Azure",
        "infra/main.bicep",
        "param consoleAuthConfirmed string = 'false'",
        "param consoleAuthConfirmed string = 'true'",
    ),
    (
        "console switch not set",
        "infra/app/api.bicep",
        "  CONSOLE_AUTH_CONFIRMED: consoleAuthConfirmed\n",
        "",
    ),
    (
        "app not granted on the keys' vault",
        "infra/app/rbac.bicep",
        "    roleDefinitionId: roles.keyVaultSecretsUser\n",
        "    roleDefinitionId: roles.keyVaultSecretsOfficer\n",
    ),
    (
        "operator listed twice, assigned twice",
        "infra/main.bicep",
        "i => indexOf(operatorIds, operatorsGiven[i].principalId) == i",
        "i => i >= 0",
    ),
    (
        "conditional module output read unguarded (BCP318)",
        "infra/main.bicep",
        "useScheduler ? durableTaskScheduler!.outputs.endpoint : ''",
        "useScheduler ? durableTaskScheduler.outputs.endpoint : ''",
    ),
    (
        "smoke queues not granted to operators",
        "infra/app/rbac.bicep",
        "    queue: 'orders-${smokeAppId}'\n    role: 'serviceBusDataSender'\n",
        "    queue: 'orders-${smokeAppId}'\n    role: 'serviceBusDataReceiver'\n",
    ),
    (
        "app integrated with no subnet under vnetEnabled",
        "infra/app/api.bicep",
        "    virtualNetworkSubnetId: virtualNetworkSubnetId\n",
        "",
    ),
    (
        "production cosmos under the model",
        "infra/main.production.parameters.json",
        '"value": 28000',
        '"value": 20000',
    ),
    (
        "production keeps every history",
        "infra/main.production.parameters.json",
        '"durableRetentionDaysCompleted": {\n      "value": 0',
        '"durableRetentionDaysCompleted": {\n      "value": -1',
    ),
    (
        "orders expire before their record",
        "infra/main.production.parameters.json",
        '"value": 10368000',
        '"value": 864000',
    ),
    (
        "resource logs always sent",
        "infra/core/messaging/servicebus.bicep",
        "logs: resourceLogs ? [",
        "logs: true ? [",
    ),
    (
        "partition count not passed",
        "infra/app/api.bicep",
        "string(durablePartitionCount)",
        "'4'",
    ),
    (
        "scheduler capacity dropped",
        "infra/main.bicep",
        "    skuCapacity: durableTaskSchedulerCapacity\n",
        "",
    ),
    (
        "production file names an unknown parameter",
        "infra/main.production.parameters.json",
        '"maxProcessing": {',
        '"maxInFlight": {',
    ),
    (
        "docker config stale",
        "devstack/docker/servicebus-config.json",
        '"DefaultMessageTimeToLive": "PT1H"',
        '"DefaultMessageTimeToLive": "P1D"',
    ),
]


def main() -> int:
    missed = 0
    for label, file, old, new in MUTATIONS:
        path = ROOT / file
        original = path.read_text()
        if old not in original:
            print(f"STALE  {label}: the text to mutate is gone from {file}")
            missed += 1
            continue
        path.write_text(original.replace(old, new, 1))
        try:
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "tests/infra",
                    "-q",
                    "-x",
                    "-p",
                    "no:cacheprovider",
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
        finally:
            path.write_text(original)
        first = next((line for line in run.stdout.splitlines() if line.startswith("FAILED")), "")
        caught = run.returncode != 0
        missed += not caught
        print(f"{'CAUGHT' if caught else 'MISSED'} {label} | {first[:110]}")
    print(f"{len(MUTATIONS) - missed}/{len(MUTATIONS)} mutations caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
