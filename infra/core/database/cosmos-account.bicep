metadata description = 'A Cosmos DB for NoSQL account with key-based auth disabled: data-plane access is by Microsoft Entra ID and SQL role assignments only.'

param name string
param location string = resourceGroup().location
param tags object = {}
@allowed(['Serverless', 'Provisioned'])
param capacityMode string = 'Serverless'
@allowed(['Session', 'BoundedStaleness', 'Strong', 'ConsistentPrefix', 'Eventual'])
param consistencyLevel string = 'Session'
@description('Point-in-time restore window: continuous backup keeps every change for 7 or 30 days.')
@allowed(['Continuous7Days', 'Continuous30Days'])
param continuousBackupTier string = 'Continuous7Days'
@description('Log Analytics workspace that receives the account\'s logs and request metrics; empty sends none.')
param logAnalyticsWorkspaceId string = ''
@description('Send the resource logs (one row per data-plane request) as well as the request metrics; false sends metrics only.')
param resourceLogs bool = true

resource account 'Microsoft.DocumentDB/databaseAccounts@2024-11-15' = {
  name: name
  location: location
  tags: tags
  kind: 'GlobalDocumentDB'
  properties: {
    databaseAccountOfferType: 'Standard'
    consistencyPolicy: {
      defaultConsistencyLevel: consistencyLevel
    }
    locations: [
      {
        locationName: location
        failoverPriority: 0
        isZoneRedundant: false
      }
    ]
    capabilities: (capacityMode == 'Serverless') ? [
      {
        name: 'EnableServerless'
      }
    ] : []
    // A bad write (or a bad deploy of the app) can be undone to the second.
    backupPolicy: {
      type: 'Continuous'
      continuousModeProperties: {
        tier: continuousBackupTier
      }
    }
    disableLocalAuth: true
    disableKeyBasedMetadataWriteAccess: true
    minimalTlsVersion: 'Tls12'
    publicNetworkAccess: 'Enabled'
  }
}

resource diagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = if (!empty(logAnalyticsWorkspaceId)) {
  name: 'to-log-analytics'
  scope: account
  properties: {
    workspaceId: logAnalyticsWorkspaceId
    // Resource-specific tables (CDBDataPlaneRequests, ...), not AzureDiagnostics.
    logAnalyticsDestinationType: 'Dedicated'
    logs: resourceLogs ? [
      {
        categoryGroup: 'allLogs'
        enabled: true
      }
    ] : []
    metrics: [
      {
        category: 'Requests'
        enabled: true
      }
    ]
  }
}

output id string = account.id
output name string = account.name
output endpoint string = account.properties.documentEndpoint
