"""The order workflow's domain: records, messages, the state machine, identities
and the error vocabulary, which the Scheduler, the Agents and the Supervisor
agree on. Pure code: no I/O, no Azure SDK imports."""
