metadata description = 'A Cosmos DB for NoSQL database and its containers. With a provisioned account the database gets shared autoscale throughput; a serverless account takes none.'

param accountName string
param databaseName string
@description('0 for a serverless account; otherwise the autoscale maximum RU/s shared by the database.')
param autoscaleMaxThroughput int = 0

@description('Containers: { name, partitionKeyPath, defaultTtl (int, -1 = TTL on with no default expiry, null = off), indexingPolicy (object or null) }.')
param containers array

resource account 'Microsoft.DocumentDB/databaseAccounts@2024-11-15' existing = {
  name: accountName
}

resource database 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2024-11-15' = {
  parent: account
  name: databaseName
  properties: {
    resource: {
      id: databaseName
    }
    options: (autoscaleMaxThroughput > 0) ? {
      autoscaleSettings: {
        maxThroughput: autoscaleMaxThroughput
      }
    } : {}
  }
}

resource containerResources 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-11-15' = [for container in containers: {
  parent: database
  name: container.name
  properties: {
    resource: union({
      id: container.name
      partitionKey: {
        paths: [
          container.partitionKeyPath
        ]
        kind: 'Hash'
        version: 2
      }
    }, (container.defaultTtl == null) ? {} : {
      defaultTtl: container.defaultTtl
    }, (container.indexingPolicy == null) ? {} : {
      indexingPolicy: container.indexingPolicy
    })
  }
}]

output name string = database.name
output id string = database.id
