metadata description = 'The order-processing queues: their names are fixed by the app and by devstack/servicebus/Config.json; their timing follows host.json and the retry budget (see infra/README.md, "Queue timing").'

import { clientApplication } from '../types.bicep'

param namespaceName string
param location string = resourceGroup().location
param tags object = {}
@allowed(['Standard', 'Premium'])
param skuName string = 'Standard'
@description('Premium only: messaging units.')
@allowed([1, 2, 4, 8, 16])
param premiumMessagingUnits int = 1
@description('Send the namespace\'s resource logs to Log Analytics; false keeps its metrics only.')
param resourceLogs bool = true

@description('Client applications; each gets its own ingress queue (orders-<appId>) and its own reply queue.')
param clientApplications clientApplication[]
@description('Log Analytics workspace for the namespace\'s diagnostic logs.')
param logAnalyticsWorkspaceId string

@description('Upper bound of each ingress queue (orders-<appId>): admission control, a queue cannot grow without limit.')
@allowed([1024, 2048, 3072, 4096, 5120])
param ordersQueueMaxSizeInMegabytes int = 1024

// The retry budget. Same values as the app settings of the same meaning.
param claimTimeoutSeconds int
param stepTimeoutSeconds int
param failureThreshold int
param longRetries int
param longRetryDelaySeconds int
param starterIntervalSeconds int
param supervisorIntervalSeconds int
@description('Most remote (agent) steps one attempt runs; each may wait a full step timeout.')
param maxRemoteStepsPerAttempt int

// One attempt, worst case: the claim timeout (the orchestration never started),
// then every remote step waiting out its deadline, then one Supervisor tick to
// notice and one Starter tick to claim again.
var attemptSeconds = claimTimeoutSeconds + (maxRemoteStepsPerAttempt * stepTimeoutSeconds) + supervisorIntervalSeconds + starterIntervalSeconds
// FAILURE_THRESHOLD attempts, then LONG_RETRIES waits of LONG_RETRY_DELAY_SECONDS, each followed by one more attempt.
var retryBudgetSeconds = (failureThreshold * attemptSeconds) + (longRetries * (longRetryDelaySeconds + attemptSeconds))
// Whole minutes, rounded up, plus a margin for clock skew and queueing delay;
// Service Bus allows at most 7 days (10080 minutes).
var duplicateDetectionMarginMinutes = 30
var duplicateDetectionWindowMinutes = min(10080, ((retryBudgetSeconds + 59) / 60) + duplicateDetectionMarginMinutes)
var duplicateDetectionWindow = 'PT${duplicateDetectionWindowMinutes}M'

// The agent runs until the step deadline, then posts its reply and settles
// (a minute of margin): its lock must outlast that, in whole minutes, and
// 5 minutes is the Service Bus maximum. The host also renews locks
// (host.json maxAutoLockRenewalDuration), so this is the floor, not the cap.
var agentRequestLockMinutes = min(5, (stepTimeoutSeconds + 60 + 59) / 60)

// The ingress queues, one per client application (below). There is no shared
// `orders` queue: Submit triggers on each orders-<appId> only, and the queue an
// order arrived on names its sender. Submit (PeekLock, manual settlement):
// redelivery retries transient failures; a poison order is dead-lettered
// after 5 tries.
var ingressQueueProperties = {
  lockDuration: 'PT1M'
  maxDeliveryCount: 5
  maxSizeInMegabytes: ordersQueueMaxSizeInMegabytes
  requiresDuplicateDetection: true
  duplicateDetectionHistoryTimeWindow: 'PT10M'
  defaultMessageTimeToLive: 'P1D'
  deadLetteringOnMessageExpiration: true
  requiresSession: false
  enableBatchedOperations: true
}

var fixedQueues = [
  {
    // Scheduler -> Agent. MessageId {instance id}/{step} is stable across
    // resends, so duplicate detection drops a resent request.
    name: 'agent-requests'
    properties: {
      lockDuration: 'PT${agentRequestLockMinutes}M'
      maxDeliveryCount: 5
      maxSizeInMegabytes: 1024
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
      defaultMessageTimeToLive: 'PT1H'
      deadLetteringOnMessageExpiration: true
      requiresSession: false
      enableBatchedOperations: true
    }
  }
  {
    // Agent -> reply bridge -> orchestration event.
    name: 'agent-responses'
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 5
      maxSizeInMegabytes: 1024
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
      defaultMessageTimeToLive: 'PT1H'
      deadLetteringOnMessageExpiration: true
      requiresSession: false
      enableBatchedOperations: true
    }
  }
  {
    // Operator alerts: read by people and tools, kept a week, never expire into the dead-letter queue.
    // An alert raised again for the same incident (a retried status outbox entry, a
    // redelivered dead letter) keeps its message id, so detection pages operators once a day at most.
    name: 'alerts'
    properties: {
      lockDuration: 'PT1M'
      maxDeliveryCount: 10
      maxSizeInMegabytes: 1024
      requiresDuplicateDetection: true
      duplicateDetectionHistoryTimeWindow: 'P1D'
      defaultMessageTimeToLive: 'P7D'
      deadLetteringOnMessageExpiration: false
      requiresSession: false
      enableBatchedOperations: true
    }
  }
]

// One reply queue per client application; status updates carry OrderID and a
// stable MessageId, so a resent update is dropped.
var replyQueues = [for app in clientApplications: {
  name: app.replyQueueName
  properties: {
    lockDuration: 'PT1M'
    maxDeliveryCount: 10
    maxSizeInMegabytes: 1024
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: 'PT10M'
    defaultMessageTimeToLive: 'P7D'
    deadLetteringOnMessageExpiration: true
    requiresSession: false
    enableBatchedOperations: true
  }
}]

// One ingress queue per client application: only that application may send
// to it (app/rbac.bicep), so the queue a message arrived on names its sender.
var ingressQueues = [for app in clientApplications: {
  name: 'orders-${app.appId}'
  properties: ingressQueueProperties
}]

module namespace '../core/messaging/servicebus.bicep' = {
  name: 'servicebus-namespace'
  params: {
    name: namespaceName
    location: location
    tags: tags
    skuName: skuName
    premiumCapacity: premiumMessagingUnits
    queues: concat(fixedQueues, ingressQueues, replyQueues)
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    resourceLogs: resourceLogs
  }
}

output ingressQueueRegistry object = toObject(clientApplications, app => app.appId, app => 'orders-${app.appId}')
output ingressQueueNames string[] = [for app in clientApplications: 'orders-${app.appId}']
output namespaceId string = namespace.outputs.id
output namespaceName string = namespace.outputs.name
output fullyQualifiedNamespace string = namespace.outputs.fullyQualifiedNamespace
output retryBudgetSeconds int = retryBudgetSeconds
output duplicateDetectionWindow string = duplicateDetectionWindow
