metadata description = 'One private endpoint to one sub-resource (groupId) of a service, registered in the private DNS zone that resolves the service\'s name to it inside the virtual network (private-dns-zones.bicep creates the zones and links them).'

param name string
param location string
param tags object = {}
param subnetId string
@description('Resource id of the service (storage account, Service Bus namespace, Cosmos DB account).')
param serviceId string
@description('Its sub-resource: blob, queue, table, namespace, Sql.')
param groupId string
@description('Resource id of the private DNS zone for that sub-resource.')
param privateDnsZoneId string

resource endpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    subnet: {
      id: subnetId
    }
    privateLinkServiceConnections: [
      {
        name: name
        properties: {
          privateLinkServiceId: serviceId
          groupIds: [
            groupId
          ]
        }
      }
    ]
  }

  resource zoneGroup 'privateDnsZoneGroups' = {
    name: 'default'
    properties: {
      privateDnsZoneConfigs: [
        {
          name: replace(groupId, '.', '-')
          properties: {
            privateDnsZoneId: privateDnsZoneId
          }
        }
      ]
    }
  }
}

output id string = endpoint.id
