"""What to do with a received Service Bus message, decided by a handler and
carried out by its trigger through the message-actions object (the SDK-type
binding's `ServiceBusMessageActions` under the Functions host, the local host's
implementation of the same methods under devstack.host)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SettleKind(StrEnum):
    COMPLETE = "complete"
    ABANDON = "abandon"
    DEADLETTER = "deadletter"


@dataclass(frozen=True)
class Settle:
    kind: SettleKind
    reason: str | None = None
    description: str | None = None
    order_id: str | None = None

    @classmethod
    def complete(cls, order_id: str | None = None) -> Settle:
        return cls(SettleKind.COMPLETE, order_id=order_id)

    @classmethod
    def abandon(cls, description: str, order_id: str | None = None) -> Settle:
        return cls(SettleKind.ABANDON, description=description, order_id=order_id)

    @classmethod
    def deadletter(cls, reason: str, description: str, order_id: str | None = None) -> Settle:
        return cls(SettleKind.DEADLETTER, reason, description[:1024], order_id)


def message_body(message) -> bytes:
    body = message.body
    return body if isinstance(body, bytes | bytearray) else b"".join(body)


def settle(message, actions, outcome: Settle) -> None:
    if outcome.kind is SettleKind.COMPLETE:
        actions.complete(message)
    elif outcome.kind is SettleKind.DEADLETTER:
        actions.deadletter(
            message,
            deadletter_reason=outcome.reason,
            deadletter_error_description=outcome.description,
        )
    else:
        actions.abandon(message)
