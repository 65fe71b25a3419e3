metadata description = 'Log Analytics workspace and a workspace-based Application Insights component that accepts Microsoft Entra-authenticated telemetry only.'

param logAnalyticsName string
param applicationInsightsName string
param location string = resourceGroup().location
param tags object = {}
@minValue(30)
@maxValue(730)
param retentionInDays int = 30

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: applicationInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    IngestionMode: 'LogAnalytics'
    // Telemetry must carry a Microsoft Entra token (APPLICATIONINSIGHTS_AUTHENTICATION_STRING);
    // the instrumentation key in the connection string alone is refused.
    DisableLocalAuth: true
  }
}

output logAnalyticsWorkspaceId string = workspace.id
output applicationInsightsId string = appInsights.id
output applicationInsightsName string = appInsights.name
