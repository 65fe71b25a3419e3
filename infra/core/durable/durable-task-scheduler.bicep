metadata description = 'A Durable Task Scheduler and one task hub: the managed Durable Functions backend (durableBackend = durableTaskScheduler). Access is by Microsoft Entra ID only (Durable Task Data Contributor, assigned in app/rbac.bicep); the IP allow-list is a second gate in front of it.'

param name string
param location string = resourceGroup().location
param tags object = {}
param taskHubName string
@allowed(['Consumption', 'Dedicated'])
param skuName string = 'Consumption'
@description('Dedicated only: capacity units.')
@minValue(1)
param skuCapacity int = 1
@description('CIDR ranges admitted to the scheduler. An empty list admits nobody, and Flex Consumption has no fixed outbound address, so the default admits every address and leaves access to the identity check; narrow it to the NAT gateway\'s address when the app has a virtual network.')
@minLength(1)
param ipAllowlist string[] = [
  '0.0.0.0/0'
]
@description('Days a Completed orchestration\'s history is kept before the scheduler purges it (0: at once); -1 with retentionDaysOther -1: no retention policy, history kept.')
@minValue(-1)
param retentionDaysCompleted int = -1
@description('Days the history of orchestrations that ended otherwise (Failed, Terminated, Canceled) is kept; -1: no policy for them.')
@minValue(-1)
param retentionDaysOther int = -1

resource scheduler 'Microsoft.DurableTask/schedulers@2025-11-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    ipAllowlist: ipAllowlist
    sku: (skuName == 'Dedicated') ? {
      name: skuName
      capacity: skuCapacity
    } : {
      name: skuName
    }
  }
}

resource taskHub 'Microsoft.DurableTask/schedulers/taskHubs@2025-11-01' = {
  parent: scheduler
  name: taskHubName
}

// The scheduler purges finished orchestrations itself (its "autopurge"):
// one policy for Completed, one default for every other terminal state.
// Running orchestrations are never purged.
var retentionPolicies = concat(
  (retentionDaysOther >= 0) ? [
    {
      retentionPeriodInDays: retentionDaysOther
    }
  ] : [],
  (retentionDaysCompleted >= 0) ? [
    {
      orchestrationState: 'Completed'
      retentionPeriodInDays: retentionDaysCompleted
    }
  ] : []
)

resource retention 'Microsoft.DurableTask/schedulers/retentionPolicies@2025-11-01' = if (!empty(retentionPolicies)) {
  parent: scheduler
  name: 'default'
  properties: {
    retentionPolicies: retentionPolicies
  }
}

output id string = scheduler.id
output name string = scheduler.name
output endpoint string = scheduler.properties.endpoint
output taskHubName string = taskHub.name
