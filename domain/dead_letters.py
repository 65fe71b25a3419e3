"""Every reason a message is dead-lettered with, and the table that explains
them, rendered into docs/operations.md and docs/client-guide.md by
`python -m domain.dead_letters` (tests/contracts checks both, and that every
reason the code names is here)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class DeadLetterReason(StrEnum):
    """The `DeadLetterReason` application property of a dead letter."""

    INVALID_MESSAGE = "InvalidMessage"
    APP_ID_MISMATCH = "AppIdMismatch"
    REPLY_QUEUE_NOT_ALLOWED = "ReplyQueueNotAllowed"
    ORDER_CONFLICT = "OrderConflict"
    WRONG_SHARD = "WrongShard"
    RETRIES_EXHAUSTED = "RetriesExhausted"
    PROCESSING_FAILED = "ProcessingFailed"
    #: Internal queues only (ADR 017e): messages that did not prove where they come from.
    FORGED_REQUEST = "ForgedRequest"
    UNKNOWN_STEP = "UnknownStep"
    FORGED_REPLY = "ForgedReply"
    #: Set by Service Bus itself, not by the app.
    MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"


@dataclass(frozen=True)
class Explanation:
    reason: DeadLetterReason
    happened: str
    client: str
    operator: str


REASONS: tuple[Explanation, ...] = (
    Explanation(
        DeadLetterReason.INVALID_MESSAGE,
        "The body is not a valid contract: not JSON, duplicate keys, NaN, too deep or too "
        "large (64 KiB), wrong type, an amount that is not a decimal string, unknown field, "
        "a field breaking the text policy, a malformed OrderID, a Total that is not the sum "
        "of the lines, something that looks like a card number, or an AMQP map/list body. "
        "The description names the rule and the field. Nothing was written.",
        "Fix the message as the description says; resending the same body cannot succeed.",
        "Tell the sending application what the description says. On `agent-requests`/"
        "`agent-responses` it means something other than our Scheduler/Agent wrote to the "
        "queue: check who has send rights.",
    ),
    Explanation(
        DeadLetterReason.APP_ID_MISMATCH,
        "The body's `AppId` is not the application whose ingress queue it arrived on. "
        "Nothing was written.",
        "Send your own AppId to your own queue.",
        "Treat it as a security event: find which client holds Sender on that queue and why "
        "it names another application. Do not resubmit.",
    ),
    Explanation(
        DeadLetterReason.REPLY_QUEUE_NOT_ALLOWED,
        "The order names a reply queue not registered to its application. Nothing was "
        "written or sent.",
        "Use your registered reply queue.",
        "Check `REPLY_QUEUE_REGISTRY`; if legitimate, register the queue and ask the client "
        "to resend. Otherwise treat it as an attempt to read another application's statuses.",
    ),
    Explanation(
        DeadLetterReason.ORDER_CONFLICT,
        "The same application sent an order with this OrderID before, with different data "
        "(OrderIDs are unique per application: another application's orders are never "
        "compared); the description lists the fields that differ. Nothing was overwritten.",
        "You already sent an order with this OrderID and other content (only your own "
        "orders are compared): a new order needs a new OrderID.",
        "Ask the client whether it reused an OrderID.",
    ),
    Explanation(
        DeadLetterReason.WRONG_SHARD,
        "A sharded deployment (`SHARD_COUNT` > 1): the order belongs to another shard "
        "(`python -m domain.shards`), so this one wrote nothing; the description names "
        "the order's shard.",
        "Send it to the ingress queue of the shard the description names, computed as the "
        'client guide\'s "Shards" says.',
        "Check the client's shard count against `SHARD_COUNT`; the dead letter's body may "
        "be sent to the shard it names unchanged.",
    ),
    Explanation(
        DeadLetterReason.RETRIES_EXHAUSTED,
        "A transient failure (store throttled, bus or Durable host unavailable) outlasted "
        "the back-off schedule (`REDELIVERY_DELAYS_SECONDS`, default 5,15,30,60,120,300 s) "
        "or, when no delayed retry could be scheduled, the queue's last delivery. The "
        "message itself may be fine.",
        "Resend the same body later with the same OrderID (Submit is idempotent on it).",
        "Fix the dependency the description names, then resend the body (unchanged).",
    ),
    Explanation(
        DeadLetterReason.PROCESSING_FAILED,
        "The handler raised an exception outside its known outcomes (a bug, or an input "
        "nobody foresaw); the description names the exception.",
        "Nothing to change on your side unless the operators say so; they resend it.",
        "File a bug with the dead letter's body and the host log; once fixed, resend the body.",
    ),
    Explanation(
        DeadLetterReason.FORGED_REQUEST,
        "`agent-requests`: a well-formed request without the Scheduler's valid signature "
        "(unsigned, signed with an unknown key, or changed after signing). Nothing was "
        "called, no reply sent; the fencing token it carried was not seen by any service.",
        "Not a client queue: nothing to do.",
        "A security event unless it is the cut-over of a deployment (requests the previous "
        "build sent: ADR 017e): find who can send to `agent-requests`. Never resend it.",
    ),
    Explanation(
        DeadLetterReason.UNKNOWN_STEP,
        "`agent-requests`: a signed request for a step this agent does not know (an agent "
        "older than the Scheduler). Nothing was called.",
        "Not a client queue: nothing to do.",
        "Deploy the agent that knows the step; the attempt times out and the Supervisor "
        "retries it.",
    ),
    Explanation(
        DeadLetterReason.FORGED_REPLY,
        "`agent-responses`: a reply whose token was not made for the request it names (no "
        "token, another step, attempt, try or application, a step not yet requested) or "
        "whose agent signature does not verify (a changed outcome). No event was raised: "
        "the order is unchanged.",
        "Not a client queue: nothing to do.",
        "As `ForgedRequest`: a security event, or the cut-over of a deployment.",
    ),
    Explanation(
        DeadLetterReason.MAX_DELIVERY_COUNT_EXCEEDED,
        "Set by Service Bus, not the app: the message was delivered `MaxDeliveryCount` (5) "
        "times without being settled, so a host process died repeatedly while handling it. "
        "It should not appear.",
        "Resend later with the same OrderID.",
        "Look for host crashes around the message's enqueued time; resend the body once fixed.",
    ),
)

ROOT = Path(__file__).resolve().parents[1]
#: The documents that carry the table, between these markers.
DOCUMENTS = (ROOT / "docs" / "operations.md", ROOT / "docs" / "client-guide.md")
BEGIN = "<!-- dead-letter-reasons: generated by `python -m domain.dead_letters`; do not edit -->"
END = "<!-- /dead-letter-reasons -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table() -> str:
    """The reason table in Markdown, markers included."""
    rows = [
        "| DeadLetterReason | What happened | What the client does | What the operator does |",
        "|---|---|---|---|",
    ]
    for entry in REASONS:
        cells = (f"`{entry.reason.value}`", entry.happened, entry.client, entry.operator)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join([BEGIN, *rows, END])


def rendered(text: str) -> str:
    """`text` with the table between its markers replaced by the current one."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError("the document has no dead-letter-reasons markers")
    return text[:start] + table() + text[end + len(END) :]


if __name__ == "__main__":
    for path in DOCUMENTS:
        path.write_text(rendered(path.read_text()), encoding="utf-8")
    print(f"wrote the dead-letter reason table to {len(DOCUMENTS)} documents")
