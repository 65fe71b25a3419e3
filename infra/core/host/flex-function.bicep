metadata description = 'A function app on a Flex Consumption plan running as a user-assigned identity. The deployment package container is read with that identity, so no storage key is involved; basic (SCM and FTP) publishing credentials are off.'

param name string
param location string = resourceGroup().location
param tags object = {}

param planId string
@description('Storage account that holds the deployment package container (the host storage account).')
param storageAccountName string
param deploymentContainerName string

@description('Resource id of the user-assigned identity the app runs as (created before the app, see core/identity).')
param identityId string

@allowed(['python'])
param runtimeName string
@allowed(['3.10', '3.11', '3.12'])
param runtimeVersion string

@allowed([512, 2048, 4096])
param instanceMemoryMB int = 2048
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40
@description('Always-ready instances per function group or function ({ name, instanceCount }), e.g. the durable group.')
param alwaysReady array = []

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
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
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
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        instanceMemoryMB: instanceMemoryMB
        maximumInstanceCount: maximumInstanceCount
        alwaysReady: alwaysReady
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

// azd and `func azure functionapp publish` deploy with Entra ID (the
// deployer's token), so the user-name/password publishing endpoints stay off.
resource ftpPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'scm'
  properties: {
    allow: false
  }
}

output id string = site.id
output name string = site.name
output defaultHostName string = site.properties.defaultHostName
