"""Each step's effect at its service, from the agents' recorded answers call
by call (console.effects), on the histories recorded from the local stack
(tests/console/histories, see test_timeline.py): applied, refused with the
service's reason, undone, undo refused with its reason, not called, in
flight, and unknown only when no answer came back; each step's own times
(those of the reply that decided it, as the timeline shows them); and the
one line of what is still held at the services."""

from __future__ import annotations

import json
from pathlib import Path

from console import effects
from console import timeline as story
from domain.ids import parse_attempt_instance_id
from domain.models import OrderState, ProcessState, StepState, StepStatus

HERE = Path(__file__).parent / "histories"


def _load(
    name: str,
    attempts: set[int] | None = None,
    cut: int | None = None,
    unasked: tuple[str, ...] = (),
    marked: tuple[str, ...] = (),
    **record_update,
):
    """A recorded order as it stood earlier: only `attempts` of its statuses,
    the last one's history cut after `cut` events, the record changed by
    `record_update`, its `unasked` steps not started yet and its `marked` ones
    Running in its attempt, as a claim marks the steps it plans."""
    data = json.loads((HERE / f"{name}.json").read_text())
    record = OrderState.model_validate(data["record"])
    claimed = StepState(
        Status=StepStatus.RUNNING, Attempt=record.Attempt, StartedAt=record.CreatedAt
    )
    steps = {
        n: (StepState() if n in unasked else claimed if n in marked else s)
        for n, s in record.Steps.items()
    }
    record = record.model_copy(update={**record_update, "Steps": steps})
    statuses = {}
    for iid, st in data["statuses"].items():
        n = parse_attempt_instance_id(iid)[1]
        if attempts is not None and n not in attempts:
            continue
        statuses[n] = {
            "instance": iid,
            "runtime_status": st.get("runtimeStatus"),
            "output": st.get("output"),
            "history": st.get("historyEvents"),
        }
    if cut is not None:
        last = statuses[max(statuses)]
        last["history"] = last["history"][:cut]
        last["runtime_status"] = "Running"
    attempts_shown = story.timeline(record, statuses)
    found = effects.side_effects(record, attempts_shown)
    return record, attempts_shown, {e["step"]: e for e in found}


def _reply_times(attempt: dict, step_label: str) -> list:
    """When the timeline shows `step_label`'s replies and requests."""
    return [e.at for e in attempt["events"] if e.text.startswith(step_label)]


def test_a_declined_charge_is_refused_with_the_services_reason_and_nothing_is_held():
    record, _, found = _load("declined")
    assert {s: e["state"] for s, e in found.items()} == {
        "reserve-inventory": "undone",
        "charge-payment": "refused",
        "arrange-shipment": "not called",
    }
    assert "HTTP 422: card declined" in found["charge-payment"]["detail"]
    assert found["reserve-inventory"]["undo_answered"] is not None
    assert effects.still_held(record, list(found.values()))["text"] == (
        "Nothing is held at the services."
    )


def test_each_step_has_its_own_times_those_of_its_request_and_reply():
    """Issue 45 item 2: the three steps of a Processed order showed the same
    start and end; each now shows its own request and answer."""
    record, attempts, found = _load("agentretry")
    (attempt,) = attempts[1:]
    starts = {e["started"] for e in found.values()}
    assert len(starts) == 3
    for step, label in (
        ("reserve-inventory", "reserve inventory"),
        ("charge-payment", "charge payment"),
        ("arrange-shipment", "arrange shipping"),
    ):
        requested, answered = _reply_times(attempt, label)
        e = found[step]
        assert (e["started"], e["completed"]) == (requested, answered), step
        assert e["took"] == story.duration((answered - requested).total_seconds())
    # the agent retried the charge: its time is the whole call, 1.2 s, not the order's
    assert found["charge-payment"]["took"].endswith(" s")
    assert found["arrange-shipment"]["took"].endswith(" ms")
    assert effects.still_held(record, list(found.values())) is None  # Processed


def test_a_refused_undo_is_said_with_its_reason_and_the_effect_is_still_held():
    """Issue 45 item 1: a refused undo read "unknown"; it is "undo refused"
    with the service's reason, and the line at the top says it is held."""
    record, _, found = _load(
        "compfail", attempts={1}, ProcessState=ProcessState.COMPENSATION_FAILED
    )
    reserve = found["reserve-inventory"]
    assert reserve["state"] == "undo refused"
    assert reserve["tone"] == "bad"
    assert reserve["detail"]  # the service's reason
    assert found["charge-payment"]["state"] == "refused"
    held = effects.still_held(record, list(found.values()))
    assert held == {
        "text": "Still held: reserve inventory (release inventory refused).",
        "tone": "warn",
    }
    # once an operator's later compensation released it: undone
    _, _, after = _load("compfail")
    assert after["reserve-inventory"]["state"] == "undone"


def test_unknown_only_when_no_clear_answer_came_back():
    """The first attempt of `retried`: the agent gave up on transient
    failures at the reservation, so nobody knows; the others were never asked."""
    record, _, found = _load(
        "retried",
        attempts={1},
        unasked=("charge-payment", "arrange-shipment"),
        ProcessState=ProcessState.PENDING,
    )
    assert found["reserve-inventory"]["state"] == "unknown"
    assert "gave up" in found["reserve-inventory"]["detail"]
    assert found["charge-payment"]["state"] == "not called"
    assert found["arrange-shipment"]["state"] == "not called"
    held = effects.still_held(record, list(found.values()))
    assert held["text"] == "Perhaps held (no clear answer): reserve inventory."
    # the second attempt's answer settles it
    _, _, found = _load("retried")
    assert {e["state"] for e in found.values()} == {"applied"}


def test_a_step_answered_in_a_running_attempt_is_applied_and_the_next_in_flight():
    """A step that finished read "in progress" while its attempt ran: its
    answer decides, and only the step still awaiting one is in flight."""
    data = json.loads((HERE / "agentretry.json").read_text())
    (history,) = (st["historyEvents"] for st in data["statuses"].values())
    # up to the charge's request: the reservation answered, the charge asked
    cut = next(
        i + 1
        for i, ev in enumerate(history)
        if ev.get("FunctionName") == "send_step" and "charge-payment" in str(ev.get("Input"))
    )
    record, _, found = _load(
        "agentretry",
        cut=cut,
        marked=("arrange-shipment",),  # the claim marked it; the history never asked it
        ProcessState=ProcessState.PROCESSING,
    )
    assert found["reserve-inventory"]["state"] == "applied"
    assert found["charge-payment"]["state"] == "in flight"
    assert found["arrange-shipment"]["state"] == "not called"
    assert found["arrange-shipment"]["started"] is None  # not the claim's time
    held = effects.still_held(record, list(found.values()))
    assert held["text"] == "Still held: reserve inventory; in flight: charge payment."


def test_without_history_the_record_decides():
    record, _, found = _load("declined", attempts=set())
    assert found["charge-payment"]["state"] == "refused"
    assert found["arrange-shipment"]["state"] == "not called"
    assert found["reserve-inventory"]["state"] == "undone"
    assert found["reserve-inventory"]["started"] == record.Steps["reserve-inventory"].StartedAt
