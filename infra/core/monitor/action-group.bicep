metadata description = 'An action group that e-mails operators.'

param name string
@maxLength(12)
param shortName string
param tags object = {}
param emailAddresses string[] = []

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: name
  location: 'global'
  tags: tags
  properties: {
    groupShortName: shortName
    enabled: true
    emailReceivers: [for (address, i) in emailAddresses: {
      name: 'operator-${i}'
      emailAddress: address
      useCommonAlertSchema: true
    }]
  }
}

output id string = actionGroup.id
