metadata description = 'Assigns a built-in Durable Task role to a principal on one scheduler (Durable Task Data Contributor lets the app run orchestrations in its task hubs; Durable Task Data Reader lets an operator read them in the scheduler\'s dashboard).'

param schedulerName string
@description('Built-in role definition GUID.')
param roleDefinitionId string
param principalId string
@description('ServicePrincipal, Group or User; empty leaves it out and ARM looks the principal up.')
@allowed(['ServicePrincipal', 'Group', 'User', ''])
param principalType string = 'ServicePrincipal'

resource scheduler 'Microsoft.DurableTask/schedulers@2025-11-01' existing = {
  name: schedulerName
}

resource assignment 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: scheduler
  name: guid(scheduler.id, principalId, roleDefinitionId)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionId)
    principalId: principalId
    principalType: empty(principalType) ? null : principalType
  }
}
