metadata description = 'Assigns a built-in Key Vault data role to a principal on one vault (Key Vault Secrets User lets the app resolve its Key Vault references; Secrets Officer lets the deployer create the keys).'

param vaultName string
@description('Built-in role definition GUID.')
param roleDefinitionId string
param principalId string
@allowed(['ServicePrincipal', 'Group', 'User'])
param principalType string = 'ServicePrincipal'

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' existing = {
  name: vaultName
}

resource assignment 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: vault
  name: guid(vault.id, principalId, roleDefinitionId)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionId)
    principalId: principalId
    principalType: principalType
  }
}
