"""The order workflow's domain: records, messages, the state machine, identities
and the error vocabulary. Pure code: no I/O, no Azure SDK imports.

Everything the Scheduler, the Agents and the Supervisor agree on lives here, so
that a change of contract is one diff in one package."""

from domain.errors import (
    ConflictError,
    DomainError,
    NotFoundError,
    PermanentError,
    StaleError,
    TransientError,
    ValidationFailed,
)
from domain.ids import (
    agent_reply_message_id,
    agent_request_message_id,
    attempt_instance_id,
    fencing_token,
    idempotency_key,
    parse_attempt_instance_id,
    reply_event_name,
    status_message_id,
)
from domain.models import (
    SCHEMA_VERSION,
    AgentReply,
    AgentRequest,
    CompensationEntry,
    HistoryEntry,
    OperatorAlert,
    OrderLine,
    OrderState,
    OrderSubmitted,
    ProcessState,
    ReplyOutcome,
    StatusKind,
    StatusUpdate,
    StepState,
    StepStatus,
)

__all__ = [
    "SCHEMA_VERSION",
    "AgentReply",
    "AgentRequest",
    "CompensationEntry",
    "ConflictError",
    "DomainError",
    "HistoryEntry",
    "NotFoundError",
    "OperatorAlert",
    "OrderLine",
    "OrderState",
    "OrderSubmitted",
    "PermanentError",
    "ProcessState",
    "ReplyOutcome",
    "StaleError",
    "StatusKind",
    "StatusUpdate",
    "StepState",
    "StepStatus",
    "TransientError",
    "ValidationFailed",
    "agent_reply_message_id",
    "agent_request_message_id",
    "attempt_instance_id",
    "fencing_token",
    "idempotency_key",
    "parse_attempt_instance_id",
    "reply_event_name",
    "status_message_id",
]
