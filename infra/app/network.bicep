metadata description = 'vnetEnabled: the virtual network, the function app\'s integration subnet, and private endpoints (with their private DNS zones) for the host storage (blob, queue, table), the Service Bus namespace (Premium only: Standard has no private endpoints) and each Cosmos DB account, as the official Flex Consumption templates do. The Durable Task Scheduler stays on its IP allowlist: the API version deployed here (2025-11-01) has no private endpoint connection.'

param vnetName string
param location string
param tags object = {}
param storageAccountName string
param serviceBusNamespaceName string
@description('Premium namespaces only take private endpoints.')
param serviceBusPremium bool
@description('The Cosmos DB accounts (state, and orders when separate); one endpoint each.')
param cosmosAccountNames string[]

var storageSuffix = environment().suffixes.storage
var zones = {
  blob: 'privatelink.blob.${storageSuffix}'
  queue: 'privatelink.queue.${storageSuffix}'
  table: 'privatelink.table.${storageSuffix}'
  namespace: 'privatelink.servicebus.windows.net'
  Sql: 'privatelink.documents.azure.com'
}
var zoneNames = [
  zones.blob
  zones.queue
  zones.table
  zones.namespace
  zones.Sql
]
var cosmosAccounts = union(cosmosAccountNames, [])

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

module vnet '../core/network/vnet.bicep' = {
  name: 'vnet'
  params: {
    name: vnetName
    location: location
    tags: tags
  }
}

module dnsZones '../core/network/private-dns-zones.bicep' = {
  name: 'private-dns-zones'
  params: {
    vnetId: vnet.outputs.id
    tags: tags
    zoneNames: zoneNames
  }
}

module storageEndpoints '../core/network/private-endpoint.bicep' = [for (groupId, i) in ['blob', 'queue', 'table']: {
  name: 'pe-storage-${groupId}'
  params: {
    name: 'pe-${storageAccountName}-${groupId}'
    location: location
    tags: tags
    subnetId: vnet.outputs.privateEndpointSubnetId
    serviceId: storage.id
    groupId: groupId
    privateDnsZoneId: dnsZones.outputs.ids[i]
  }
}]

module serviceBusEndpoint '../core/network/private-endpoint.bicep' = if (serviceBusPremium) {
  name: 'pe-servicebus'
  params: {
    name: 'pe-${serviceBusNamespaceName}'
    location: location
    tags: tags
    subnetId: vnet.outputs.privateEndpointSubnetId
    serviceId: namespace.id
    groupId: 'namespace'
    privateDnsZoneId: dnsZones.outputs.ids[3]
  }
}

module cosmosEndpoints '../core/network/private-endpoint.bicep' = [for account in cosmosAccounts: {
  name: take('pe-cosmos-${account}', 64)
  params: {
    name: 'pe-${account}'
    location: location
    tags: tags
    subnetId: vnet.outputs.privateEndpointSubnetId
    serviceId: resourceId('Microsoft.DocumentDB/databaseAccounts', account)
    groupId: 'Sql'
    privateDnsZoneId: dnsZones.outputs.ids[4]
  }
}]

output appSubnetId string = vnet.outputs.appSubnetId
output vnetId string = vnet.outputs.id
