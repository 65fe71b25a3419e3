metadata description = 'Every role assignment of the deployment: what each identity uses, and no more. The function app reaches only the queues it triggers on or sends to; each client application sends to its own ingress queue and reads its own reply queue only; operators read and settle operator alerts and work on the state database.'

import { clientApplication, operatorPrincipal } from '../types.bicep'

@description('Principal (object) id of the app\'s user-assigned identity; it exists before the app, so these grants can be in place before the first deploy.')
param functionAppPrincipalId string
param clientApplications clientApplication[]
param serviceBusNamespaceName string
param storageAccountName string
param applicationInsightsName string
param cosmosAccountName string
param ordersCosmosAccountName string
param stateDatabaseName string
param ordersDatabaseName string
@description('Durable Task Scheduler name; empty when the task hub lives in the storage account.')
param durableTaskSchedulerName string = ''
@description('Operators (people, groups or CI principals running `python -m cli` and the portal\'s Data Explorer), each with its own principal type.')
param operators operatorPrincipal[] = []
@description('Key Vault holding AGENT_SIGNING_KEYS and REPLY_TOKEN_KEYS, which the app resolves as its identity (Key Vault Secrets User); empty grants nothing.')
param keyVaultName string = ''
@description('Resource group of that vault (the deployment\'s own unless an existing vault is used).')
param keyVaultResourceGroupName string = resourceGroup().name
@description('Who creates the keys in the template\'s own vault after provision (deploy/keys.py, azd\'s postprovision hook): Key Vault Secrets Officer there. Empty for an existing vault, whose owner grants it.')
param keyVaultSecretsOfficers operatorPrincipal[] = []
@description('AppId of the smoke application (its queues orders-<id> and replies-<id>); empty when it is not deployed. The operators send the smoke test\'s order and receive its statuses, so `azd up` needs no client identity.')
param smokeAppId string = ''

// Built-in role definitions (ids are the same in every tenant).
var roles = {
  serviceBusDataSender: '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
  serviceBusDataReceiver: '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
  serviceBusDataOwner: '090c5cfd-751d-490a-894a-3ce6f1109419'
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
  durableTaskDataContributor: '0ad04412-c4d5-4796-b79c-f76d14c8d402'
  durableTaskDataReader: 'd6a5505f-6ebb-45a4-896e-ac8274cfc0ac'
  keyVaultSecretsUser: '4633458b-17de-408a-b874-0445c86b69e6'
  keyVaultSecretsOfficer: 'b86a8fe4-44ce-4948-aee5-eccb2c155cd7'
}
// Cosmos DB data-plane role (sqlRoleDefinitions of the account).
var cosmosBuiltInDataContributor = '00000000-0000-0000-0000-000000000002'

var ingressQueueNames = [for app in clientApplications: 'orders-${app.appId}']
var replyQueueNames = [for app in clientApplications: app.replyQueueName]

// The function app on the fixed queues: receive where a trigger reads, send
// where the app posts.
var appQueueGrants = [
  {
    // The Scheduler posts step requests; the Agent, the delayed copy of a
    // refused request whose alert could not be queued (agents/messaging.py).
    queue: 'agent-requests'
    role: 'serviceBusDataSender'
  }
  {
    // The Agent's trigger.
    queue: 'agent-requests'
    role: 'serviceBusDataReceiver'
  }
  {
    // The Agent posts replies.
    queue: 'agent-responses'
    role: 'serviceBusDataSender'
  }
  {
    // The reply bridge's trigger.
    queue: 'agent-responses'
    role: 'serviceBusDataReceiver'
  }
  {
    // Operator alerts from Submit, the Scheduler and the Supervisor.
    queue: 'alerts'
    role: 'serviceBusDataSender'
  }
  {
    // The console peeks alerts and alerts' dead letters. Service Bus roles
    // are scoped to a queue at the finest, and a queue's dead-letter queue is
    // no resource of its own: Receiver on a queue covers both. It would also
    // let the app receive (consume) alerts; only the console's peek uses it.
    // The console's other dead-letter lists are of queues the app already
    // receives from. Reply queues get no Receiver: only the client reads them.
    queue: 'alerts'
    role: 'serviceBusDataReceiver'
  }
]

// The host's storage: blobs (leases, timers, deployment package), queues and
// tables (the Durable task hub with the azureStorage backend).
var appStorageRoles = [
  'storageBlobDataOwner'
  'storageQueueDataContributor'
  'storageTableDataContributor'
]

// What operators get, by `python -m cli` command:
//   alerts                 receive (peek or settle) on alerts: Receiver there
//   show/list/stuck/resubmit/compensate
//                          read and write the state database (Cosmos, below)
// and nothing else. Receiver on a queue is also the right to consume it (no
// built-in role peeks only), so operators hold it on no work queue: an
// operator consuming agent-requests, agent-responses or a client's reply
// queue would lose messages the system or a client is waiting for, and
// Sender on an ingress queue would let an operator send orders in a client's
// name. Dead letters of the work queues are read through the console (the
// app's identity peeks them); `cli deadletters`, `cli watch` and `cli post`
// are for the local stack, or for a principal granted that queue on purpose.
// The smoke test posts with a client application's identity (deploy/smoke.py).
var operatorQueueGrants = concat(map(operators, operator => {
  principalId: operator.principalId
  principalType: operator.principalType
  queue: 'alerts'
  role: 'serviceBusDataReceiver'
}), empty(smokeAppId) ? [] : flatten(map(operators, operator => [
  {
    principalId: operator.principalId
    principalType: operator.principalType
    queue: 'orders-${smokeAppId}'
    role: 'serviceBusDataSender'
  }
  {
    principalId: operator.principalId
    principalType: operator.principalType
    queue: 'replies-${smokeAppId}'
    role: 'serviceBusDataReceiver'
  }
])))

// The Service Bus trigger's target-based scaler reads each trigger queue's
// message count (GetQueueRuntimeProperties), which needs the Manage right;
// of the built-in data roles only Data Owner carries it. Without it the
// scaler cannot count and falls back to peeking, seeing at most one message
// (azure-functions-host #8892; the official Flex + Service Bus quickstart
// grants Data Owner for the same reason, namespace-wide). Granted here per
// trigger queue, not on the namespace.
var triggerQueueNames = concat(['agent-requests', 'agent-responses'], ingressQueueNames)

// Deployment names are at most 64 characters, hence take().
// Client applications whose identity is known; the others get no access
// until one is given.
var clientsWithIdentity = filter(clientApplications, app => !empty(app.principalId))

module appQueueRoles '../core/security/servicebus-queue-role.bicep' = [for grant in appQueueGrants: {
  name: take('rbac-app-${grant.queue}-${grant.role}', 64)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: grant.queue
    roleDefinitionId: roles[grant.role]
    principalId: functionAppPrincipalId
  }
}]

module appTriggerQueueScale '../core/security/servicebus-queue-role.bicep' = [for queue in triggerQueueNames: {
  name: take('rbac-app-scale-${queue}', 64)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: queue
    roleDefinitionId: roles.serviceBusDataOwner
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

// Submit receives from every application's ingress queue.
module appIngressReceive '../core/security/servicebus-queue-role.bicep' = [for app in clientApplications: {
  name: take('rbac-app-receive-orders-${app.appId}', 64)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: 'orders-${app.appId}'
    roleDefinitionId: roles.serviceBusDataReceiver
    principalId: functionAppPrincipalId
  }
}]

// Submit's transient failures are retried later, as a scheduled copy on the
// same ingress queue (adapters/settlement.py, MessageGate): the app sends there
// too. No client can, except the application that owns the queue.
module appIngressRetrySend '../core/security/servicebus-queue-role.bicep' = [for app in clientApplications: {
  name: take('rbac-app-retry-orders-${app.appId}', 64)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: 'orders-${app.appId}'
    roleDefinitionId: roles.serviceBusDataSender
    principalId: functionAppPrincipalId
  }
}]

// Status updates go to every registered reply queue.
module appReplyQueueSend '../core/security/servicebus-queue-role.bicep' = [for app in clientApplications: {
  name: take('rbac-app-send-${app.replyQueueName}', 64)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: app.replyQueueName
    roleDefinitionId: roles.serviceBusDataSender
    principalId: functionAppPrincipalId
  }
}]

// A client reads its own reply queue and no other.
module clientReplyQueueReceive '../core/security/servicebus-queue-role.bicep' = [for app in clientsWithIdentity: {
  name: take('rbac-client-receive-${app.appId}', 64)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: app.replyQueueName
    roleDefinitionId: roles.serviceBusDataReceiver
    principalId: app.principalId
    principalType: 'ServicePrincipal'
  }
}]

// A client submits orders to its own ingress queue and no other, so the
// queue an order arrives on says which application sent it.
module clientOrdersSend '../core/security/servicebus-queue-role.bicep' = [for app in clientsWithIdentity: {
  name: take('rbac-client-send-orders-${app.appId}', 64)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: 'orders-${app.appId}'
    roleDefinitionId: roles.serviceBusDataSender
    principalId: app.principalId
    principalType: 'ServicePrincipal'
  }
}]

module appStorage '../core/security/storage-role.bicep' = [for role in appStorageRoles: {
  name: 'rbac-app-storage-${role}'
  params: {
    storageAccountName: storageAccountName
    roleDefinitionId: roles[role]
    principalId: functionAppPrincipalId
  }
}]

module appTelemetry '../core/security/appinsights-role.bicep' = {
  name: 'rbac-app-appinsights-monitoringMetricsPublisher'
  params: {
    applicationInsightsName: applicationInsightsName
    roleDefinitionId: roles.monitoringMetricsPublisher
    principalId: functionAppPrincipalId
  }
}

module appDurableTask '../core/security/durabletask-role.bicep' = if (!empty(durableTaskSchedulerName)) {
  name: 'rbac-app-durabletask'
  params: {
    schedulerName: durableTaskSchedulerName
    roleDefinitionId: roles.durableTaskDataContributor
    principalId: functionAppPrincipalId
  }
}

// Read and write items in the two databases the app uses; no account-wide
// grant, and no control-plane rights (databases and containers come from
// this template, not from the app).
//
// Cosmos DB runs one control-plane operation per account at a time and
// answers a concurrent one with 412 ("another operation in progress"), so
// the SQL role assignments run one after another: each depends on the one
// before, and the operators' loop runs with a batch size of one.
// The scheduler's dashboard (https://dashboard.durabletask.io) shows an
// operator the orchestrations of the task hub: Durable Task Data Reader,
// read-only (terminating from the dashboard needs Data Contributor).
module operatorDurableTaskDashboard '../core/security/durabletask-role.bicep' = [for operator in (empty(durableTaskSchedulerName) ? [] : operators): {
  name: take('rbac-op-${uniqueString(operator.principalId)}-durabletask-dashboard', 64)
  params: {
    schedulerName: durableTaskSchedulerName
    roleDefinitionId: roles.durableTaskDataReader
    principalId: operator.principalId
    principalType: operator.principalType
  }
}]

module appStateData '../core/security/cosmos-sql-role.bicep' = {
  name: 'rbac-app-cosmos-state'
  params: {
    accountName: cosmosAccountName
    databaseName: stateDatabaseName
    sqlRoleDefinitionId: cosmosBuiltInDataContributor
    principalId: functionAppPrincipalId
  }
}

module appOrdersData '../core/security/cosmos-sql-role.bicep' = {
  name: 'rbac-app-cosmos-orders'
  params: {
    accountName: ordersCosmosAccountName
    databaseName: ordersDatabaseName
    sqlRoleDefinitionId: cosmosBuiltInDataContributor
    principalId: functionAppPrincipalId
  }
  dependsOn: [
    appStateData
  ]
}

// Operators: resubmit and compensate write state records; nothing in the
// orders database (the CLI does not read it).
@batchSize(1)
module operatorStateData '../core/security/cosmos-sql-role.bicep' = [for operator in operators: {
  name: take('rbac-operator-cosmos-state-${uniqueString(operator.principalId)}', 64)
  params: {
    accountName: cosmosAccountName
    databaseName: stateDatabaseName
    sqlRoleDefinitionId: cosmosBuiltInDataContributor
    principalId: operator.principalId
  }
  dependsOn: [
    appOrdersData
  ]
}]

module operatorQueueRoles '../core/security/servicebus-queue-role.bicep' = [for grant in operatorQueueGrants: {
  // The hash first: take() must not cut what tells two grants apart.
  name: take('rbac-op-${uniqueString(grant.principalId, grant.queue, grant.role)}-${grant.queue}', 64)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: grant.queue
    roleDefinitionId: roles[grant.role]
    principalId: grant.principalId
    principalType: grant.principalType
  }
}]

module appKeyVault '../core/security/keyvault-role.bicep' = if (!empty(keyVaultName)) {
  name: 'rbac-app-keyvault-secrets-user'
  scope: resourceGroup(keyVaultResourceGroupName)
  params: {
    vaultName: keyVaultName
    roleDefinitionId: roles.keyVaultSecretsUser
    principalId: functionAppPrincipalId
  }
}

module keyVaultOfficers '../core/security/keyvault-role.bicep' = [for officer in keyVaultSecretsOfficers: {
  name: take('rbac-keys-${uniqueString(officer.principalId)}-officer', 64)
  scope: resourceGroup(keyVaultResourceGroupName)
  params: {
    vaultName: keyVaultName
    roleDefinitionId: roles.keyVaultSecretsOfficer
    principalId: officer.principalId
    principalType: officer.principalType
  }
}]
