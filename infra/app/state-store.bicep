metadata description = 'The Cosmos DB state store (orderState, recoveryIndex) and the orders database, in one account by default or with the orders database in an account of its own.'

param accountName string
@description('Used only when ordersInSeparateAccount is true.')
param ordersAccountName string
param ordersInSeparateAccount bool = false
param location string = resourceGroup().location
param tags object = {}
@description('Log Analytics workspace for the accounts\' diagnostic logs.')
param logAnalyticsWorkspaceId string
@allowed(['Serverless', 'Provisioned'])
param capacityMode string = 'Serverless'
@description('Provisioned mode only: autoscale maximum RU/s shared by each database.')
@minValue(1000)
param autoscaleMaxThroughput int = 1000
@description('Provisioned mode only: autoscale maximum RU/s of the orders database.')
@minValue(1000)
param ordersAutoscaleMaxThroughput int = autoscaleMaxThroughput
@description('defaultTtl of the orders container in seconds; 0: TTL off (documents kept).')
@minValue(0)
param ordersTtlSeconds int = 0
@description('Send the accounts\' resource logs to Log Analytics; false keeps their request metrics only.')
param resourceLogs bool = true

param stateDatabaseName string
param stateContainerName string
param recoveryIndexContainerName string
param ordersDatabaseName string
param ordersContainerName string

var throughput = (capacityMode == 'Provisioned') ? autoscaleMaxThroughput : 0
var ordersThroughput = (capacityMode == 'Provisioned') ? ordersAutoscaleMaxThroughput : 0

// orderState: one record per order, partition key /id (the order key).
// The Supervisor's scan filters ProcessState = 'Processing' and orders by
// CompleteBy, so it needs the composite index; the policy is the one the app
// applies to the local emulator (adapters/cosmos_client.py). TTL is on with no default
// expiry (-1): finished records set their own `ttl`; live ones never expire.
var stateContainers = [
  {
    name: stateContainerName
    partitionKeyPath: '/id'
    defaultTtl: -1
    indexingPolicy: {
      indexingMode: 'consistent'
      automatic: true
      // Only what a query filters or sorts on (the list in adapters/cosmos_client.py,
      // STATE_QUERIED_PATHS): each indexed value of a write costs RU.
      includedPaths: [
        {
          path: '/ProcessState/?'
        }
        {
          path: '/LockedBy/?'
        }
        {
          path: '/NotBefore/?'
        }
        {
          path: '/CompleteBy/?'
        }
        {
          path: '/PendingStatus/*'
        }
        {
          path: '/ReplyTo/?'
        }
        {
          path: '/CompensationRequested/?'
        }
        {
          path: '/AppId/?'
        }
        {
          path: '/CreatedAt/?'
        }
        {
          path: '/UpdatedAt/?'
        }
        {
          path: '/FailureCount/?'
        }
        {
          path: '/Attempt/?'
        }
      ]
      excludedPaths: [
        {
          path: '/*'
        }
      ]
      compositeIndexes: [
        [
          {
            path: '/ProcessState'
            order: 'ascending'
          }
          {
            path: '/CompleteBy'
            order: 'ascending'
          }
        ]
        [
          // Keyset paging: ORDER BY CompleteBy, id.
          {
            path: '/ProcessState'
            order: 'ascending'
          }
          {
            path: '/CompleteBy'
            order: 'ascending'
          }
          {
            path: '/id'
            order: 'ascending'
          }
        ]
      ]
    }
  }
  {
    // Deadline-bucket recovery index: one logical partition per deadline
    // bucket, so the Supervisor reads one partition instead of fanning out.
    // Entries expire on their own `ttl` once their record is finished.
    name: recoveryIndexContainerName
    partitionKeyPath: '/bucket'
    defaultTtl: -1
    // Read by MIN(bucket) and by bucket and id: only bucket is indexed (id always is).
    indexingPolicy: {
      indexingMode: 'consistent'
      automatic: true
      includedPaths: [
        {
          path: '/bucket/?'
        }
      ]
      excludedPaths: [
        {
          path: '/*'
        }
      ]
    }
  }
]

var ordersContainers = [
  {
    name: ordersContainerName
    partitionKeyPath: '/id'
    // Off by default; the production profile expires an order's document
    // well after its state record (main.bicep, ordersTtlSeconds).
    defaultTtl: (ordersTtlSeconds > 0) ? ordersTtlSeconds : null
    // Read and written by id only: no index (adapters/cosmos_client.py, ORDERS_INDEXING_POLICY).
    indexingPolicy: {
      indexingMode: 'none'
      automatic: false
    }
  }
]

module account '../core/database/cosmos-account.bicep' = {
  name: 'cosmos-account'
  params: {
    name: accountName
    location: location
    tags: tags
    capacityMode: capacityMode
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    resourceLogs: resourceLogs
  }
}

module ordersAccount '../core/database/cosmos-account.bicep' = if (ordersInSeparateAccount) {
  name: 'cosmos-orders-account'
  params: {
    name: ordersAccountName
    location: location
    tags: tags
    capacityMode: capacityMode
    logAnalyticsWorkspaceId: logAnalyticsWorkspaceId
    resourceLogs: resourceLogs
  }
}

module stateDatabase '../core/database/cosmos-sql-database.bicep' = {
  name: 'cosmos-state-database'
  params: {
    accountName: account.outputs.name
    databaseName: stateDatabaseName
    autoscaleMaxThroughput: throughput
    containers: stateContainers
  }
}

module ordersDatabase '../core/database/cosmos-sql-database.bicep' = {
  name: 'cosmos-orders-database'
  params: {
    accountName: ordersInSeparateAccount ? ordersAccount!.outputs.name : account.outputs.name
    databaseName: ordersDatabaseName
    autoscaleMaxThroughput: ordersThroughput
    containers: ordersContainers
  }
}

output accountName string = account.outputs.name
output endpoint string = account.outputs.endpoint
output ordersAccountName string = ordersInSeparateAccount ? ordersAccount!.outputs.name : account.outputs.name
output ordersEndpoint string = ordersInSeparateAccount ? ordersAccount!.outputs.endpoint : account.outputs.endpoint
