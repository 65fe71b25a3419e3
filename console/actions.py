"""An operator's actions on an order, the same from the console and the CLI,
each recorded in the order's History as `By = "operator:<name>"` with the
stated reason. Pure: the callers read and write the record."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from console.security import printable
from domain import state_machine as sm
from domain.models import HistoryEntry, OrderState, ProcessState

MAX_REASON = 200  # characters; the History entry's Reason holds 300
MAX_OPERATOR = 80
HISTORY_BY_LIMIT = 100

ORDER_ACTIONS = {
    "resubmit": (
        "Resubmit",
        "Put this Error order back to Pending with a fresh retry budget; "
        "completed steps stay completed and the next attempt resumes after them.",
    ),
    "compensate": (
        "Compensate",
        "Undo this order's completed steps in reverse order; the Starter "
        "runs the compensation as a new attempt.",
    ),
    "retry": (
        "Retry now",
        "Take this Pending order now instead of at its next try (a long retry waits "
        "hours): the Starter claims it on its next run. Its retry budget is unchanged.",
    ),
}


def retry_now(record: OrderState, now: datetime, by: str = "operator") -> OrderState:
    """A Pending order waiting for its next try (NotBefore, a long retry) is
    due now: the Starter's query takes Pending orders whose NotBefore has
    passed. Refused for any other order."""
    if record.ProcessState is not ProcessState.PENDING or not (
        record.NotBefore and record.NotBefore > now
    ):
        raise sm.IllegalTransition(
            f"cannot retry order {record.id} now: only a Pending order waiting for its "
            f"next try can be (it is {record.ProcessState.value}"
            + (f", due {record.NotBefore.isoformat()})" if record.NotBefore else ", due now)")
        )
    entry = HistoryEntry(
        At=now,
        From=record.ProcessState,
        To=record.ProcessState,
        By=by,
        Reason=f"retry now, not at {record.NotBefore.isoformat()}",
    )
    return record.model_copy(
        update={
            "NotBefore": now,
            "History": [*record.History, entry][-sm.HISTORY_LIMIT :],
            "UpdatedAt": now,
        },
        deep=True,
    )


_TRANSITIONS: dict[str, Callable[..., OrderState]] = {
    "resubmit": sm.resubmit,
    "compensate": sm.request_compensation,
    "retry": retry_now,
}


class RefusedInput(ValueError):
    """An operator's name or reason that cannot be recorded; the message says why."""


def _one_line(raw: str | None) -> str:
    return " ".join(printable(raw or "").split())


def check_reason(raw: str | None) -> str:
    """The reason an operator gives, on one line: 3 to MAX_REASON characters."""
    reason = _one_line(raw)
    if len(reason) < 3:
        raise RefusedInput(
            "say why (a reason of at least 3 characters is recorded with the action)"
        )
    if len(reason) > MAX_REASON:
        raise RefusedInput(f"the reason is {len(reason)} characters; at most {MAX_REASON}")
    return reason


def check_operator(raw: str | None) -> str:
    """An operator's name as the History records it: 1 to MAX_OPERATOR characters."""
    name = _one_line(raw)
    if not name:
        raise RefusedInput("name the operator acting")
    if len(name) > MAX_OPERATOR:
        raise RefusedInput(f"the operator's name is longer than {MAX_OPERATOR} characters")
    return name


def by(who: str) -> str:
    """The History's `By` for an operator."""
    return f"operator:{who}"[:HISTORY_BY_LIMIT]


def apply(record: OrderState, action: str, who: str, reason: str, now: datetime) -> OrderState:
    """`action`'s transition of `record` by operator `who`, its History entry
    saying why. IllegalTransition when the state does not allow it."""
    transition = _TRANSITIONS.get(action)
    if transition is None:
        raise RefusedInput(f"unknown action {action!r}")
    changed = transition(record, now, by=by(who))
    last = changed.History[-1]
    said = f"{last.Reason}: {reason}" if last.Reason else reason
    entry = last.model_copy(update={"Reason": said[:300]})
    return changed.model_copy(update={"History": [*changed.History[:-1], entry]})
