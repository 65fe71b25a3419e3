metadata description = 'The function host storage account (AzureWebJobsStorage, the Durable task hub, the Flex deployment package). Shared-key access is off: every client uses Microsoft Entra ID.'

param name string
param location string = resourceGroup().location
param tags object = {}
@allowed(['Standard_LRS', 'Standard_ZRS', 'Standard_GRS', 'Standard_RAGRS'])
param skuName string = 'Standard_LRS'
@description('Blob containers to create (the Flex deployment package container).')
param containerNames string[] = []
@description('Disabled with vnetEnabled: only the app (through its private endpoints) and Azure\'s trusted services (the Flex deployment) reach it.')
@allowed(['Enabled', 'Disabled'])
param publicNetworkAccess string = 'Enabled'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: publicNetworkAccess
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: publicNetworkAccess == 'Enabled' ? 'Allow' : 'Deny'
    }
  }

  resource blobs 'blobServices' = {
    name: 'default'

    resource containers 'containers' = [for containerName in containerNames: {
      name: containerName
      properties: {
        publicAccess: 'None'
      }
    }]
  }
}

output id string = storage.id
output name string = storage.name
output blobEndpoint string = storage.properties.primaryEndpoints.blob
output queueEndpoint string = storage.properties.primaryEndpoints.queue
output tableEndpoint string = storage.properties.primaryEndpoints.table
