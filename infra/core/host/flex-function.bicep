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

@description('App settings. Flex Consumption rejects FUNCTIONS_WORKER_RUNTIME and FUNCTIONS_EXTENSION_VERSION: the runtime is set in functionAppConfig instead. Secure because one of them (CONSOLE_CSRF_SECRET) is a secret: a secure object is kept out of the deployment history.')
@secure()
param appSettings object

// App Service authentication (Easy Auth) in front of the console.
@description('Client (application) id of the Entra ID app registration operators sign in to the console with (azd: CONSOLE_AUTH_CLIENT_ID). Empty: no identity provider, so every request outside authExcludedPaths is answered 401.')
param authClientId string = ''
@description('Object ids of the users or service principals allowed to sign in (the operators); empty: whoever the app registration admits.')
param authAllowedIdentities string[] = []
@description('Object ids of the groups allowed to sign in (operators given as a group).')
param authAllowedGroups string[] = []
@description('Paths that keep the host\'s own key-based authorization instead of Entra sign-in: every HTTP endpoint that is not the console.')
param authExcludedPaths string[]
@description('vnetEnabled: the subnet (delegated to Microsoft.App/environments) the app integrates with; empty: no virtual network integration.')
param virtualNetworkSubnetId string = ''

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
    // Key Vault references in the app settings (AGENT_SIGNING_KEYS,
    // REPLY_TOKEN_KEYS) are resolved as this identity, the app's only one.
    keyVaultReferenceIdentity: identityId
    virtualNetworkSubnetId: empty(virtualNetworkSubnetId) ? null : virtualNetworkSubnetId
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

// Authentication is required for every path but the excluded ones (the
// durable webhooks and the admin API keep their system and master keys), so
// the console's routes, and any HTTP function added later, need a signed-in
// operator. The platform then removes a client-sent x-ms-client-principal-*
// header and sets its own, which console.security takes as the operator.
// Service Bus and timer triggers are not HTTP requests and are not affected.
// No client secret: the login flow asks Entra ID for an ID token only (the
// registration must allow ID tokens), so no secret is stored anywhere.
resource authSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  parent: site
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: true
      unauthenticatedClientAction: empty(authClientId) ? 'Return401' : 'RedirectToLoginPage'
      redirectToProvider: 'azureactivedirectory'
      excludedPaths: authExcludedPaths
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: !empty(authClientId)
        registration: {
          clientId: authClientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0'
        }
        validation: {
          defaultAuthorizationPolicy: {
            allowedPrincipals: {
              identities: authAllowedIdentities
              groups: authAllowedGroups
            }
          }
        }
      }
    }
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
