metadata description = 'Assigns a built-in role to a principal on one Application Insights component (Monitoring Metrics Publisher lets it send Entra-authenticated telemetry).'

param applicationInsightsName string
@description('Built-in role definition GUID.')
param roleDefinitionId string
param principalId string
@allowed(['ServicePrincipal', 'Group', 'User'])
param principalType string = 'ServicePrincipal'

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource assignment 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: appInsights
  name: guid(appInsights.id, principalId, roleDefinitionId)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionId)
    principalId: principalId
    principalType: principalType
  }
}
