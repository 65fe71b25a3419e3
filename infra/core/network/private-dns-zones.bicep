metadata description = 'The private DNS zones of the private endpoints, each linked to the virtual network so the function app resolves its services to their private addresses.'

param vnetId string
param tags object = {}
@description('Zone names, e.g. privatelink.blob.core.windows.net.')
param zoneNames string[]

resource zones 'Microsoft.Network/privateDnsZones@2020-06-01' = [for zone in zoneNames: {
  name: zone
  location: 'global'
  tags: tags
}]

resource links 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2020-06-01' = [for (zone, i) in zoneNames: {
  parent: zones[i]
  name: 'vnet-link'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: vnetId
    }
  }
}]

output ids string[] = [for (zone, i) in zoneNames: zones[i].id]
