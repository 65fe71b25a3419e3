"""Card numbers in a provider's words never reach the state record, a status
or an alert (review defect 1): every place provider text enters is masked,
not only the console's rendering of it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain import state_machine as sm
from domain.codec import decode, encode
from domain.models import (
    AgentReply,
    OperatorAlert,
    OrderState,
    ProcessState,
    ReplyOutcome,
    StatusKind,
    StatusUpdate,
)
from tests.builders import start_step
from tests.unit.domain.conftest import NOW, STEPS

# Luhn-valid test numbers in the ways providers print them, and one that
# fails the Luhn check (masked too: a typo'd card number is still one).
PANS = [
    "4111111111111111",
    "4111 1111 1111 1111",
    "5500-0000-0000-0004",
    "378282246310005",
    "6759649826438453",
    "4222222222222",  # 13 digits
    "6304000000000000000",  # 19 digits
    "4111 1111 1111 1112",  # not Luhn-valid
    "4111.1111.1111.1111",
    "4111\u20131111\u20131111\u20131111",  # en dash
]

_DIGIT_RUN = re.compile(r"\d(?:[^\w]?\d){12,}")


def digits_runs(text: str) -> list[str]:
    """Every run of 13 or more digits (any single non-word character between
    them) in `text`: what must not be left anywhere."""
    return _DIGIT_RUN.findall(text)


def stored(record: OrderState) -> str:
    return record.model_dump_json()


@pytest.fixture
def compensating(processing):
    iid = processing.LockedBy
    record = start_step(processing, STEPS[0], NOW, NOW + timedelta(seconds=60))
    record = sm.complete_step(record, iid, STEPS[0], NOW, "ref-1")
    record = start_step(record, STEPS[1], NOW, NOW + timedelta(seconds=60))
    return sm.begin_compensation(record, iid, "charge failed", NOW, STEPS[1])


@pytest.mark.parametrize("pan", PANS)
def test_a_declined_card_in_the_provider_text_is_not_stored_on_failure(processing, pan):
    said = f"step charge-payment failed: card {pan} declined (do not honour)"
    record = sm.mark_failed(processing, processing.LockedBy, STEPS[1], said, NOW)
    assert digits_runs(stored(record)) == []
    # the rest of the message survives, so the operator still learns why
    assert "declined (do not honour)" in record.LastError
    assert "card [card number removed]" in record.LastError
    assert "[card number removed]" in record.History[-1].Reason
    assert "[card number removed]" in record.PendingStatus.Detail


@pytest.mark.parametrize("pan", PANS[:3])
def test_every_transition_taking_provider_text_masks_it(processing, compensating, policy, pan):
    iid = processing.LockedBy
    said = f"provider: {pan}"
    transient = sm.record_transient(processing, iid, STEPS[0], said, NOW)
    begun = sm.begin_compensation(processing, iid, said, NOW, STEPS[0])
    undone = sm.finish_compensation(
        sm.record_undo(compensating, iid, STEPS[0], False, NOW, said), iid, NOW
    )
    # the Supervisor quotes the step's transient reason when it recovers
    running = start_step(processing, STEPS[0], NOW, NOW + timedelta(seconds=1))
    expired = sm.recover_expired(
        sm.record_transient(running, iid, STEPS[0], said, NOW),
        iid,
        NOW + timedelta(minutes=1),
        policy,
    )
    rejected = sm.rejected_record(_order(), NOW, said)
    for record in (transient, begun, undone, expired, rejected):
        assert digits_runs(stored(record)) == [], record.ProcessState
    assert undone.ProcessState is ProcessState.COMPENSATION_FAILED
    assert "[card number removed]" in undone.LastError
    assert "[card number removed]" in expired.LastError


def _order():
    from domain.models import OrderSubmitted
    from tests.builders import order_payload

    return OrderSubmitted.model_validate(order_payload())


@pytest.mark.parametrize(
    "hidden",
    [
        "4111\x001111\x001111\x001111",
        "4111\u200b1111\u200b1111\u200b1111",
        "4111\u00a01111\u00a01111\u00a01111",
        "4111  1111\t1111\n1111",
    ],
)
def test_a_number_split_by_invisible_characters_is_masked(hidden):
    assert digits_runs(sm.short_text(f"card {hidden} refused", 500)) == []


def test_a_number_at_the_cut_is_masked_not_shortened():
    text = "x" * 90 + " 4111 1111 1111 1111 and more"
    short = sm.short_text(text, 100)
    assert digits_runs(short) == []
    assert len(short) <= 100


def test_short_numbers_dates_and_amounts_are_kept():
    text = "attempt 3 missed its deadline 2026-11-30T18:45:42.123456+00:00; code 500123; total 1234.56 EUR"
    assert sm.short_text(text, 500) == text


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    before=st.text(max_size=60),
    digits=st.text(alphabet="0123456789", min_size=13, max_size=19),
    seps=st.lists(
        st.sampled_from(["", " ", "-", ".", "\u00a0", "\x00", "\u200b"]), min_size=19, max_size=19
    ),
    after=st.text(max_size=60),
)
def test_any_card_length_number_anywhere_in_any_text_is_masked(before, digits, seps, after):
    pan = "".join(d + s for d, s in zip(digits, seps, strict=False))
    out = sm.short_text(f"{before} {pan} {after}", sm.ERROR_LIMIT)
    assert digits not in re.sub(r"\D", "", out)


# --- what we send: replies, statuses and alerts --------------------------------------


def test_messages_built_from_provider_text_carry_no_card_number():
    pan = "4111 1111 1111 1111"
    reply = AgentReply(
        InstanceId="ORD-1:1",
        OrderID="ORD-1",
        Step="charge-payment",
        Attempt=1,
        EventName="e",
        EventId="i",
        Outcome=ReplyOutcome.PERMANENT,
        Error=f"card {pan} declined",
    )
    status = StatusUpdate(
        OrderID="ORD-1", Status=StatusKind.FAILED, Detail=f"card {pan} declined", Timestamp=NOW
    )
    alert = OperatorAlert(
        Kind="OrderError", OrderID="4111111111111111", Reason=f"card {pan} declined", Timestamp=NOW
    )
    for message in (reply, status, alert):
        assert "[card number removed] declined" in encode(message).decode()
    # the order id is an identifier, not provider text: an alert keeps it whole
    assert alert.OrderID == "4111111111111111"
    assert digits_runs(alert.Reason) == []


def test_a_message_read_from_the_wire_is_checked_not_rewritten():
    raw = encode(
        StatusUpdate(OrderID="ORD-1", Status=StatusKind.FAILED, Detail="plain", Timestamp=NOW)
    )
    raw = raw.replace(b'"plain"', b'"card 4111111111111111"')
    # what a peer sent is read as sent (the state machine masks it when it is stored)
    assert decode(StatusUpdate, raw).Detail == "card 4111111111111111"


def test_dead_letter_descriptions_carry_no_card_number():
    """A dead letter's description may quote a provider's exception (an agent
    request whose handler raised) or a client's body: masked like an alert."""
    from adapters.settlement import Settle, dead_letter_text

    said = "handler raised RemoteError: card 4111-1111-1111-1111 blocked"
    assert digits_runs(dead_letter_text(said)) == []
    assert "RemoteError: card [card number removed] blocked" in dead_letter_text(said)
    assert digits_runs(Settle.dead_letter("ProcessingFailed", said).description) == []
