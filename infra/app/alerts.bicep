metadata description = 'Alert rules operators need: orders that ended in Error or CompensationFailed, dead-lettered messages, pending operator alerts, and a growing Pending backlog.'

param location string = resourceGroup().location
param tags object = {}
param applicationInsightsId string
param serviceBusNamespaceId string
param actionGroupId string
@description('Alert when the Pending backlog the app reports exceeds this (below PENDING_BACKLOG_LIMIT, where Submit starts rejecting).')
param pendingBacklogThreshold int
@description('Alert when more than this many messages wait in one ingress queue.')
param ordersQueueBacklogThreshold int = 1000
@description('The per-application ingress queues (orders-<appId>): the only queues clients send orders to.')
@minLength(1)
param ingressQueueNames string[]
param namePrefix string

// What the queries read (see infra/README.md, "What the alerts read"): the
// message text of the app's log records, which reaches Application Insights
// whether or not the worker forwards structured fields.
//   reporting/alerts.py:     "operator alert <Kind> for order <OrderID>: <reason>", or
//                            "operator alert <Kind> for message <MessageId>: <reason>" when no OrderID could be read
//   orchestrators/starter.py: "starter: pending=<n> processing=<n> ..."
// and the app's OpenTelemetry metrics (adapters/telemetry.py), in customMetrics:
//   orders.backlog (gauge, dimension state = Pending | Processing), per Starter run
var operatorAlerts = '''traces
| where message startswith "operator alert "
| parse message with "operator alert " AlertKind:string " for " Subject:string ": " *
| extend OrderID = iff(Subject startswith "order ", substring(Subject, 6), "")'''
// The backlog metric first; the Starter's log line too, so the rule still fires if
// metrics stop arriving (a worker without the distro) while the logs still do.
var pendingGauge = '''union
  (customMetrics
  | where name == "orders.backlog" and tostring(customDimensions["state"]) == "Pending"
  | project Pending = tolong(value)),
  (traces
  | where message startswith "starter: pending="
  | parse message with "starter: pending=" Pending:long " processing=" *
  | project Pending)'''

var logAlerts = [
  {
    name: 'order-error'
    displayName: 'Orders ended in Error'
    description: 'An order reached Error (a permanent agent failure, or the Supervisor gave up after the retry budget): an OrderError operator alert. List errored orders and resubmit or compensate.'
    severity: 1
    query: '${operatorAlerts}\n| where AlertKind == "OrderError"\n| summarize Orders = dcount(OrderID)'
    measure: 'Orders'
    threshold: 0
  }
  {
    name: 'order-compensation-failed'
    displayName: 'Order compensation failed'
    description: 'An order reached CompensationFailed: a completed step could not be undone and needs an operator.'
    severity: 0
    query: '${operatorAlerts}\n| where AlertKind == "CompensationFailed"\n| summarize Orders = dcount(OrderID)'
    measure: 'Orders'
    threshold: 0
  }
  {
    // A client posed as another: its body named another AppId than the
    // ingress queue it arrived on, or a reply queue that is not its own.
    name: 'client-impersonation'
    displayName: 'A client application sent an order in another application\'s name'
    description: 'Submit dead-lettered an order whose AppId or ReplyTo does not belong to the application whose ingress queue it came in on (AppIdMismatch, ReplyQueueNotAllowed). The sender is the application that owns that ingress queue: only its identity holds Sender there (app/rbac.bicep). Service Bus runtime audit logs, which would name the identity of each send, exist only on the Premium tier; on Standard the queue is the evidence.'
    severity: 1
    query: '${operatorAlerts}\n| where AlertKind in ("AppIdMismatch", "ReplyQueueNotAllowed")\n| summarize Orders = count()'
    measure: 'Orders'
    threshold: 0
  }
  {
    name: 'pending-backlog'
    displayName: 'Pending backlog is high'
    description: 'The Pending backlog the Starter measures is above the alert threshold; past PENDING_BACKLOG_LIMIT Submit answers Rejected.'
    severity: 2
    query: '${pendingGauge}\n| summarize PendingBacklog = max(Pending)'
    measure: 'PendingBacklog'
    threshold: pendingBacklogThreshold
  }
]

resource logAlertRules 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = [for alert in logAlerts: {
  name: '${namePrefix}-${alert.name}'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: alert.displayName
    description: alert.description
    severity: alert.severity
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    // The traces table exists only after the app's first log record.
    skipQueryValidation: true
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: alert.query
          timeAggregation: 'Maximum'
          metricMeasureColumn: alert.measure
          operator: 'GreaterThan'
          threshold: alert.threshold
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: [
        actionGroupId
      ]
    }
  }
}]

var queueAlerts = [
  {
    // One time series per queue (EntityName *): any dead-lettered message is
    // a malformed or conflicting order, or a poison agent message.
    name: 'dead-lettered-messages'
    description: 'Messages are sitting in a dead-letter queue. Inspect the reason and description on each message.'
    severity: 1
    metricName: 'DeadletteredMessages'
    entities: [
      '*'
    ]
    threshold: 0
  }
  {
    name: 'operator-alerts-pending'
    description: 'OperatorAlert messages wait on the alerts queue.'
    severity: 2
    metricName: 'ActiveMessages'
    entities: [
      'alerts'
    ]
    threshold: 0
  }
  {
    name: 'orders-queue-backlog'
    description: 'Orders are arriving faster than Submit accepts them (one time series per ingress queue).'
    severity: 2
    metricName: 'ActiveMessages'
    entities: ingressQueueNames
    threshold: ordersQueueBacklogThreshold
  }
]

resource queueAlertRules 'Microsoft.Insights/metricAlerts@2018-03-01' = [for alert in queueAlerts: {
  name: '${namePrefix}-${alert.name}'
  location: 'global'
  tags: tags
  properties: {
    description: alert.description
    severity: alert.severity
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: alert.name
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: alert.metricName
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: alert.entities
            }
          ]
          operator: 'GreaterThan'
          threshold: alert.threshold
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [
      {
        actionGroupId: actionGroupId
      }
    ]
  }
}]
