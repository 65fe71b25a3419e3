"""The error vocabulary. Adapters translate SDK exceptions into these at their
boundary, so callers decide on meaning (retry? give up? someone else owns it?)
rather than on HTTP status codes."""

from __future__ import annotations


class DomainError(Exception):
    """Base of every error the domain names."""


class TransientError(DomainError):
    """Worth retrying later: throttling, timeouts, a dependency briefly down.

    Attributes:
        retry_after: seconds the source asked us to wait, if it said.
        pacing: the source is up and asks us to slow down (a 429), or only
            our own deadline cut the wait for its answer short: not the
            failure a circuit breaker counts.
        no_answer_within: for a call that timed out, the seconds it was given.
    """

    def __init__(
        self,
        message: str,
        retry_after: float | None = None,
        *,
        pacing: bool = False,
        no_answer_within: float | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.pacing = pacing
        self.no_answer_within = no_answer_within


class AlertNotQueued(TransientError):
    """A required operator alert the alerts queue refused: the caller keeps
    its message, or hands `alert` and `alert_id` to `Alerts.hold`."""

    def __init__(self, message: str, alert: object, alert_id: str | None) -> None:
        super().__init__(message)
        self.alert = alert
        self.alert_id = alert_id


class PermanentError(DomainError):
    """Retrying cannot help: the request itself is wrong or refused for good."""


class StaleError(DomainError):
    """A conditional write lost: the record changed (etag) or another attempt
    owns it (LockedBy). Never retried blindly; the caller re-reads or stops."""


class ConflictError(DomainError):
    """An item with this id exists with different immutable data.

    Attributes:
        fields: names of the fields that differ.
        version: the etag of the item in the way, when the caller read it.
    """

    def __init__(
        self, message: str, fields: list[str] | None = None, version: str | None = None
    ) -> None:
        super().__init__(message)
        self.fields = fields or []
        self.version = version


class NotFoundError(DomainError):
    """The item does not exist."""


class ValidationFailed(PermanentError):
    """Input did not match its contract; `reason` is for humans."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StatusNotSent(TransientError):
    """A terminal status could not be sent yet: Durable retries the activity
    (same message id); the entry stays in the outbox for the Starter."""


class InlineStepFailed(TransientError):
    """An in-app step raised; the message (the exception's type and masked
    text) is what the workflow turns into a transient reply for the step."""


class NotConfigured(PermanentError):
    """A collaborator the call needs was not given to this process."""


class InstanceGone(PermanentError):
    """The orchestration instance an event was for does not exist or has finished."""
