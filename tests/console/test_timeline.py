"""The order story (console.timeline) on histories recorded from the local
stack (tests/console/histories/*.json: the state record and each attempt's
status from the host's durable API): a declined payment, an order retried after its agent's call timed
out, a compensation that failed and then succeeded, and a payment the agent
retried twice. Each attempt's outcome in words, causal order, each error
once, side-effect states, and the agent's calls.

The recordings are the live workflow's, made by driving those four orders
through the stack with the remote service's fault injection
(`python -m tests.console.histories.record`); the browser test checks the
same on live histories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console import effects
from console import timeline as story
from domain.ids import parse_attempt_instance_id
from domain.models import OrderState

HERE = Path(__file__).parent / "histories"


def _load(name: str) -> tuple[OrderState, list[dict]]:
    data = json.loads((HERE / f"{name}.json").read_text())
    record = OrderState.model_validate(data["record"])
    statuses = {
        parse_attempt_instance_id(iid)[1]: {
            "instance": iid,
            "runtime_status": st.get("runtimeStatus"),
            "output": st.get("output"),
            "history": st.get("historyEvents"),
        }
        for iid, st in data["statuses"].items()
    }
    return record, story.timeline(record, statuses)


def _texts(attempt: dict) -> list[str]:
    return [e.text for e in attempt["events"]]


def _index(texts: list[str], start: str) -> int:
    return next(i for i, t in enumerate(texts) if t.startswith(start))


def _effects(record, attempts) -> dict[str, str]:
    return {e["step"]: e["state"] for e in effects.side_effects(record, attempts)}


def test_a_declined_payment_reads_as_refused_then_compensated_with_nothing_to_refund():
    record, attempts = _load("declined")
    first = attempts[1]
    assert first["badge"] == "compensated: every requested step undone"
    texts = _texts(first)
    # causal order: the charge was asked, refused, then compensation, newest step first
    order = [
        _index(texts, "claimed by the Starter"),
        _index(texts, "attempt began"),
        _index(texts, "reserve inventory: requested"),
        _index(texts, "reserve inventory: done"),
        _index(texts, "charge payment: requested"),
        _index(texts, "charge payment: refused (permanent)"),
        _index(texts, "compensating:"),
        _index(texts, "refund payment: requested"),
        _index(texts, "refund payment: nothing to undo"),
        _index(texts, "release inventory: requested"),
        _index(texts, "release inventory: done"),
        _index(texts, "order Compensated"),
    ]
    assert order == sorted(order)
    # the provider's reason once, on the reply that carried it
    shown = [t for e in first["events"] for t in (e.text, e.detail or "")]
    assert sum("card declined" in t for t in shown) == 1
    # no activity names, no deadlines as events
    assert not any(
        name in t for t in shown for name in ("write_state", "raise_alert", "report_status")
    )
    assert not any(e.kind == "deadline" for e in first["events"])
    refused = next(e for e in first["events"] if e.text.startswith("charge payment: refused"))
    assert refused.detail.startswith("deadline met")
    assert _effects(record, attempts) == {
        "reserve-inventory": "undone",
        "charge-payment": "refused",
        "arrange-shipment": "not called",
    }


def test_an_order_retried_after_a_timeout_shows_two_attempts_and_their_outcomes():
    record, attempts = _load("retried")
    assert [a["attempt"] for a in attempts] == [0, 1, 2]
    first, second = attempts[1], attempts[2]
    assert first["badge"] == "timed out at reserve inventory: the service did not answer in time"
    assert second["badge"] == "Processed"
    texts = _texts(first)
    assert (
        _index(texts, "reserve inventory: requested")
        < _index(texts, "reserve inventory: the agent gave up")
        < _index(texts, "Supervisor: attempt 1 missed its deadline")
    )
    # the Supervisor's decision does not repeat the step's error
    supervisor = texts[_index(texts, "Supervisor:")]
    assert "no answer within" not in supervisor
    gave_up = next(e for e in first["events"] if "gave up" in e.text)
    assert {c["outcome"] for c in gave_up.calls} == {"transient"}
    assert _texts(second)[-1] == "order Processed"
    assert set(_effects(record, attempts).values()) == {"applied"}


def test_a_compensation_that_failed_then_succeeded():
    record, attempts = _load("compfail")
    first, second = attempts[1], attempts[2]
    assert first["badge"] == "compensation failed"
    assert second["badge"] == "compensated: every requested step undone"
    texts = _texts(first)
    assert _index(texts, "release inventory: refused (permanent)") < _index(
        texts, "order CompensationFailed"
    )
    # the operator's request closes the first attempt; the Starter's claim opens the second
    assert texts[-1] == "operator local: compensation requested: the provider fixed its release"
    assert _texts(second)[0] == "claimed by the Starter to compensate, as an operator asked"
    assert "release inventory: done" in " ".join(_texts(second))
    assert _effects(record, attempts)["reserve-inventory"] == "undone"
    assert _effects(record, attempts)["charge-payment"] == "refused"


def test_an_agent_that_retried_shows_each_call():
    _record, attempts = _load("agentretry")
    (attempt,) = attempts[1:]
    assert attempt["badge"] == "Processed"
    charge = next(e for e in attempt["events"] if e.text.startswith("charge payment: done"))
    assert [c["outcome"] for c in charge.calls] == ["transient", "transient", "ok"]
    assert all(c["took"].endswith("ms") for c in charge.calls)
    assert charge.calls[0]["after"] == "0 ms"
    assert charge.calls[2]["after"] is not None
    # the in-app step is requested once, answered once
    texts = _texts(attempt)
    assert texts.count("arrange shipping: requested") == 1


def test_without_history_the_record_still_tells_the_steps():
    record, _ = _load("declined")
    attempts = story.timeline(record, {})
    assert attempts[1]["badge"] == "Compensated"
    texts = _texts(attempts[1])
    assert "reserve inventory: requested" in texts
    assert any(t.startswith("reserve inventory: done") for t in texts)


@pytest.mark.parametrize(
    ("output", "badge"),
    [
        ({"Outcome": "processed"}, "Processed"),
        (
            {"Outcome": "timed_out", "Step": "charge-payment", "Detail": "deadline passed"},
            "timed out at charge payment: no reply by the deadline",
        ),
        (
            {"Outcome": "failed", "Step": "arrange-shipment", "Detail": "x"},
            "failed at arrange shipping",
        ),
        ({"Outcome": "stale", "Step": "charge-payment"}, "superseded by a later attempt"),
        ({"Outcome": "compensation_failed"}, "compensation failed"),
        (
            {"Outcome": "compensation_deferred"},
            "undo unconfirmed: the compensation waits for a long retry",
        ),
    ],
)
def test_badges_are_outcomes_in_words_never_the_runtime_status(output, badge):
    assert story.outcome({"runtime_status": "Completed", "output": output})[0] == badge


@pytest.mark.parametrize(
    ("event", "calls", "answered"),
    [
        ("reply-charge-payment-2", [("charge-payment", "do")], ("charge-payment", "do")),
        (
            "reply-charge-payment-undo-1-2",
            [("charge-payment", "do"), ("charge-payment", "undo")],
            ("charge-payment", "undo"),
        ),
        # a step whose name ends like an undo's try is told by the calls asked
        ("reply-odd-undo-3-1", [("odd-undo-3", "do")], ("odd-undo-3", "do")),
        ("reply-lost-step-undo-0-1", [], ("lost-step", "undo")),  # asked for before this page
    ],
)
def test_a_reply_events_name_says_which_call_it_answers(event, calls, answered):
    asked = [story.Call(step=s, action=a, requested_at=None) for s, a in calls]
    assert story._answered_call(event, asked) == answered


def test_each_request_and_reply_carries_its_raw_input_or_output_redacted():
    """Issue 45: the raw input and output of each step call, as Temporal's
    Web UI shows them; payment data dropped, card numbers masked."""
    _record, attempts = _load("declined")
    events = {e.text.split(" after ")[0]: e for e in attempts[1]["events"]}
    refused = json.loads(events["charge payment: refused (permanent)"].raw)
    assert refused["Outcome"] == "permanent"
    assert "card declined" in refused["Error"]
    request = json.loads(events["refund payment: requested"].raw)
    assert (request["Step"], request["Action"]) == ("charge-payment", "undo")
    hostile = story.raw_text(
        {"Result": {"PaymentReference": "pay-1", "Note": "card 4111 1111 1111 1111"}}
    )
    assert "pay-1" not in hostile
    assert "4111" not in hostile
    assert len(story.raw_text({"x": "y" * 10_000})) == story.RAW_LIMIT


def test_a_step_added_by_data_is_told_in_its_catalog_words(tmp_path, monkeypatch):
    from tests.added_step import write_catalog

    monkeypatch.setenv("STEP_CATALOG_FILE", str(write_catalog(tmp_path / "steps.json")))
    story._catalog.cache_clear()
    try:
        assert story.label("reserve-warehouse-slot") == "reserve warehouse"
        assert story.label("reserve-warehouse-slot", "undo") == "release warehouse"
        assert story.label("charge-payment", "undo") == "refund payment"
        assert story.label("no-such-step", "undo") == "undo no-such-step"
    finally:
        story._catalog.cache_clear()


def test_the_starters_request_is_the_first_steps_request():
    """ADR 021l: the attempt's input names the step whose request the Starter
    sent (`Sent`); the story shows it requested when the attempt began, with
    the attempt's deadline, and its reply answers it."""
    given = {"Sent": "reserve-inventory", "Deadline": "2026-12-07T10:01:00Z", "Payload": {}}
    walk = story._Walk()
    walk.event(
        {
            "EventType": "ExecutionStarted",
            "Timestamp": "2026-12-07T10:00:00Z",
            "FunctionName": "order_workflow",
            "Input": json.dumps(json.dumps(given)),  # as the Python client posts it
        }
    )
    walk.event(
        {
            "EventType": "EventRaised",
            "Timestamp": "2026-12-07T10:00:01Z",
            "Name": "reply-reserve-inventory-1",
            "Input": json.dumps(
                json.dumps({"Outcome": "ok", "Result": {"Reference": "inventory-reserve-1"}})
            ),
        }
    )
    (call,) = walk.calls
    assert (call.step, call.action) == ("reserve-inventory", "do")
    assert call.requested_at is not None
    assert call.requested_at.isoformat().startswith("2026-12-07T10:00:00")
    assert call.deadline is not None
    assert call.deadline.isoformat().startswith("2026-12-07T10:01")
    texts = [e.text for e in walk.events]
    assert texts[:2] == ["attempt began", "reserve inventory: requested"]
    assert texts[2].startswith("reserve inventory: done (inventory-reserve-1) after 1")
    assert "Payload" not in (walk.events[1].raw or "")  # the order's data is not shown
