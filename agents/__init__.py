"""The Agents: one library that makes the workflow's remote calls, used by two
runners (the Functions trigger in triggers.agents, the standalone worker in
agents.worker). See docs/agents.md; the steps they call are the catalog in
domain/steps.json (domain.steps)."""
