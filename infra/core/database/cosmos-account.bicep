metadata description = 'A Cosmos DB for NoSQL account with key-based auth disabled: data-plane access is by Microsoft Entra ID and SQL role assignments only.'

param name string
param location string = resourceGroup().location
param tags object = {}
@allowed(['Serverless', 'Provisioned'])
param capacityMode string = 'Serverless'
@allowed(['Session', 'BoundedStaleness', 'Strong', 'ConsistentPrefix', 'Eventual'])
param consistencyLevel string = 'Session'

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
    disableLocalAuth: true
    disableKeyBasedMetadataWriteAccess: true
    minimalTlsVersion: 'Tls12'
    publicNetworkAccess: 'Enabled'
  }
}

output id string = account.id
output name string = account.name
output endpoint string = account.properties.documentEndpoint
