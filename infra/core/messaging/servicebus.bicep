metadata description = 'A Service Bus namespace with local (SAS) authentication disabled, and its queues.'

param name string
param location string = resourceGroup().location
param tags object = {}
@description('Standard or Premium: Basic has no duplicate detection, which the agent queues need.')
@allowed(['Standard', 'Premium'])
param skuName string = 'Standard'
@description('Messaging units, Premium only.')
@allowed([1, 2, 4, 8, 16])
param premiumCapacity int = 1

@description('Log Analytics workspace that receives the namespace\'s logs and metrics; empty sends none.')
param logAnalyticsWorkspaceId string = ''
@description('Send the resource logs (operational and runtime audit: one row per operation on Premium) as well as the metrics; false sends metrics only.')
param resourceLogs bool = true

@description('Queues: { name: string, properties: object } with properties in the Microsoft.ServiceBus/namespaces/queues shape.')
param queues array

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: skuName
    tier: skuName
    capacity: (skuName == 'Premium') ? premiumCapacity : null
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

resource queueResources 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [for queue in queues: {
  parent: namespace
  name: queue.name
  properties: queue.properties
}]

resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(logAnalyticsWorkspaceId)) {
  name: 'to-log-analytics'
  scope: namespace
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    logs: resourceLogs ? [
      {
        // Operational logs and runtime audit logs (who sent or received with which identity).
        categoryGroup: 'allLogs'
        enabled: true
      }
    ] : []
    metrics: [
      {
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

output id string = namespace.id
output name string = namespace.name
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
output queueNames string[] = [for (queue, i) in queues: queueResources[i].name]
