metadata description = 'Every role assignment of the deployment: what each identity uses, and no more. The function app reaches only the queues it triggers on or sends to; each client application sends orders and reads its own reply queue only.'

import { clientApplication } from '../types.bicep'

param functionAppPrincipalId string
param clientApplications clientApplication[]
param serviceBusNamespaceName string
param storageAccountName string
param applicationInsightsName string
param cosmosAccountName string
param ordersCosmosAccountName string
param stateDatabaseName string
param ordersDatabaseName string

// Built-in role definitions (ids are the same in every tenant).
var roles = {
  serviceBusDataSender: '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
  serviceBusDataReceiver: '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
}
// Cosmos DB data-plane role (sqlRoleDefinitions of the account).
var cosmosBuiltInDataContributor = '00000000-0000-0000-0000-000000000002'

// The function app on the fixed queues: receive where a trigger reads, send
// where the app posts.
var appQueueGrants = [
  {
    // Submit's trigger; settling (complete, dead-letter) is part of receiving.
    queue: 'orders'
    role: 'serviceBusDataReceiver'
  }
  {
    // The Scheduler posts step requests.
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
]

// The host's storage: blobs (leases, timers, deployment package), queues and
// tables (the Durable task hub).
var appStorageRoles = [
  'storageBlobDataOwner'
  'storageQueueDataContributor'
  'storageTableDataContributor'
]

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
  }
}]

// A client submits orders.
module clientOrdersSend '../core/security/servicebus-queue-role.bicep' = [for app in clientsWithIdentity: {
  name: take('rbac-client-send-orders-${app.appId}', 64)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: 'orders'
    roleDefinitionId: roles.serviceBusDataSender
    principalId: app.principalId
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

// Read and write items in the two databases the app uses; no account-wide
// grant, and no control-plane rights (databases and containers come from
// this template, not from the app).
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
}
