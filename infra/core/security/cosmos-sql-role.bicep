metadata description = 'Assigns a Cosmos DB SQL (data-plane) role to a principal on one database of an account. Cosmos data-plane RBAC is separate from Azure RBAC: it uses sqlRoleAssignments, not Microsoft.Authorization/roleAssignments.'

param accountName string
@description('The database the assignment is scoped to; the principal gets nothing outside it.')
param databaseName string
@description('Built-in Cosmos DB SQL role definition id (00000000-0000-0000-0000-000000000002 = Cosmos DB Built-in Data Contributor).')
param sqlRoleDefinitionId string
param principalId string

resource account 'Microsoft.DocumentDB/databaseAccounts@2024-11-15' existing = {
  name: accountName
}

resource assignment 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-11-15' = {
  parent: account
  name: guid(account.id, databaseName, principalId, sqlRoleDefinitionId)
  properties: {
    roleDefinitionId: '${account.id}/sqlRoleDefinitions/${sqlRoleDefinitionId}'
    principalId: principalId
    scope: '${account.id}/dbs/${databaseName}'
  }
}
