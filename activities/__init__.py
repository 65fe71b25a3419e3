"""The Scheduler's activities: every side effect the orchestration needs (state
writes guarded by LockedBy, messages to agents, status, alerts, inline agent
steps). Activities run at least once, so each is idempotent."""
