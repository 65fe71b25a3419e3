metadata description = 'A Key Vault of the deployment\'s own for the internal-queue keys (AGENT_SIGNING_KEYS, REPLY_TOKEN_KEYS): Azure RBAC authorization only (no access policies), soft delete on; the secrets are created after provision by deploy/keys.py, never by the template.'

param name string
param location string
param tags object = {}
@description('Days a deleted vault or secret can be recovered (7-90; fixed when the vault is created).')
@minValue(7)
@maxValue(90)
param softDeleteRetentionInDays int = 7
@description('Purge protection: a deleted vault cannot be purged before its retention ends (it cannot be turned off again).')
param enablePurgeProtection bool = false

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    tenantId: tenant().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: softDeleteRetentionInDays
    // Only true may be sent: the service refuses false once it was true.
    enablePurgeProtection: enablePurgeProtection ? true : null
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

output name string = vault.name
output id string = vault.id
output uri string = vault.properties.vaultUri
