metadata description = 'Assigns a built-in Service Bus data role to a principal on one queue (not the namespace), so the principal reaches that queue and nothing else.'

param namespaceName string
param queueName string
@description('Built-in role definition GUID (Azure Service Bus Data Sender or Data Receiver).')
param roleDefinitionId string
param principalId string
@description('User, Group or ServicePrincipal, as the principal is (a mismatch fails with UnmatchedPrincipalType); empty leaves it out and ARM looks the principal up.')
@allowed(['ServicePrincipal', 'Group', 'User', ''])
param principalType string = 'ServicePrincipal'

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: namespaceName
}

resource queue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = {
  parent: namespace
  name: queueName
}

resource assignment 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: queue
  name: guid(queue.id, principalId, roleDefinitionId)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionId)
    principalId: principalId
    principalType: empty(principalType) ? null : principalType
  }
}
