metadata description = 'The order-processing function app (Python 3.11, Flex Consumption) and its app settings. Every connection is identity-based, through the user-assigned identity named by clientId: no key, SAS or connection string is set.'

import { clientApplication } from '../types.bicep'

param name string
param planName string
param location string = resourceGroup().location
param tags object = {}
@allowed([512, 2048, 4096])
param instanceMemoryMB int = 2048
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('Resource id of the user-assigned identity the app runs as.')
param identityId string
@description('Client (application) id of that identity: every connection names it, so the host and the SDKs pick it and no other.')
param identityClientId string
@description('Always-ready instances ({ name, instanceCount }); the durable group needs one (see infra/README.md, "Timing on Flex").')
param alwaysReady array

param storageAccountName string
@description('vnetEnabled: the app\'s integration subnet; empty: none.')
param virtualNetworkSubnetId string = ''
param deploymentContainerName string
param applicationInsightsName string
param serviceBusFullyQualifiedNamespace string
param cosmosEndpoint string
@description('Endpoint of the account holding the orders database; equal to cosmosEndpoint when both share one account.')
param ordersCosmosEndpoint string
param clientApplications clientApplication[]
@description('Base URL of the remote service the agents call.')
param remoteServiceUrl string
@description('AGENT_SIGNING_KEYS and REPLY_TOKEN_KEYS: Key Vault references (resolved with the app\'s identity, keyVaultReferenceIdentity) or the keys (ADR 017e).')
@secure()
param agentSigningKeys string
@secure()
param replyTokenKeys string

param taskHubName string
@description('azureStorage: the task hub lives in the host storage account (host.json). durableTaskScheduler: the app settings below switch the provider to the scheduler.')
@allowed(['azureStorage', 'durableTaskScheduler'])
param durableBackend string = 'azureStorage'
@description('The scheduler endpoint (durableTaskScheduler only).')
param durableTaskSchedulerEndpoint string = ''
@description('azureStorage only: the task hub\'s control-queue partitions (host.json extensions.durableTask.storageProvider.partitionCount; 4 is the extension\'s default).')
@minValue(1)
@maxValue(16)
param durablePartitionCount int = 4
@description('The host\'s log level (host.json logging.logLevel), set by app setting.')
@allowed(['Information', 'Warning', 'Error'])
param hostLogLevel string = 'Information'
@description('Share of traces the OpenTelemetry exporter keeps (1 = all).')
param traceSamplingRatio string = '1'
@description('Client applications\' ingress queues: {appId: queue}. Submit listens on each; the AppId of an order is the queue it came from.')
param ingressQueueRegistry object
param stateDatabaseName string
param stateContainerName string
param recoveryIndexContainerName string
param recoveryIndexShards int
@description('SHARD_COUNT and SHARD_INDEX: this deployment is shard shardIndex of shardCount (docs/adr/020e-task-hub-shards.md).')
param shardCount int
param shardIndex int
param ordersDatabaseName string
param ordersContainerName string

param pendingBacklogLimit int
param backlogGaugeMaxAgeSeconds int
param maxOrderBytes int
param maxProcessing int
param claimTimeoutSeconds int
param stepTimeoutSeconds int
param failureThreshold int
param longRetryDelaySeconds int
param longRetries int
param starterIntervalSeconds int
param starterBatchSize int
param starterMaxBatches int
param starterRunBudgetSeconds int
param starterCountIntervalSeconds int
param supervisorIntervalSeconds int
param supervisorPageSize int
param supervisorMaxPages int
param supervisorRunBudgetSeconds int
@allowed(['query', 'index'])
param supervisorScan string
param inlineSteps string

@description('Key of the console\'s confirmation-form tokens (CONSOLE_CSRF_SECRET): one value for every instance, so a form minted on one is accepted by another.')
@secure()
param consoleCsrfSecret string
@description('Entra ID app registration operators sign in to the console with (see core/host/flex-function.bicep).')
param consoleAuthClientId string
@description('CONSOLE_AUTH_CONFIRMED: the console answers (in Azure) only when this is \'true\'.')
@allowed(['true', 'false'])
param consoleAuthConfirmed string
param consoleAllowedIdentities string[]
param consoleAllowedGroups string[]
@description('CONSOLE_OPERATORS: the principal (object) ids of users, groups or service principals the app itself admits as console operators, comma-separated.')
param consoleOperators string
@description('CONSOLE_OPERATOR_ROLE: an app role of the console\'s app registration whose holders the app admits as operators besides CONSOLE_OPERATORS. Empty: none.')
param consoleOperatorRole string

// HTTP endpoints that keep the host's own key-based authorization instead of
// the console's Entra sign-in: the durable extension's webhooks (system key)
// and the host's admin API (master key). The app has no other HTTP function.
var authExcludedPaths = [
  '/runtime/webhooks/durabletask/*'
  '/admin/*'
]

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

// {appId: replyQueueName, or {queue, progress: true} for an application that asked for
// progress statuses}: the only reply queues the app will send to (docs/settings.md).
var replyQueueRegistry = toObject(clientApplications, app => app.appId, app => (app.?progress ?? false) ? { queue: app.replyQueueName, progress: true } : app.replyQueueName)

var appSettings = union(baseSettings, durableBackendSettings)

var baseSettings = {
  // Host storage (AzureWebJobsStorage and, with the azureStorage backend, the
  // Durable task hub) through the user-assigned identity; one URI per service.
  AzureWebJobsStorage__blobServiceUri: storage.properties.primaryEndpoints.blob
  AzureWebJobsStorage__queueServiceUri: storage.properties.primaryEndpoints.queue
  AzureWebJobsStorage__tableServiceUri: storage.properties.primaryEndpoints.table
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  TASKHUB_NAME: taskHubName
  // The SDK clients the app builds itself (azure-identity) take the identity
  // from here: ManagedIdentityCredential(client_id=AZURE_CLIENT_ID), and
  // DefaultAzureCredential honours it too.
  AZURE_CLIENT_ID: identityClientId

  // The connection string only locates the component; ingestion is
  // authenticated with the app's identity (local auth is disabled on it).
  APPLICATIONINSIGHTS_CONNECTION_STRING: appInsights.properties.ConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
  // OpenTelemetry: the host emits OTel (not the classic SDK), and the Python
  // worker forwards its logs and spans through the Azure Monitor distro, so
  // custom dimensions and the W3C trace context reach Application Insights.
  AzureFunctionsJobHost__telemetryMode: 'OpenTelemetry'
  PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY: 'true'
  OTEL_SERVICE_NAME: 'order-processing'
  // Sampling of traces (requests, dependencies, the app's spans) by the Azure
  // Monitor distro's fixed-percentage sampler; 1 keeps all. Logs and metrics
  // are not sampled, so the alerts (log lines, metrics) see everything.
  OTEL_TRACES_SAMPLER: 'microsoft.fixed_percentage'
  OTEL_TRACES_SAMPLER_ARG: traceSamplingRatio
  // host.json's log level (default, which covers the Durable extension's
  // Host.Triggers.DurableTask too), overridden per deployment: Warning in the
  // production profile. Only letters, digits and underscores: a setting
  // named after a category with dots may not reach the host on Linux.
  AzureFunctionsJobHost__logging__logLevel__default: hostLogLevel
  // The same level for the app's own Python loggers (adapters/telemetry.py):
  // the worker forwards and exports its records by Python's levels, not
  // host.json's, so Warning here is what keeps routine INFO lines out of
  // Application Insights.
  APP_LOG_LEVEL: hostLogLevel
  // The app's own packages (.python_packages) before the worker's: the
  // Service Bus SDK-type binding needs protobuf >= 6.31 and grpcio >= 1.74,
  // newer than the 3.11 worker ships, and without isolation the worker's
  // copies stay loaded and the import of function_app fails, indexing no
  // function (docs/adr/017c-worker-dependency-isolation.md; the import is
  // tested against the worker's pins in tests/deploy/test_worker_pins.py).
  PYTHON_ISOLATE_WORKER_DEPENDENCIES: '1'

  ServiceBusConnection__fullyQualifiedNamespace: serviceBusFullyQualifiedNamespace
  ServiceBusConnection__credential: 'managedidentity'
  ServiceBusConnection__clientId: identityClientId
  CosmosDbConnection__accountEndpoint: cosmosEndpoint
  CosmosDbConnection__credential: 'managedidentity'
  CosmosDbConnection__clientId: identityClientId
  OrdersDbConnection__accountEndpoint: ordersCosmosEndpoint
  OrdersDbConnection__credential: 'managedidentity'
  OrdersDbConnection__clientId: identityClientId
  COSMOS_VERIFY_TLS: 'true'

  STATE_DATABASE_NAME: stateDatabaseName
  STATE_CONTAINER_NAME: stateContainerName
  RECOVERY_INDEX_CONTAINER_NAME: recoveryIndexContainerName
  RECOVERY_INDEX_SHARDS: string(recoveryIndexShards)
  SHARD_COUNT: string(shardCount)
  SHARD_INDEX: string(shardIndex)
  ORDERS_DATABASE_NAME: ordersDatabaseName
  ORDERS_CONTAINER_NAME: ordersContainerName

  REPLY_QUEUE_REGISTRY: string(replyQueueRegistry)
  ORDER_INGRESS_QUEUES: string(ingressQueueRegistry)
  REMOTE_SERVICE_URL: remoteServiceUrl
  AGENT_SIGNING_KEYS: agentSigningKeys
  REPLY_TOKEN_KEYS: replyTokenKeys
  PENDING_BACKLOG_LIMIT: string(pendingBacklogLimit)
  BACKLOG_GAUGE_MAX_AGE_SECONDS: string(backlogGaugeMaxAgeSeconds)
  MAX_ORDER_BYTES: string(maxOrderBytes)
  MAX_PROCESSING: string(maxProcessing)
  CLAIM_TIMEOUT_SECONDS: string(claimTimeoutSeconds)
  STEP_TIMEOUT_SECONDS: string(stepTimeoutSeconds)
  FAILURE_THRESHOLD: string(failureThreshold)
  LONG_RETRY_DELAY_SECONDS: string(longRetryDelaySeconds)
  LONG_RETRIES: string(longRetries)
  // NCRONTAB with seconds: every N seconds (N divides 60, see main.bicep).
  STARTER_SCHEDULE: '*/${starterIntervalSeconds} * * * * *'
  STARTER_BATCH_SIZE: string(starterBatchSize)
  STARTER_MAX_BATCHES: string(starterMaxBatches)
  STARTER_RUN_BUDGET_SECONDS: string(starterRunBudgetSeconds)
  STARTER_COUNT_INTERVAL_SECONDS: string(starterCountIntervalSeconds)
  SUPERVISOR_SCHEDULE: '*/${supervisorIntervalSeconds} * * * * *'
  SUPERVISOR_PAGE_SIZE: string(supervisorPageSize)
  SUPERVISOR_MAX_PAGES: string(supervisorMaxPages)
  SUPERVISOR_RUN_BUDGET_SECONDS: string(supervisorRunBudgetSeconds)
  SUPERVISOR_SCAN: supervisorScan
  INLINE_STEPS: inlineSteps
  CONSOLE_CSRF_SECRET: consoleCsrfSecret
  CONSOLE_AUTH_CONFIRMED: consoleAuthConfirmed
  // The app's own list of who may operate (console.security.may_operate), the
  // same principals sign-in admits: it does not rest on the principal header alone.
  CONSOLE_OPERATORS: consoleOperators
  CONSOLE_OPERATOR_ROLE: consoleOperatorRole
  // COSMOS_CREATE_CONTAINERS stays unset (false): these templates create the
  // databases and containers, and the app's data-plane role could not.
}

// host.json names the Azure Storage provider; an app setting of the form
// AzureFunctionsJobHost__<path> overrides the host.json value at that path,
// so the scheduler is selected here and host.json stays as it is.
var durableBackendSettings = (durableBackend == 'durableTaskScheduler') ? {
  AzureFunctionsJobHost__extensions__durableTask__storageProvider__type: 'azureManaged'
  AzureFunctionsJobHost__extensions__durableTask__storageProvider__connectionStringName: 'DURABLE_TASK_SCHEDULER_CONNECTION_STRING'
  // Not a secret: an endpoint and the identity to authenticate as.
  DURABLE_TASK_SCHEDULER_CONNECTION_STRING: 'Endpoint=${durableTaskSchedulerEndpoint};Authentication=ManagedIdentity;ClientID=${identityClientId}'
} : {
  // The Azure Storage provider as host.json names it; only its partitions
  // (control queues, each run by one instance at a time) are set here.
  AzureFunctionsJobHost__extensions__durableTask__storageProvider__partitionCount: string(durablePartitionCount)
}

module plan '../core/host/flex-plan.bicep' = {
  name: 'flex-plan'
  params: {
    name: planName
    location: location
    tags: tags
  }
}

module functionApp '../core/host/flex-function.bicep' = {
  name: 'function-app'
  params: {
    name: name
    location: location
    // azd finds the app to deploy to by this tag.
    tags: union(tags, {
      'azd-service-name': 'api'
    })
    planId: plan.outputs.id
    storageAccountName: storageAccountName
    deploymentContainerName: deploymentContainerName
    identityId: identityId
    alwaysReady: alwaysReady
    runtimeName: 'python'
    runtimeVersion: '3.11'
    instanceMemoryMB: instanceMemoryMB
    maximumInstanceCount: maximumInstanceCount
    appSettings: appSettings
    authClientId: consoleAuthClientId
    authAllowedIdentities: consoleAllowedIdentities
    authAllowedGroups: consoleAllowedGroups
    authExcludedPaths: authExcludedPaths
    virtualNetworkSubnetId: virtualNetworkSubnetId
  }
}

output name string = functionApp.outputs.name
output defaultHostName string = functionApp.outputs.defaultHostName
