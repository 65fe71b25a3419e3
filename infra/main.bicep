metadata description = 'Order processing with the Scheduler Agent Supervisor pattern: a Python 3.11 function app on Flex Consumption with Durable Functions, Service Bus queues, Cosmos DB state, and monitoring. Every connection is identity-based; no output carries a secret.'

// Resource-group scope: works with `az deployment group create` and with
// `azd up` (azd deploys into AZURE_RESOURCE_GROUP).
targetScope = 'resourceGroup'

import { clientApplication } from 'types.bicep'

@minLength(1)
@maxLength(64)
@description('Environment name (azd: AZURE_ENV_NAME); seeds the unique resource names.')
param environmentName string

@description('Region for every resource; it must offer Flex Consumption.')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string = resourceGroup().location

// Names: empty means a generated, unique name.
param functionAppName string = ''
param appServicePlanName string = ''
param storageAccountName string = ''
param serviceBusNamespaceName string = ''
param cosmosAccountName string = ''
param ordersCosmosAccountName string = ''
param logAnalyticsName string = ''
param applicationInsightsName string = ''
param identityName string = ''
param durableTaskSchedulerName string = ''

// SKUs and sizes.
@description('Standard or Premium: Basic has no duplicate detection.')
@allowed(['Standard', 'Premium'])
param serviceBusSku string = 'Standard'
@description('Premium only: messaging units of the namespace (the most a namespace takes is 16). No published rate per unit: a load test sizes it (docs/capacity.md).')
@allowed([1, 2, 4, 8, 16])
param serviceBusPremiumMessagingUnits int = 1
@allowed(['Standard_LRS', 'Standard_ZRS', 'Standard_GRS', 'Standard_RAGRS'])
param storageSku string = 'Standard_LRS'
@description('Serverless (default) bills per request; Provisioned gives each database shared autoscale throughput.')
@allowed(['Serverless', 'Provisioned'])
param cosmosCapacityMode string = 'Serverless'
@description('Provisioned only: autoscale maximum RU/s of the state database (orderState and recoveryIndex); the production profile sizes it with bench/capacity.py --size.')
@minValue(1000)
param cosmosAutoscaleMaxThroughput int = 1000
@description('Provisioned only: autoscale maximum RU/s of the orders database.')
@minValue(1000)
param ordersCosmosAutoscaleMaxThroughput int = cosmosAutoscaleMaxThroughput
@description('Seconds an order document lives after Submit wrote it (the orders container\'s defaultTtl); 0 keeps it forever. Keep it well past the state record\'s 90 days after the order finished: the Scheduler reads the document for every attempt, and an operator\'s compensation can start one while the record lives (docs/adr/019c-deployment-profiles.md).')
@minValue(0)
param ordersTtlSeconds int = 0
@description('Put the orders database in an account of its own (OrdersDbConnection__accountEndpoint).')
param ordersInSeparateAccount bool = false
@allowed([512, 2048, 4096])
param instanceMemoryMB int = 2048
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40
@allowed([1024, 2048, 3072, 4096, 5120])
param ordersQueueMaxSizeInMegabytes int = 1024
@minValue(30)
@maxValue(730)
param logRetentionInDays int = 30
@description('Send the Cosmos DB and Service Bus resource logs (data-plane requests, runtime audit) to Log Analytics; false keeps their metrics only. One log row per request is the largest monitoring cost at scale (docs/capacity.md).')
param resourceLogs bool = true
@description('The Functions host\'s log level (logging.logLevel.default of host.json, which covers the Durable extension\'s categories, overridden by app setting). Warning drops the per-execution Information lines; the operator alerts are logged as errors.')
@allowed(['Information', 'Warning', 'Error'])
param hostLogLevel string = 'Information'
@description('Share of traces the app\'s OpenTelemetry exporter keeps (OTEL_TRACES_SAMPLER_ARG of the Azure Monitor distro\'s fixed-percentage sampler); 1 keeps every trace. Logs and metrics are not sampled.')
@allowed(['1', '0.5', '0.25', '0.1', '0.05', '0.01'])
param traceSamplingRatio string = '1'

@description('Client applications: app id, reply queue name, and the object (principal) id of the identity the application uses; empty principalId grants nothing yet. At least one: each gets the ingress queue orders-<appId>, and there is no other way in.')
@minLength(1)
param clientApplications clientApplication[] = [
  {
    appId: 'webshop'
    replyQueueName: 'replies-webshop'
    principalId: ''
  }
  {
    appId: 'partner-portal'
    replyQueueName: 'replies-partner-portal'
    principalId: ''
  }
]

@description('Deploy the smoke application (appId smoke: queues orders-smoke and replies-smoke), whose orders travel the whole path while the agents answer their steps from a built-in no-op, so the postdeploy smoke test (deploy/smoke.py) never reaches remoteServiceUrl. Only the operators may send to orders-smoke and read replies-smoke; no client application may be called smoke.')
param smokeApplication bool = true

@description('Base URL of the remote service the agents call (REMOTE_SERVICE_URL), a public https URL; the local default points at the devstack fake, so Azure needs a real one. An empty value is refused here, a loopback one by the preflight (deploy/preflight.py) and by the app at start.')
@minLength(12)
param remoteServiceUrl string
@description('AGENT_SIGNING_KEYS (azd: AGENT_SIGNING_KEYS): the keys requests and replies on the internal queues are signed with, held by the app and every agent worker (docs/adr/017e-internal-queue-keys.md). Empty (the default): a Key Vault reference to the secret agent-signing-keys of the vault (keyVaultName, else the template\'s own), which deploy/keys.py creates after provision when absent. Else a Key Vault reference of your own, @Microsoft.KeyVault(SecretUri=https://VAULT.vault.azure.net/secrets/NAME/), resolved with the app\'s identity, which needs Key Vault Secrets User on that vault (granted here only on keyVaultName\'s or the template\'s vault).')
@secure()
param agentSigningKeys string = ''
@description('REPLY_TOKEN_KEYS (azd: REPLY_TOKEN_KEYS): the keys of the reply tokens, held by the app only; like agentSigningKeys (secret reply-token-keys).')
@secure()
param replyTokenKeys string = ''
@description('An existing Key Vault (Azure RBAC authorization) for the keys; empty: the template creates a vault of its own. Either way the app\'s identity gets Key Vault Secrets User on it; on the template\'s own vault azd\'s principal also gets Key Vault Secrets Officer, so that deploy/keys.py can create the keys after provision.')
param keyVaultName string = ''
@description('Resource group of the existing vault (keyVaultName).')
param keyVaultResourceGroupName string = resourceGroup().name

// Data names (app settings of the same meaning).
param taskHubName string = 'OrderProcessing'
param stateDatabaseName string = 'orderprocessing'
param stateContainerName string = 'orderState'
param recoveryIndexContainerName string = 'recoveryIndex'
@description('RECOVERY_INDEX_SHARDS: the recovery index partition key is the deadline minute plus a hash shard of the OrderID, this many per minute (docs/adr/019b-sharded-recovery-index.md). Fixed per container: a different count is refused at start.')
@minValue(1)
@maxValue(999)
param recoveryIndexShards int = 16
@description('SHARD_COUNT: how many whole deployments of this template share the orders, each order in the one domain.shards.shard_of names (docs/adr/020e-task-hub-shards.md; infra/shards.bicep deploys them). 1: this deployment takes every order.')
@minValue(1)
@maxValue(999)
param shardCount int = 1
@description('SHARD_INDEX: which of the shardCount shards this deployment is, 0 to shardCount - 1; Submit dead-letters an order of another shard (WrongShard).')
@minValue(0)
@maxValue(998)
param shardIndex int = 0
param ordersDatabaseName string = 'orders'
param ordersContainerName string = 'orders'

// Behaviour (app settings of the same meaning; defaults equal
// local.settings.template.json).
param pendingBacklogLimit int = 5000
param backlogGaugeMaxAgeSeconds int = 300
param maxOrderBytes int = 65536
param maxProcessing int = 500
param claimTimeoutSeconds int = 60
param stepTimeoutSeconds int = 60
param failureThreshold int = 10
param longRetryDelaySeconds int = 3600
param longRetries int = 1
@description('STARTER_SCHEDULE runs every this many seconds.')
@allowed([1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30])
param starterIntervalSeconds int = 5
param starterBatchSize int = 50
@description('A Starter run claims batch after batch while there is more, up to this many batches.')
@minValue(1)
param starterMaxBatches int = 10
@description('A Starter run claims no new batch after this many seconds; keep it below starterIntervalSeconds.')
@minValue(1)
param starterRunBudgetSeconds int = 4
@description('The Starter counts the Pending and Processing backlog (two COUNT queries whose cost grows with it) and scans compensations at most this often; 0: every run.')
@minValue(0)
param starterCountIntervalSeconds int = 0
@description('SUPERVISOR_SCHEDULE runs every this many seconds.')
@allowed([1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30])
param supervisorIntervalSeconds int = 10
param supervisorPageSize int = 100
@description('A Supervisor run reads page after page while there is more, up to this many pages.')
@minValue(1)
param supervisorMaxPages int = 20
@description('A Supervisor run starts no new page after this many seconds; keep it below supervisorIntervalSeconds (the next tick waits for a run: they never overlap).')
@minValue(1)
param supervisorRunBudgetSeconds int = 8
@description('How the Supervisor finds expired records: a bounded cross-partition query, or the deadline-bucket recovery index.')
@allowed(['query', 'index'])
param supervisorScan string = 'query'
@description('Comma-separated steps run as in-app activities instead of through the agent queues (empty: all through agents).')
param inlineSteps string = ''
@description('Most remote (agent) calls one attempt can wait on: the workflow\'s 3 steps (domain/steps.json) and, when it compensates, their 3 undo calls. Sizes the duplicate detection window.')
@minValue(1)
param maxRemoteStepsPerAttempt int = 6

// Networking (docs/deploying.md, "vnetEnabled").
@description('A virtual network as in the official Flex Consumption templates: the app integrates with a subnet of it, the host storage (blob, queue, table), the Service Bus namespace (Premium) and the Cosmos DB accounts get private endpoints with private DNS zones, and the host storage refuses public network access. Service Bus and Cosmos DB stay reachable publicly, with Entra ID only, for the client applications, the operators and the smoke test.')
param vnetEnabled bool = false
param vnetName string = ''

// Durable Functions backend.
@description('azureStorage: the task hub lives in the host storage account (host.json as written). durableTaskScheduler: a Durable Task Scheduler and task hub are deployed and app settings switch the provider to it. Switching strands in-flight orchestrations (infra/README.md, "Choosing the Durable backend").')
@allowed(['azureStorage', 'durableTaskScheduler'])
param durableBackend string = 'azureStorage'
@allowed(['Consumption', 'Dedicated'])
param durableTaskSchedulerSku string = 'Consumption'
@description('Dedicated only: capacity units of the scheduler (2,000 actions/s each, at most 3).')
@minValue(1)
@maxValue(3)
param durableTaskSchedulerCapacity int = 1
@description('Days the scheduler keeps a Completed orchestration\'s history before it purges it (its retention policy); 0 purges at once. -1: no retention policy (history kept).')
@minValue(-1)
param durableRetentionDaysCompleted int = -1
@description('Days the scheduler keeps the history of orchestrations that ended otherwise (Failed, Terminated, ...); -1: no retention policy.')
@minValue(-1)
param durableRetentionDaysOther int = -1
@description('azureStorage only: control-queue partitions of the task hub (extensions.durableTask.storageProvider.partitionCount); how many instances can run orchestrations at once. Fixed when the task hub is created: changing it needs a new taskHubName.')
@minValue(1)
@maxValue(16)
param durablePartitionCount int = 4
@description('CIDR ranges admitted to the scheduler (see core/durable/durable-task-scheduler.bicep).')
param durableTaskSchedulerIpAllowlist string[] = [
  '0.0.0.0/0'
]

// Timing on Flex Consumption (infra/README.md, "Timing on Flex").
@description('Always-ready instances of the durable group (orchestrators and activities). At least 1: an orchestration the Starter starts must not wait for the group to scale from zero.')
@minValue(1)
param durableAlwaysReadyInstances int = 1
@description('Seconds a function group takes to go from zero instances to running the first message: scale decision, instance start, Python worker and host start-up. An assumption to measure (infra/README.md shows the query); it sizes the deadlines below.')
@minValue(1)
param flexStartupSeconds int = 20
@description('Seconds the Agent needs for its remote work of one step, one retry included (AGENT_CALL_TIMEOUT_SECONDS is 10).')
@minValue(1)
param agentWorkSeconds int = 20
@description('Margin on each deadline for store calls, clock skew and queueing.')
@minValue(0)
param deadlineMarginSeconds int = 10

// Operators (python -m cli, Data Explorer).
@description('Object id of the identity running azd (azd sets AZURE_PRINCIPAL_ID); it gets the operator grants. Empty grants nothing.')
param principalId string = ''
@description('Type of that identity (azd: AZURE_PRINCIPAL_TYPE): User, or ServicePrincipal when azd runs as one in CI.')
@allowed(['User', 'Group', 'ServicePrincipal'])
param principalType string = 'User'
@description('Further operators (azd: OPERATOR_PRINCIPAL_IDS), comma-separated entries `objectId:Type` with Type User, Group or ServicePrincipal, each its own (the preflight resolves bare ids through Microsoft Graph). An entry without a type is assigned without principalType and ARM looks the principal up itself.')
param operatorPrincipalIds string = ''

// The operator console (docs/console.md).
@description('Client (application) id of the Entra ID app registration operators sign in to the console with (azd: CONSOLE_AUTH_CLIENT_ID). Empty: authentication is still required, with no way to sign in, so the console answers 401 to everyone.')
param consoleAuthClientId string = ''
@description('Key of the console\'s form tokens. A new value on every deployment (newGuid() may only be a parameter default): forms open during a deployment must be opened again; it is never stored outside the app\'s settings.')
@secure()
param consoleCsrfSecret string = newGuid()
@description('\'true\' only once App Service authentication has been checked to be enforced in front of the console on this deployment (azd: CONSOLE_AUTH_CONFIRMED; infra/README.md, "The console in Azure"). Until then every console route answers 404: Flex Consumption\'s documentation said during its preview that Easy Auth was not supported there and did not block unauthenticated callers.')
@allowed(['true', 'false'])
param consoleAuthConfirmed string = 'false'

@description('Principal (object) ids the app itself admits as console operators (azd: CONSOLE_OPERATORS), comma-separated, besides principalId and OPERATOR_PRINCIPAL_IDS, which are always admitted. The app checks its own list (console.security.may_operate) as well as sign-in: the principal header alone makes nobody an operator.')
param consoleOperators string = ''

@description('An app role of the console\'s app registration whose holders the app admits as operators (azd: CONSOLE_OPERATOR_ROLE). Empty: none; the ids above decide.')
param consoleOperatorRole string = ''

// Alerting.
@description('Comma-separated e-mail addresses that receive the alerts (azd: ALERT_EMAIL_ADDRESSES). Empty: the alerts fire and reach nobody.')
param alertEmailAddresses string = ''
@description('Pending backlog that raises an alert; defaults to 80% of pendingBacklogLimit.')
param pendingBacklogAlertThreshold int = (pendingBacklogLimit * 8) / 10

var resourceToken = toLower(uniqueString(subscription().id, resourceGroup().id, environmentName))
var tags = {
  'azd-env-name': environmentName
  workload: 'order-processing'
}
var names = {
  functionApp: (!empty(functionAppName)) ? functionAppName : 'func-orders-${resourceToken}'
  plan: (!empty(appServicePlanName)) ? appServicePlanName : 'plan-orders-${resourceToken}'
  storage: (!empty(storageAccountName)) ? storageAccountName : 'storders${resourceToken}'
  serviceBus: (!empty(serviceBusNamespaceName)) ? serviceBusNamespaceName : 'sb-orders-${resourceToken}'
  cosmos: (!empty(cosmosAccountName)) ? cosmosAccountName : 'cosmos-orders-${resourceToken}'
  ordersCosmos: (!empty(ordersCosmosAccountName)) ? ordersCosmosAccountName : 'cosmos-ordersdb-${resourceToken}'
  logAnalytics: (!empty(logAnalyticsName)) ? logAnalyticsName : 'log-orders-${resourceToken}'
  appInsights: (!empty(applicationInsightsName)) ? applicationInsightsName : 'appi-orders-${resourceToken}'
  actionGroup: 'ag-orders-${resourceToken}'
  identity: (!empty(identityName)) ? identityName : 'id-orders-${resourceToken}'
  durableTaskScheduler: (!empty(durableTaskSchedulerName)) ? durableTaskSchedulerName : 'dts-orders-${resourceToken}'
  vnet: (!empty(vnetName)) ? vnetName : 'vnet-orders-${resourceToken}'
  keyVault: (!empty(keyVaultName)) ? keyVaultName : 'kv-orders-${take(resourceToken, 13)}'
}
// The keys' vault: the template's own unless an existing one is named.
var ownKeyVault = empty(keyVaultName)
var keysVaultResourceGroup = ownKeyVault ? resourceGroup().name : keyVaultResourceGroupName
// Secret names in the vault (deploy/keys.py creates them when absent).
var keySecretNames = {
  agentSigningKeys: 'agent-signing-keys'
  replyTokenKeys: 'reply-token-keys'
}
var agentSigningKeysSetting = empty(agentSigningKeys) ? '@Microsoft.KeyVault(VaultName=${names.keyVault};SecretName=${keySecretNames.agentSigningKeys})' : agentSigningKeys
var replyTokenKeysSetting = empty(replyTokenKeys) ? '@Microsoft.KeyVault(VaultName=${names.keyVault};SecretName=${keySecretNames.replyTokenKeys})' : replyTokenKeys
var useScheduler = durableBackend == 'durableTaskScheduler'
// The client applications and, unless turned off, the smoke application.
var smokeAppId = 'smoke'
var applications = smokeApplication ? concat(clientApplications, [
  {
    appId: smokeAppId
    replyQueueName: 'replies-${smokeAppId}'
    principalId: ''
  }
]) : clientApplications

// host.json: extensions.durableTask.storageProvider.maxQueuePollingInterval
// (tests/infra check the two agree).
var durableQueuePollingSeconds = 2
// The deadlines deployed to Azure: the parameters above, raised to what Flex
// needs. A claim waits for the orchestration's start to be picked up (one
// control-queue poll, one work-item poll) and, beyond the always-ready
// instance, for one scale-out. A step waits for the Agent's function to scale
// from zero, the remote work, the reply bridge's function to scale from zero,
// and one control-queue poll for the raised event.
var claimFloorSeconds = flexStartupSeconds + (2 * durableQueuePollingSeconds) + deadlineMarginSeconds
var stepFloorSeconds = (2 * flexStartupSeconds) + agentWorkSeconds + durableQueuePollingSeconds + deadlineMarginSeconds
var azureClaimTimeoutSeconds = max(claimTimeoutSeconds, claimFloorSeconds)
var azureStepTimeoutSeconds = max(stepTimeoutSeconds, stepFloorSeconds)

var alertEmails = filter(map(split(alertEmailAddresses, ','), address => trim(address)), address => !empty(address))
var operatorEntries = filter(map(split(operatorPrincipalIds, ','), entry => trim(entry)), entry => !empty(entry))
// { principalId, principalType } per operator, each with its own type: a
// role assignment whose principalType does not match the principal fails the
// deployment (UnmatchedPrincipalType).
var operatorsGiven = concat(
  empty(principalId) ? [] : [
    {
      principalId: principalId
      principalType: principalType
    }
  ],
  map(operatorEntries, entry => {
    principalId: trim(split(entry, ':')[0])
    principalType: contains(entry, ':') ? trim(split(entry, ':')[1]) : ''
  })
)
// Each principal once, with the first type given (azd's own principal,
// typed by azd, is often also listed among the operators without a type):
// two assignments of one role to one principal on one scope would share a
// name, and the deployment would fail.
var operatorIds = map(operatorsGiven, op => op.principalId)
var operators = map(filter(range(0, length(operatorsGiven)), i => indexOf(operatorIds, operatorsGiven[i].principalId) == i), i => operatorsGiven[i])
// The console's own list of operators: every operator named above, and any further ids.
var azureConsoleOperators = join(union(filter(map(split(consoleOperators, ','), id => trim(id)), id => !empty(id)), map(operators, op => op.principalId)), ',')

// Created before everything that grants it access, and before the app.
module identity 'core/identity/user-assigned-identity.bicep' = {
  name: 'identity'
  params: {
    name: names.identity
    location: location
    tags: tags
  }
}
// Flex Consumption reads the deployment package from this blob container.
var deploymentContainerName = 'app-package-${take(resourceToken, 7)}'

module keyVault 'core/keyvault/key-vault.bicep' = if (ownKeyVault) {
  name: 'key-vault'
  params: {
    name: names.keyVault
    location: location
    tags: tags
  }
}

module monitoring 'core/monitor/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    logAnalyticsName: names.logAnalytics
    applicationInsightsName: names.appInsights
    location: location
    tags: tags
    retentionInDays: logRetentionInDays
  }
}

module storage 'core/storage/storage-account.bicep' = {
  name: 'storage'
  params: {
    name: names.storage
    location: location
    tags: tags
    skuName: storageSku
    publicNetworkAccess: vnetEnabled ? 'Disabled' : 'Enabled'
    containerNames: [
      deploymentContainerName
    ]
  }
}

module messaging 'app/messaging.bicep' = {
  name: 'messaging'
  params: {
    namespaceName: names.serviceBus
    location: location
    tags: tags
    skuName: serviceBusSku
    premiumMessagingUnits: serviceBusPremiumMessagingUnits
    resourceLogs: resourceLogs
    clientApplications: applications
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
    ordersQueueMaxSizeInMegabytes: ordersQueueMaxSizeInMegabytes
    claimTimeoutSeconds: azureClaimTimeoutSeconds
    stepTimeoutSeconds: azureStepTimeoutSeconds
    failureThreshold: failureThreshold
    longRetries: longRetries
    longRetryDelaySeconds: longRetryDelaySeconds
    starterIntervalSeconds: starterIntervalSeconds
    supervisorIntervalSeconds: supervisorIntervalSeconds
    maxRemoteStepsPerAttempt: maxRemoteStepsPerAttempt
  }
}

module stateStore 'app/state-store.bicep' = {
  name: 'state-store'
  params: {
    accountName: names.cosmos
    ordersAccountName: names.ordersCosmos
    ordersInSeparateAccount: ordersInSeparateAccount
    location: location
    tags: tags
    logAnalyticsWorkspaceId: monitoring.outputs.logAnalyticsWorkspaceId
    capacityMode: cosmosCapacityMode
    autoscaleMaxThroughput: cosmosAutoscaleMaxThroughput
    ordersAutoscaleMaxThroughput: ordersCosmosAutoscaleMaxThroughput
    ordersTtlSeconds: ordersTtlSeconds
    resourceLogs: resourceLogs
    stateDatabaseName: stateDatabaseName
    stateContainerName: stateContainerName
    recoveryIndexContainerName: recoveryIndexContainerName
    ordersDatabaseName: ordersDatabaseName
    ordersContainerName: ordersContainerName
  }
}

module durableTaskScheduler 'core/durable/durable-task-scheduler.bicep' = if (useScheduler) {
  name: 'durable-task-scheduler'
  params: {
    name: names.durableTaskScheduler
    location: location
    tags: tags
    taskHubName: taskHubName
    skuName: durableTaskSchedulerSku
    skuCapacity: durableTaskSchedulerCapacity
    ipAllowlist: durableTaskSchedulerIpAllowlist
    retentionDaysCompleted: durableRetentionDaysCompleted
    retentionDaysOther: durableRetentionDaysOther
  }
}

module network 'app/network.bicep' = if (vnetEnabled) {
  name: 'network'
  params: {
    vnetName: names.vnet
    location: location
    tags: tags
    storageAccountName: storage.outputs.name
    serviceBusNamespaceName: messaging.outputs.namespaceName
    serviceBusPremium: serviceBusSku == 'Premium'
    cosmosAccountNames: [
      stateStore.outputs.accountName
      stateStore.outputs.ordersAccountName
    ]
  }
}

module api 'app/api.bicep' = {
  name: 'api'
  params: {
    name: names.functionApp
    planName: names.plan
    location: location
    tags: tags
    instanceMemoryMB: instanceMemoryMB
    maximumInstanceCount: maximumInstanceCount
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    alwaysReady: [
      {
        name: 'durable'
        instanceCount: durableAlwaysReadyInstances
      }
    ]
    storageAccountName: storage.outputs.name
    virtualNetworkSubnetId: vnetEnabled ? network!.outputs.appSubnetId : ''
    deploymentContainerName: deploymentContainerName
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    serviceBusFullyQualifiedNamespace: messaging.outputs.fullyQualifiedNamespace
    cosmosEndpoint: stateStore.outputs.endpoint
    ordersCosmosEndpoint: stateStore.outputs.ordersEndpoint
    clientApplications: applications
    remoteServiceUrl: remoteServiceUrl
    agentSigningKeys: agentSigningKeysSetting
    replyTokenKeys: replyTokenKeysSetting
    taskHubName: taskHubName
    durableBackend: durableBackend
    durablePartitionCount: durablePartitionCount
    hostLogLevel: hostLogLevel
    traceSamplingRatio: traceSamplingRatio
    durableTaskSchedulerEndpoint: useScheduler ? durableTaskScheduler!.outputs.endpoint : ''
    ingressQueueRegistry: messaging.outputs.ingressQueueRegistry
    stateDatabaseName: stateDatabaseName
    stateContainerName: stateContainerName
    recoveryIndexContainerName: recoveryIndexContainerName
    recoveryIndexShards: recoveryIndexShards
    shardCount: shardCount
    shardIndex: shardIndex
    ordersDatabaseName: ordersDatabaseName
    ordersContainerName: ordersContainerName
    pendingBacklogLimit: pendingBacklogLimit
    backlogGaugeMaxAgeSeconds: backlogGaugeMaxAgeSeconds
    maxOrderBytes: maxOrderBytes
    maxProcessing: maxProcessing
    claimTimeoutSeconds: azureClaimTimeoutSeconds
    stepTimeoutSeconds: azureStepTimeoutSeconds
    failureThreshold: failureThreshold
    longRetryDelaySeconds: longRetryDelaySeconds
    longRetries: longRetries
    starterIntervalSeconds: starterIntervalSeconds
    starterBatchSize: starterBatchSize
    starterMaxBatches: starterMaxBatches
    starterRunBudgetSeconds: starterRunBudgetSeconds
    starterCountIntervalSeconds: starterCountIntervalSeconds
    supervisorIntervalSeconds: supervisorIntervalSeconds
    supervisorPageSize: supervisorPageSize
    supervisorMaxPages: supervisorMaxPages
    supervisorRunBudgetSeconds: supervisorRunBudgetSeconds
    supervisorScan: supervisorScan
    inlineSteps: inlineSteps
    consoleCsrfSecret: consoleCsrfSecret
    consoleAuthClientId: consoleAuthClientId
    consoleAuthConfirmed: consoleAuthConfirmed
    consoleOperators: azureConsoleOperators
    consoleOperatorRole: consoleOperatorRole
    // Only the operators may sign in to the console, when any are named.
    consoleAllowedIdentities: map(filter(operators, op => 'Group' != op.principalType), op => op.principalId)
    consoleAllowedGroups: map(filter(operators, op => 'Group' == op.principalType), op => op.principalId)
  }
  // The app starts (and Flex reads its package) with its grants in place.
  dependsOn: [
    rbac
  ]
}

module rbac 'app/rbac.bicep' = {
  name: 'rbac'
  params: {
    functionAppPrincipalId: identity.outputs.principalId
    clientApplications: applications
    serviceBusNamespaceName: messaging.outputs.namespaceName
    storageAccountName: storage.outputs.name
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    cosmosAccountName: stateStore.outputs.accountName
    ordersCosmosAccountName: stateStore.outputs.ordersAccountName
    stateDatabaseName: stateDatabaseName
    ordersDatabaseName: ordersDatabaseName
    durableTaskSchedulerName: useScheduler ? durableTaskScheduler!.outputs.name : ''
    operators: operators
    smokeAppId: smokeApplication ? smokeAppId : ''
    keyVaultName: names.keyVault
    keyVaultResourceGroupName: keysVaultResourceGroup
    keyVaultSecretsOfficers: ownKeyVault && !empty(principalId) ? [
      {
        principalId: principalId
        principalType: principalType
      }
    ] : []
  }
  // The vault exists before its role assignments (its name is known up front).
  dependsOn: [
    keyVault
  ]
}

module actionGroup 'core/monitor/action-group.bicep' = {
  name: 'action-group'
  params: {
    name: names.actionGroup
    shortName: 'orders-ops'
    tags: tags
    emailAddresses: alertEmails
  }
}

module alerts 'app/alerts.bicep' = {
  name: 'alerts'
  params: {
    location: location
    tags: tags
    namePrefix: 'orders-${resourceToken}'
    applicationInsightsId: monitoring.outputs.applicationInsightsId
    serviceBusNamespaceId: messaging.outputs.namespaceId
    actionGroupId: actionGroup.outputs.id
    pendingBacklogThreshold: pendingBacklogAlertThreshold
    ingressQueueNames: messaging.outputs.ingressQueueNames
  }
}

// Names and endpoints only; nothing here grants access.
output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = resourceGroup().name
output AZURE_FUNCTION_APP_NAME string = api.outputs.name
output SERVICE_API_NAME string = api.outputs.name
output SERVICEBUS_FULLY_QUALIFIED_NAMESPACE string = messaging.outputs.fullyQualifiedNamespace
output COSMOS_ACCOUNT_ENDPOINT string = stateStore.outputs.endpoint
output ORDERS_COSMOS_ACCOUNT_ENDPOINT string = stateStore.outputs.ordersEndpoint
output STORAGE_ACCOUNT_NAME string = storage.outputs.name
output AGENT_QUEUES_DUPLICATE_DETECTION_WINDOW string = messaging.outputs.duplicateDetectionWindow
output RETRY_BUDGET_SECONDS int = messaging.outputs.retryBudgetSeconds
output CLAIM_TIMEOUT_SECONDS int = azureClaimTimeoutSeconds
output STEP_TIMEOUT_SECONDS int = azureStepTimeoutSeconds
output AZURE_FUNCTION_APP_CLIENT_ID string = identity.outputs.clientId
output ORDER_INGRESS_QUEUES object = messaging.outputs.ingressQueueRegistry
output DURABLE_BACKEND string = durableBackend
// deploy/keys.py (postprovision) creates these vault entries when absent
// (names only, no value; nothing here reads the secure parameters).
output INTERNAL_VAULT_NAME string = names.keyVault
output INTERNAL_VAULT_RESOURCE_GROUP string = keysVaultResourceGroup
output INTERNAL_VAULT_ENTRIES string = '${keySecretNames.agentSigningKeys},${keySecretNames.replyTokenKeys}'
output DURABLE_TASK_SCHEDULER_ENDPOINT string = useScheduler ? durableTaskScheduler!.outputs.endpoint : ''
