metadata description = 'A Flex Consumption (FC1) plan for Linux function apps.'

param name string
param location string = resourceGroup().location
param tags object = {}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: name
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    // Linux: Flex Consumption only runs Linux workers.
    reserved: true
  }
}

output id string = plan.id
output name string = plan.name
