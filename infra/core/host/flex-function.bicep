metadata description = 'A function app on a Flex Consumption plan with a system-assigned identity. The deployment package container is read with that identity, so no storage key is involved.'

param name string
param location string = resourceGroup().location
param tags object = {}

param planId string
@description('Storage account that holds the deployment package container (the host storage account).')
param storageAccountName string
param deploymentContainerName string

@allowed(['python'])
param runtimeName string
@allowed(['3.10', '3.11', '3.12'])
param runtimeVersion string

@allowed([512, 2048, 4096])
param instanceMemoryMB int = 2048
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('App settings. Flex Consumption rejects FUNCTIONS_WORKER_RUNTIME and FUNCTIONS_EXTENSION_VERSION: the runtime is set in functionAppConfig instead.')
param appSettings object

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource site 'Microsoft.Web/sites@2024-04-01' = {
  name: name
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    serverFarmId: planId
    httpsOnly: true
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'SystemAssignedIdentity'
          }
        }
      }
      scaleAndConcurrency: {
        instanceMemoryMB: instanceMemoryMB
        maximumInstanceCount: maximumInstanceCount
      }
      runtime: {
        name: runtimeName
        version: runtimeVersion
      }
    }
  }

  resource settings 'config' = {
    name: 'appsettings'
    properties: appSettings
  }
}

output id string = site.id
output name string = site.name
output defaultHostName string = site.properties.defaultHostName
output principalId string = site.identity.principalId
