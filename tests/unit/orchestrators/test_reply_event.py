"""The reply event (orchestrators.contracts.ReplyEvent, docs/adr/021h-slim-reply-event.md):
the bridge raises an agent's answer without its identity, and every workflow
version reads both that and the full AgentReply it was recorded with.

- every recorded history of the corpus, its raised replies rewritten to what
  the bridge raises now, replays to exactly what the host recorded;
- no version's file reads anything but Outcome, Error and Result of a reply
  (what `reply_from_event` returns is typed AgentReply for the frozen files);
- the full reply (recorded histories, an older bridge, the inline step's
  result) is validated as before; the event is validated closed."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from domain.models import AgentCall, AgentReply
from orchestrators.contracts import ReplyEvent, event_payload, read_reply, reply_from_event
from tests.unit.orchestrators.test_history_corpus import (
    _instances,
    orchestrator,  # noqa: F401 - the fixture
)

WORKFLOWS = [Path(__file__).resolve().parents[3] / "orchestrators" / "order_workflow.py"]
EVENT_RAISED = 15
ANSWER_FIELDS = {"Outcome", "Error", "Result"}


def _reply(**over: Any) -> AgentReply:
    fields: dict[str, Any] = {
        "InstanceId": "webshop:A1:1",
        "OrderID": "webshop:A1",
        "Step": "charge-payment",
        "Attempt": 1,
        "AppId": "webshop",
        "EventName": "reply-charge-payment-1",
        "EventId": "webshop:A1:1/reply-charge-payment-1/reply",
        "Outcome": "ok",
        "Result": {
            "Reference": "payment-charge-000004",
            "Status": "charged",
            "OrderID": "webshop:A1",
            "Step": "charge-payment",
            "Operation": "payment/charge",
            "FencingToken": 1,
        },
        "Calls": [AgentCall(At="2026-12-01T21:07:51.692258Z", Ms=58, Outcome="ok")],
        "ReplyToken": "v1.k.token",
        "Signature": "v1.k.sig",
    }
    return AgentReply(**{**fields, **over})


# --- what the bridge raises ---------------------------------------------------------------


def test_the_event_is_the_answer_without_identity_seal_or_echo():
    payload = event_payload(_reply())
    # One call that answered ok is the reply itself: no call record (ADR 017d).
    assert payload == {"Outcome": "ok", "Result": {"Reference": "payment-charge-000004"}}
    assert json.loads(json.dumps(payload)) == payload  # what the SDK posts


def test_an_ok_reply_after_retries_keeps_its_call_record():
    calls = [
        {"At": "2026-12-01T21:07:50.100000Z", "Ms": 250, "Outcome": "transient"},
        {"At": "2026-12-01T21:07:51.692258Z", "Ms": 58, "Outcome": "ok"},
    ]
    assert event_payload(_reply(Calls=calls))["Calls"] == calls


def test_an_undos_event_keeps_the_status_the_console_reads():
    undo = _reply(
        Action="undo",
        EventName="reply-charge-payment-undo-0-1",
        Result={
            "Status": "nothing-to-undo",
            "OrderID": "webshop:A1",
            "Operation": "payment/refund",
        },
        Calls=None,
    )
    assert event_payload(undo) == {"Outcome": "ok", "Result": {"Status": "nothing-to-undo"}}


def test_a_failures_event_keeps_its_error_and_a_result_of_echoes_only_is_left_out():
    failed = _reply(Outcome="permanent", Error="card declined", Result={"OrderID": "webshop:A1"})
    assert event_payload(failed) == {
        "Outcome": "permanent",
        "Error": "card declined",
        "Calls": [{"At": "2026-12-01T21:07:51.692258Z", "Ms": 58, "Outcome": "ok"}],
    }


# --- what every workflow reads ------------------------------------------------------------


@pytest.mark.parametrize("encode", [lambda d: d, json.dumps], ids=["dict", "json"])
def test_the_event_reads_as_the_answer_it_carries(encode):
    reply = _reply(Outcome="transient", Error="timeout", Result=None)
    read = reply_from_event(encode(event_payload(reply)))
    assert isinstance(read, ReplyEvent)
    assert (read.Outcome, read.Error, read.Result) == (reply.Outcome, reply.Error, reply.Result)
    assert read.Calls == reply.Calls
    with pytest.raises(AttributeError):
        read.Step  # noqa: B018 - an identity field a workflow reached for fails loudly


@pytest.mark.parametrize(
    "encode",
    [
        lambda r: r.model_dump(mode="json"),  # an older bridge; the inline step's result
        lambda r: r.model_dump_json(exclude={"ReplyToken", "Signature"}, exclude_none=True),
    ],
    ids=["dict", "json"],
)
def test_the_full_reply_reads_as_before(encode):
    reply = _reply()
    read = read_reply(encode(reply))
    assert isinstance(read, AgentReply)
    assert read.model_dump(exclude={"ReplyToken", "Signature"}) == reply.model_dump(
        exclude={"ReplyToken", "Signature"}
    )


def test_a_full_reply_is_validated_as_before():
    bad = _reply().model_dump(mode="json") | {"Attempt": 0}
    with pytest.raises(ValidationError, match="Attempt"):
        reply_from_event(bad)
    with pytest.raises(ValidationError, match="InstanceId"):
        reply_from_event(json.dumps(bad | {"InstanceId": ""}))


@pytest.mark.parametrize(
    ("event", "says"),
    [
        ({"Outcome": "transient"}, "must say why in Error"),
        ({"Outcome": "maybe"}, "Outcome"),
        ({"Outcome": "ok", "Step": "charge-payment"}, "Extra inputs"),  # half an identity
        ({"Result": {"Reference": "r"}}, "Outcome"),
        ({"Outcome": "ok", "Calls": [{"At": "yesterday", "Ms": 1, "Outcome": "ok"}]}, "At"),
    ],
)
def test_a_malformed_event_fails_loudly(event, says):
    with pytest.raises(ValidationError, match=says):
        reply_from_event(event)


def _reply_names(tree: ast.Module) -> set[str]:
    """The functions of a workflow file that return what reply_from_event
    returned (directly, or through another such function)."""
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    found = {"reply_from_event"}
    while True:
        more = {
            f.name
            for f in functions
            if f.name not in found
            and any(
                isinstance(r, ast.Return)
                and r.value is not None
                and any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in found
                    for c in ast.walk(r.value)
                )
                for r in ast.walk(f)
            )
        }
        if not more:
            return found
        found |= more


def _reads_of_replies(path: Path) -> tuple[set[str], list[str]]:
    """(the attributes read of every variable that holds a reply, every other
    use of such a variable that is not `is None`/`is not None` or a return)."""
    tree = ast.parse(path.read_text())
    producers = _reply_names(tree)
    attributes: set[str] = set()
    other: list[str] = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        held = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                value = node.value.value if isinstance(node.value, ast.YieldFrom) else node.value
                if (
                    isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Name)
                    and value.func.id in producers
                    and isinstance(node.targets[0], ast.Name)
                ):
                    held.add(node.targets[0].id)
        if not held:
            continue
        parents = {
            child: parent for parent in ast.walk(fn) for child in ast.iter_child_nodes(parent)
        }
        for node in ast.walk(fn):
            if not (
                isinstance(node, ast.Name) and node.id in held and isinstance(node.ctx, ast.Load)
            ):
                continue
            parent = parents[node]
            if isinstance(parent, ast.Attribute):
                attributes.add(parent.attr)
            elif isinstance(parent, ast.Compare) and all(
                isinstance(op, ast.Is | ast.IsNot) for op in parent.ops
            ):
                pass
            elif isinstance(parent, ast.Return):
                pass  # handed on: the caller is checked as a producer
            else:
                other.append(f"{fn.name}:{node.lineno} {ast.unparse(parent)}")
    return attributes, other


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_the_workflow_reads_no_more_of_a_reply_than_the_event_has(path):
    attributes, other = _reads_of_replies(path)
    assert attributes, f"{path.name}: no reply read found (has the file changed shape?)"
    assert attributes <= ANSWER_FIELDS, sorted(attributes - ANSWER_FIELDS)
    assert other == []


def test_the_check_sees_a_read_of_an_identity_field(tmp_path):
    """The check above can fail: a workflow that reads `reply.Step` is caught."""
    source = WORKFLOWS[-1].read_text()
    marker = 'done[step.Name] = (reply.Result or {}).get("Reference")'
    assert marker in source
    changed = tmp_path / "workflow_changed.py"
    changed.write_text(source.replace(marker, f"{marker}\n        _ = reply.Step"))
    attributes, _ = _reads_of_replies(changed)
    assert "Step" in attributes


# --- the corpus, with the replies as the bridge raises them now ---------------------------


def _raised(instance: dict[str, Any]) -> list[tuple[dict[str, Any], Any, bool]]:
    """Each raised reply of `instance`: (event, what it carries, whether the
    host stored it encoded twice, as the SDK's client posts it)."""
    out = []
    for event in instance["history"]:
        if event["EventType"] != EVENT_RAISED or event.get("Input") is None:
            continue
        stored = json.loads(event["Input"])
        twice = isinstance(stored, str)
        out.append((event, json.loads(stored) if twice else stored, twice))
    return out


def _full(data: Any) -> bool:
    """A raised reply as bridges before ADR 021h raised it (the whole reply)."""
    return isinstance(data, dict) and "InstanceId" in data


def test_the_corpus_holds_replies_as_the_bridge_raises_them():
    """Every recorded reply is the slim event (ADR 021h), encoded twice as
    the SDK's client posts it."""
    raised = [r for p in _instances() for r in _raised(p.values[0])]
    assert raised
    assert not any(_full(data) for _, data, _ in raised)
    assert all(twice for _, _, twice in raised)
