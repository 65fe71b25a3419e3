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

output id string = scheduler.id
output name string = scheduler.name
output endpoint string = scheduler.properties.endpoint
output taskHubName string = taskHub.name
