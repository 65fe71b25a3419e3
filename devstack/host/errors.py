"""The host's error vocabulary: a HostError is reported as one line and stops the host."""


class HostError(Exception):
    """A configuration or start-up problem the user must fix (missing setting, bad app, ...)."""


class NonDeterminismError(Exception):
    """The orchestrator's replay does not match its recorded history."""
