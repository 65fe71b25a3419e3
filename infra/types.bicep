metadata description = 'Types shared by main.bicep and its modules.'

@export()
@description('A client application that submits orders and reads status updates from its own reply queue.')
type clientApplication = {
  appId: string
  replyQueueName: string
  principalId: string
  // Whether it also receives progress statuses (Processing, StepCompleted), best effort;
  // absent: the final statuses only (docs/client-guide.md).
  progress: bool?
}

@export()
@description('An operator: object id and principal type (User, Group or ServicePrincipal; empty lets ARM look it up).')
type operatorPrincipal = {
  principalId: string
  principalType: string
}
