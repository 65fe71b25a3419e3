"""Pydantic models for the state record and every message (docs/design.md §3, §5):
one strict model per contract, each with its `SchemaVersion`. The rules every
message obeys (no coercion, the text policy, bounded sizes) and the dead-letter
reasons: docs/adr/013-message-contracts.md."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, Self, TypeAlias

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from domain.boundary import check_order_id, check_text, clean_text
from domain.ids import (
    APP_ID_PATTERN,
    ORDER_KEY_MAX_LENGTH,
    ORDER_KEY_PATTERN,
    STEP_NAME_PATTERN,
    check_order_key,
    client_order_id,
)

SCHEMA_VERSION: Final = 1
MAX_LINES = 100
MAX_PAYLOAD_KEYS = 50

OrderId = Annotated[str, AfterValidator(check_order_id)]
# The order inside the system (domain.ids.order_key): `{app}:{OrderID}`.
OrderKey = Annotated[
    str,
    StringConstraints(pattern=ORDER_KEY_PATTERN, min_length=1, max_length=ORDER_KEY_MAX_LENGTH),
    AfterValidator(check_order_key),
]
ShortText = Annotated[
    str, StringConstraints(min_length=1, max_length=200), AfterValidator(check_text)
]


def _produced(max_length: int, *, mask: bool = False) -> Any:
    """Text our code fills from outside text: cleaned to the text policy when
    built in code, checked as it is when received (the WIRE context). With
    `mask` (an error, a reason), card-number-like runs are masked before the cut."""

    def clean(value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str) or (info.context or {}).get("wire"):
            return value
        return clean_text(mask_card_numbers(value) if mask else value, max_length)

    return Annotated[
        str,
        BeforeValidator(clean),
        StringConstraints(max_length=max_length),
        AfterValidator(check_text),
    ]


# A type checker cannot evaluate a call in an annotation: it reads these as `str`.
if TYPE_CHECKING:
    ProducedText200: TypeAlias = str
    ProducedText260: TypeAlias = str
    ProviderText500: TypeAlias = str
    ProviderText2000: TypeAlias = str
else:
    ProducedText200 = _produced(200)
    ProducedText260 = _produced(260)
    ProviderText500 = _produced(500, mask=True)
    ProviderText2000 = _produced(2000, mask=True)


# 13 or more digits, single spaces, dots or dashes between them: wider than a
# card number on purpose (no Luhn check, no upper bound); a long numeric id in
# an error text is a small loss next to a stored card number.
_CARD_NUMBER_LIKE = re.compile(r"(?<!\d)\d(?:[ .\-\u2010-\u2015\u2212]?\d){12,}(?!\d)")
CARD_NUMBER_MASK = "[card number removed]"


def mask_card_numbers(text: str) -> str:
    """`text` with every card-number-like digit run replaced by CARD_NUMBER_MASK."""
    return _CARD_NUMBER_LIKE.sub(CARD_NUMBER_MASK, text)


MAX_REFERENCE = 200


def provider_reference(value: Any) -> str | None:
    """A provider's reference as the record keeps it: whatever the service
    answered after its side effect, as text (non-text as compact JSON), card
    numbers masked, cleaned and cut to MAX_REFERENCE, so it never makes the
    step's write fail. Idempotent. For people only: undo goes by the idempotency key."""
    if value is None:
        return None
    if not isinstance(value, str):
        try:
            value = json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
        except (TypeError, ValueError, RecursionError):
            value = repr(type(value))
    value = mask_card_numbers(value).strip()
    if not value:
        return None
    return clean_text(value, MAX_REFERENCE)


ReferenceText = Annotated[str | None, BeforeValidator(provider_reference)]
"""A provider reference field: anything in, bounded clean text (or None) out."""


# Bounded, checked text (check_text: printable, no bidi controls) of three sizes.
Text64: TypeAlias = Annotated[
    str, StringConstraints(min_length=1, max_length=64), AfterValidator(check_text)
]
Text100: TypeAlias = Annotated[
    str, StringConstraints(min_length=1, max_length=100), AfterValidator(check_text)
]
Text120: TypeAlias = Annotated[
    str, StringConstraints(min_length=1, max_length=120), AfterValidator(check_text)
]
# A token or signature (domain.signing): `v1.<key id>.<base64url MAC>`.
SignatureText: TypeAlias = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,120}$", max_length=120)
]
AppIdText: TypeAlias = Annotated[str, StringConstraints(pattern=APP_ID_PATTERN)]

# RFC 3339's date-time (JSON Schema's "date-time"): full date, "T", time, an
# offset or "Z". Pydantic alone also takes a number of seconds written as a
# string ("1780000000") and a space for the "T".
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})"
)


def _rfc3339(value: Any) -> Any:
    """A string is parsed here (after the pattern), so that strict validation
    downstream sees a datetime; anything else is left to it."""
    if not isinstance(value, str):
        return value
    if not _RFC3339.fullmatch(value):
        raise ValueError(
            "must be an RFC 3339 date-time with an offset, such as 2026-01-31T12:00:00Z"
        )
    return datetime.fromisoformat(value.upper())


# A time on the wire: written as RFC 3339 text (a datetime built in code passes).
WireTime: TypeAlias = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]


def _amount(integer_digits: int) -> Any:
    """A money amount: a decimal JSON string (exact in every language) or a
    JSON number; "ten", "1,50", "1e2" or "+5" are refused here and by the schema alike."""
    pattern = rf"^(0|[1-9][0-9]{{0,{integer_digits - 1}}})(\.[0-9]{{1,2}})?$"
    form = re.compile(pattern)

    def check_form(value: Any) -> Any:
        # Converted here: pydantic checks a before-validator's result in Python mode.
        if isinstance(value, str):
            if not form.match(value):
                raise ValueError(
                    f'an amount is a decimal string such as "10.00": digits, at most '
                    f"{integer_digits} before the point and 2 after it"
                )
            return Decimal(value)
        if isinstance(value, bool):
            raise ValueError('an amount is a decimal string such as "10.00", not a boolean')
        if isinstance(value, int | float):
            return Decimal(str(value))
        return value

    return Annotated[
        Decimal,
        BeforeValidator(check_form),
        Field(ge=0, max_digits=integer_digits + 2, decimal_places=2),
        WithJsonSchema(
            {"anyOf": [{"type": "string", "pattern": pattern}, {"type": "number", "minimum": 0}]},
            mode="validation",
        ),
    ]


if TYPE_CHECKING:
    UnitPriceAmount: TypeAlias = Decimal
    TotalAmount: TypeAlias = Decimal
else:
    UnitPriceAmount = _amount(10)
    TotalAmount = _amount(12)

QueueName = Annotated[
    str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,259}$", max_length=260)
]
StepName = Annotated[str, StringConstraints(pattern=STEP_NAME_PATTERN)]


class Contract(BaseModel):
    """Base of every wire and store contract: closed, validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    SchemaVersion: Literal[1] = SCHEMA_VERSION

    @field_validator("SchemaVersion", mode="before")
    @classmethod
    def _exactly_one(cls, value: Any) -> Any:
        # Literal[1] alone accepts 1.0 and true (they compare equal to 1).
        if type(value) is not int:
            raise ValueError(f"must be the integer {SCHEMA_VERSION}, not {type(value).__name__}")
        return value


class ProcessState(StrEnum):
    PENDING = "Pending"
    PROCESSING = "Processing"
    PROCESSED = "Processed"
    ERROR = "Error"
    COMPENSATING = "Compensating"
    COMPENSATED = "Compensated"
    COMPENSATION_FAILED = "CompensationFailed"
    REJECTED = "Rejected"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {
        ProcessState.PROCESSED,
        ProcessState.ERROR,
        ProcessState.COMPENSATED,
        ProcessState.COMPENSATION_FAILED,
        ProcessState.REJECTED,
    }
)


class StepStatus(StrEnum):
    NOT_STARTED = "NotStarted"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    COMPENSATED = "Compensated"


class StatusKind(StrEnum):
    RECEIVED = "Received"
    PROCESSING = "Processing"
    STEP_COMPLETED = "StepCompleted"
    PROCESSED = "Processed"
    FAILED = "Failed"
    REJECTED = "Rejected"
    COMPENSATING = "Compensating"
    COMPENSATED = "Compensated"
    COMPENSATION_FAILED = "CompensationFailed"


class ReplyOutcome(StrEnum):
    OK = "ok"
    TRANSIENT = "transient"
    PERMANENT = "permanent"


# Aliases so that fields named like their types (the design's vocabulary) resolve.
_ProcessState = ProcessState
_ReplyOutcome = ReplyOutcome

# --- the order -----------------------------------------------------------------


class CustomerInfo(Contract):
    """Who ordered. No payment instrument data: only a reference to it."""

    SchemaVersion: Literal[1] = Field(default=SCHEMA_VERSION, exclude=True)
    CustomerId: ShortText
    Name: ShortText | None = None


class OrderLine(Contract):
    SchemaVersion: Literal[1] = Field(default=SCHEMA_VERSION, exclude=True)
    Sku: ShortText
    Quantity: Annotated[int, Field(strict=True, gt=0, le=10_000)]
    UnitPrice: UnitPriceAmount


class OrderSubmitted(Contract):
    """What a client posts to its own ingress queue."""

    OrderID: OrderId
    AppId: AppIdText
    ReplyTo: QueueName
    Customer: CustomerInfo
    Lines: Annotated[list[OrderLine], Field(min_length=1, max_length=MAX_LINES)]
    Total: TotalAmount
    Currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "EUR"
    PaymentReference: Text64 | None = None

    @field_validator("PaymentReference")
    @classmethod
    def _no_card_numbers(cls, value: str | None) -> str | None:
        # A reference to a payment instrument, never the instrument itself.
        if value is not None and _looks_like_card_number(value):
            raise ValueError("looks like a card number; send a payment reference instead")
        return value

    @model_validator(mode="after")
    def _total_matches_lines(self) -> OrderSubmitted:
        expected = sum((line.UnitPrice * line.Quantity for line in self.Lines), Decimal(0))
        if expected != self.Total:
            raise ValueError(f"Total {self.Total} does not equal the sum of the lines {expected}")
        return self

    def immutable_fields(self) -> dict[str, Any]:
        """The fields a redelivery must match exactly (all of them: an order
        does not change after submission), in a canonical form so that 1.5 and
        "1.50" compare equal."""
        data = self.model_dump(mode="python")
        return json.loads(json.dumps(data, default=_canonical, sort_keys=True))

    def differing_fields(self, other: OrderSubmitted) -> list[str]:
        """Top-level fields whose canonical values differ from `other`'s, in model order."""
        mine, theirs = self.immutable_fields(), other.immutable_fields()
        return [name for name in type(self).model_fields if mine.get(name) != theirs.get(name)]

    def digest(self) -> str:
        """Fingerprint of the immutable fields, kept on the state record so a
        redelivery can be compared without reading the orders DB."""
        canonical = json.dumps(self.immutable_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _looks_like_card_number(value: str) -> bool:
    """13-19 digits (spaces and dashes allowed) that pass the Luhn check."""
    digits = value.replace(" ", "").replace("-", "")
    return digits.isdigit() and 13 <= len(digits) <= 19 and passes_luhn(digits)


def passes_luhn(digits: str) -> bool:
    """The check digit test every card number passes (ASCII digits only)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def _canonical(value: Any) -> Any:
    if isinstance(value, Decimal):
        return f"{value:.2f}"
    raise TypeError(f"cannot canonicalise {type(value).__name__}")


# --- the state record -------------------------------------------------------------


class RecordPart(Contract):
    """The state record and its parts are read tolerantly: a field this version
    does not know (a newer version's, a hand edit) is kept and written back
    unchanged. A value it cannot take (a wrong type, a newer SchemaVersion)
    makes the document unreadable: scans skip it and alert. Messages stay
    closed (Contract): what arrives on a queue is refused whole."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, frozen=False)


class StepState(RecordPart):
    SchemaVersion: Literal[1] = Field(default=SCHEMA_VERSION, exclude=True)
    Status: StepStatus = StepStatus.NOT_STARTED
    Attempt: int = 0
    StartedAt: AwareDatetime | None = None
    CompleteBy: AwareDatetime | None = None
    CompletedAt: AwareDatetime | None = None
    Reference: ReferenceText = None
    # The last transient reason an agent gave (state_machine.short_text), for the Supervisor.
    Error: Annotated[str, StringConstraints(max_length=300)] | None = None


class CompensationEntry(RecordPart):
    """One line of the ordered compensation log: what to undo and how it went.
    Holds references only (the order data's classification)."""

    SchemaVersion: Literal[1] = Field(default=SCHEMA_VERSION, exclude=True)
    Step: StepName
    Reference: ReferenceText = None
    Outcome: Literal["Pending", "Done", "Failed"] = "Pending"
    At: AwareDatetime | None = None
    Error: Annotated[str, StringConstraints(max_length=500)] | None = None


class HistoryEntry(RecordPart):
    SchemaVersion: Literal[1] = Field(default=SCHEMA_VERSION, exclude=True)
    At: AwareDatetime
    From: _ProcessState | None
    To: _ProcessState
    By: Annotated[str, StringConstraints(max_length=100)]
    Reason: Annotated[str, StringConstraints(max_length=300)] | None = None


class PendingStatus(RecordPart):
    """A terminal status not yet known to be on the reply queue (the outbox,
    docs/adr/001-status-outbox.md): written with the terminal state, cleared once sent."""

    SchemaVersion: Literal[1] = Field(default=SCHEMA_VERSION, exclude=True)
    Status: StatusKind
    MessageId: Annotated[str, StringConstraints(max_length=200)]
    Detail: Annotated[str, StringConstraints(max_length=500)] | None = None
    Step: StepName | None = None
    At: AwareDatetime
    Tries: int = 0
    # The status is on the reply queue; only its operator alert is left (the
    # alerts queue refused it): the client's status never waits for the
    # operators' queue (docs/adr/001-status-outbox.md).
    Sent: bool = False


_PendingStatus = PendingStatus


class OrderState(RecordPart):
    """The state record in Cosmos container `orderState` (partition key /id,
    the order key: domain.ids.order_key). System properties (`_etag`...) are
    not part of the model: the store adapter strips them on read."""

    id: OrderKey
    ProcessState: _ProcessState = _ProcessState.PENDING
    LockedBy: str | None = None
    CompleteBy: AwareDatetime | None = None
    NotBefore: AwareDatetime | None = None
    FailureCount: int = 0
    LongRetries: int = 0
    Attempt: int = 0
    AppId: str
    ReplyTo: QueueName
    OrderDigest: str
    ReceivedSent: bool = False
    CompensationRequested: bool = False
    CompensationRestarts: int = 0
    # Long retries of a compensation (ADR 019a); NotBefore is then its wake time.
    CompensationLongRetries: int = 0
    PendingStatus: _PendingStatus | None = None
    Steps: dict[StepName, StepState] = Field(default_factory=dict)
    Compensation: list[CompensationEntry] = Field(default_factory=list)
    LastError: Annotated[str, StringConstraints(max_length=500)] | None = None
    History: list[HistoryEntry] = Field(default_factory=list)
    CreatedAt: AwareDatetime
    UpdatedAt: AwareDatetime
    ttl: int | None = None
    # The W3C trace context of the Submit that created the record (ADR 015).
    Trace: dict[str, str] | None = None

    @property
    def order_id(self) -> str:
        """The client's own OrderID (what its status messages carry)."""
        return client_order_id(self.id)


# --- messages between Scheduler and Agents ------------------------------------------


def _bounded_payload(value: dict[str, Any]) -> dict[str, Any]:
    if len(value) > MAX_PAYLOAD_KEYS:
        raise ValueError(f"payload has {len(value)} keys; at most {MAX_PAYLOAD_KEYS}")
    for key in value:
        try:
            check_text(key)
        except ValueError as exc:
            raise ValueError(f"key {key[:40]!r}: {exc}") from None
    return value


PayloadDict = Annotated[dict[str, Any], AfterValidator(_bounded_payload)]


class _StepCall(Contract):
    """What a request and its reply both name: which attempt's which step, done or undone."""

    InstanceId: Text100
    OrderID: OrderKey  # the order key (domain.ids), not the client's OrderID alone
    Step: StepName
    Action: Literal["do", "undo"] = "do"
    Attempt: Annotated[int, Field(strict=True, ge=1)]
    # The order's application; covered by the reply token and both signatures.
    AppId: AppIdText | None = None
    # The proofs of origin (domain.signing, ADR 017e). Optional in the schema
    # so that an unsigned message is refused as forged, not as malformed.
    ReplyToken: SignatureText | None = None
    Signature: SignatureText | None = None


class AgentRequest(_StepCall):
    IdempotencyKey: Text120
    FencingToken: Annotated[int, Field(strict=True, ge=1)]
    Deadline: WireTime
    ReplyEvent: Text100
    Payload: PayloadDict = Field(default_factory=dict)
    # Until when the workflow still takes the answer of an undo try (ADR 005);
    # None: only before Deadline.
    ListenUntil: WireTime | None = None


class AgentCall(Contract):
    """One call an agent made to the remote service for a request: when it
    started, how long it took, how it ended (docs/adr/017d-agent-call-record.md)."""

    SchemaVersion: Literal[1] = Field(default=SCHEMA_VERSION, exclude=True)
    At: WireTime
    Ms: Annotated[int, Field(strict=True, ge=0, le=86_400_000)]
    Outcome: Literal["ok", "transient", "permanent", "error"]


MAX_AGENT_CALLS: Final = 16


class ReplyAnswer(BaseModel):
    """What a step's reply says, on the wire (AgentReply) and as the workflows read it."""

    Outcome: _ReplyOutcome
    Result: PayloadDict | None = None
    Error: ProviderText500 | None = None
    # The calls behind this answer, oldest first; None when no call was made.
    Calls: Annotated[list[AgentCall], Field(max_length=MAX_AGENT_CALLS)] | None = None

    @model_validator(mode="after")
    def _error_when_not_ok(self) -> Self:
        if self.Outcome is not ReplyOutcome.OK and not self.Error:
            raise ValueError("a transient or permanent reply must say why in Error")
        return self


class AgentReply(ReplyAnswer, _StepCall):
    EventName: Text100
    EventId: Text100


# --- messages to people and programs outside ---------------------------------------


class StatusUpdate(Contract):
    OrderID: OrderId
    Status: StatusKind
    Detail: ProviderText500 | None = None
    Step: StepName | None = None
    Timestamp: WireTime


class AlertExample(Contract):
    """One alert an aggregate counted (OperatorAlert.Last)."""

    OrderID: ProducedText200 | None = None
    Reason: ProviderText2000
    Timestamp: WireTime
    MessageId: ProducedText200 | None = None


class OperatorAlert(Contract):
    """For a dead letter, `Kind` is its reason, `Reason` its description, and
    `MessageId` + `Queue` name it, so the two can be joined. Text fields may
    quote a client: tools print them literally. An aggregate (docs/operations.md,
    "Alerts") carries `Count` alerts of one `Kind` and `Queue`: the first on
    top, `Last` the last."""

    Kind: Literal[
        "OrderConflict",
        "InvalidMessage",
        "ReplyQueueNotAllowed",
        "AppIdMismatch",
        "WrongShard",
        "RetriesExhausted",
        "ProcessingFailed",
        "OrderError",
        "CompensationFailed",
        "AgentFailure",
        "UnreadableRecord",
        "StatusUndeliverable",
        "ForgedReply",
        "ForgedRequest",
        "UnknownStep",
    ]
    OrderID: ProducedText200 | None = None
    Reason: ProviderText2000
    Timestamp: WireTime
    MessageId: ProducedText200 | None = None
    Queue: ProducedText260 | None = None
    Count: Annotated[int, Field(ge=1, exclude_if=lambda n: n == 1)] = 1
    Last: Annotated[AlertExample | None, Field(exclude_if=lambda v: v is None)] = None
