"""The Scheduler: the starter that claims Pending orders, the Durable
orchestrator that runs each attempt's steps, and the reply bridge that turns
agent replies into external events."""
