metadata description = 'Shards of the production profile: shardCount whole deployments of main.bicep, each in its own resource group with its own function app and task hub, Cosmos account and Service Bus namespace, and its SHARD_INDEX of SHARD_COUNT (docs/adr/020e-task-hub-shards.md). The count is the one the capacity model states (python -m bench.capacity --rate R --profile production).'

// Subscription scope: az deployment sub create --location <region>
//   --template-file infra/shards.bicep --parameters @infra/shards.production.parameters.json
//   --parameters environmentName=... remoteServiceUrl=... clientApplications=@clients.json
// then: python -m deploy.keys --shards   (each shard's keys in its own vault)
targetScope = 'subscription'

import { clientApplication } from 'types.bicep'

@minLength(1)
@maxLength(58)
@description('Environment name; shard i is environment <name>-s<i> in resource group rg-<name>-s<i>.')
param environmentName string

@description('Region of every shard (one Flex memory quota for all of them: docs/capacity.md).')
param location string = deployment().location

@description('SHARD_COUNT: how many shards. Changing it moves most orders to another shard: drain first (docs/adr/020e-task-hub-shards.md).')
@minValue(1)
@maxValue(800)
param shardCount int

@description('As main.bicep: the remote services every shard calls.')
@minLength(12)
param remoteServiceUrl string

@description('As main.bicep: the client applications, registered in every shard (each sends an order to the shard domain.shards.shard_of names).')
@minLength(1)
param clientApplications clientApplication[]

@description('As main.bicep: the identity that gets the operator grants in every shard.')
param principalId string = ''

// The production profile, read from its one file: every shard is that profile.
var production = loadJsonContent('main.production.parameters.json', '$.parameters')

resource shardGroups 'Microsoft.Resources/resourceGroups@2024-03-01' = [for i in range(0, shardCount): {
  name: 'rg-${environmentName}-s${i}'
  location: location
  tags: {
    'azd-env-name': environmentName
    shard: '${i} of ${shardCount}'
  }
}]

module shards 'main.bicep' = [for i in range(0, shardCount): {
  name: 'shard-${i}'
  scope: shardGroups[i]
  params: {
    environmentName: '${environmentName}-s${i}'
    location: location
    shardCount: shardCount
    shardIndex: i
    taskHubName: 'OrderProcessingS${i}'
    remoteServiceUrl: remoteServiceUrl
    clientApplications: clientApplications
    principalId: principalId
    cosmosCapacityMode: production.cosmosCapacityMode.value
    cosmosAutoscaleMaxThroughput: production.cosmosAutoscaleMaxThroughput.value
    ordersCosmosAutoscaleMaxThroughput: production.ordersCosmosAutoscaleMaxThroughput.value
    ordersTtlSeconds: production.ordersTtlSeconds.value
    serviceBusSku: production.serviceBusSku.value
    serviceBusPremiumMessagingUnits: production.serviceBusPremiumMessagingUnits.value
    durableBackend: production.durableBackend.value
    durableTaskSchedulerSku: production.durableTaskSchedulerSku.value
    durableTaskSchedulerCapacity: production.durableTaskSchedulerCapacity.value
    durableRetentionDaysCompleted: production.durableRetentionDaysCompleted.value
    durableRetentionDaysOther: production.durableRetentionDaysOther.value
    maximumInstanceCount: production.maximumInstanceCount.value
    maxProcessing: production.maxProcessing.value
    supervisorScan: production.supervisorScan.value
    hostLogLevel: production.hostLogLevel.value
    traceSamplingRatio: production.traceSamplingRatio.value
    resourceLogs: production.resourceLogs.value
    vnetEnabled: production.vnetEnabled.value
    starterCountIntervalSeconds: production.starterCountIntervalSeconds.value
  }
}]

output shardResourceGroups string[] = [for i in range(0, shardCount): shardGroups[i].name]
// Every shard keeps its internal-queue keys in a vault of its own (main.bicep's default), so a
// message copied from one shard's queues to another's does not verify there (ADR 017e).
// `python -m deploy.keys --shards` reads this output and creates each shard's keys.
output SHARD_VAULTS array = [for i in range(0, shardCount): {
  INTERNAL_VAULT_NAME: shards[i].outputs.INTERNAL_VAULT_NAME
  INTERNAL_VAULT_ENTRIES: shards[i].outputs.INTERNAL_VAULT_ENTRIES
  AZURE_FUNCTION_APP_NAME: shards[i].outputs.AZURE_FUNCTION_APP_NAME
  AZURE_RESOURCE_GROUP: shards[i].outputs.AZURE_RESOURCE_GROUP
}]
