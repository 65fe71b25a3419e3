metadata description = 'The user-assigned managed identity the function app runs as. It exists before the app and before its role assignments, so the grants are in place when Flex Consumption first reads the deployment package with it (a system-assigned identity exists only once the site does, and the first deploy then races its own role assignments).'

param name string
param location string = resourceGroup().location
param tags object = {}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

output id string = identity.id
output name string = identity.name
output principalId string = identity.properties.principalId
output clientId string = identity.properties.clientId
