metadata description = 'The virtual network of vnetEnabled, as the official Flex Consumption templates lay it out: a subnet for the private endpoints and one delegated to Microsoft.App/environments for the function app\'s virtual network integration.'

param name string
param location string
param tags object = {}
param addressPrefix string = '10.0.0.0/16'
param privateEndpointSubnetPrefix string = '10.0.1.0/24'
param appSubnetPrefix string = '10.0.2.0/24'

var privateEndpointSubnetName = 'private-endpoints'
var appSubnetName = 'app'

resource vnet 'Microsoft.Network/virtualNetworks@2024-05-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: [
      {
        name: privateEndpointSubnetName
        properties: {
          addressPrefix: privateEndpointSubnetPrefix
          privateEndpointNetworkPolicies: 'Disabled'
          privateLinkServiceNetworkPolicies: 'Enabled'
        }
      }
      {
        name: appSubnetName
        properties: {
          addressPrefix: appSubnetPrefix
          privateEndpointNetworkPolicies: 'Disabled'
          privateLinkServiceNetworkPolicies: 'Enabled'
          // Flex Consumption integrates through a subnet delegated to Microsoft.App/environments.
          delegations: [
            {
              name: 'flex-consumption'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
        }
      }
    ]
  }
}

output id string = vnet.id
output privateEndpointSubnetId string = '${vnet.id}/subnets/${privateEndpointSubnetName}'
output appSubnetId string = '${vnet.id}/subnets/${appSubnetName}'
