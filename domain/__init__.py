"""The order workflow's domain: records, messages, the state machine, identities
and the error vocabulary. Pure code: no I/O, no Azure SDK imports.

Everything the Scheduler, the Agents and the Supervisor agree on lives here, so
that a change of contract is one diff in one package."""
