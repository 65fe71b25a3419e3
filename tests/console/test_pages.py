"""Pages rendered from records in the real Cosmos server: the timeline of an
order's attempts, escaping of everything a client or provider sent, and no
payment data. The durable client is a fake behind the SDK's own status type
(the host's answer is tested in tests/e2e/test_console_browser.py)."""

from __future__ import annotations

import json
from datetime import timedelta

import azure.functions as func
import pytest
from azure.durable_functions.models.DurableOrchestrationStatus import DurableOrchestrationStatus

from console import views
from domain import state_machine as sm
from domain.models import ProcessState
from tests.builders import start_step
from tests.console.conftest import POLICY, STEPS, errored_by_supervisor, instance, order, pending
from triggers.console import _render

HOSTILE = '<img src=x onerror="alert(1)">'


class FakeDurableClient:
    def __init__(self, statuses: dict[str, dict]) -> None:
        self.statuses = statuses
        self.asked: list[tuple[str, bool]] = []

    async def get_status(self, instance_id: str, show_history: bool = False, **_):
        self.asked.append((instance_id, show_history))
        return DurableOrchestrationStatus.from_json(self.statuses.get(instance_id, {}))


def _status(instance_id: str, at: str, events: list[dict]) -> dict:
    return {
        "name": "order_workflow",
        "instanceId": instance_id,
        "runtimeStatus": "Completed",
        "createdTime": at,
        "lastUpdatedTime": at,
        "output": {"Outcome": "timed_out", "Detail": f"provider said {HOSTILE}"},
        "historyEvents": events,
    }


def _request(path: str) -> func.HttpRequest:
    return func.HttpRequest(
        method="GET",
        url=f"http://127.0.0.1:7071/api/console{path}",
        headers={},
        params={},
        route_params={},
        body=b"",
    )


def _two_attempts_then_failed(now):
    record = pending("T-1", now)
    record = sm.claim(record, now, POLICY)
    t1 = record.CompleteBy + timedelta(seconds=1)
    record = sm.recover_expired(record, record.LockedBy, t1, POLICY)
    record = sm.claim(record, t1, POLICY)
    owner = record.LockedBy
    record = start_step(record, STEPS[0], t1, t1 + timedelta(seconds=30))
    return sm.mark_failed(
        record, owner, STEPS[0], f"provider refused: {HOSTILE}", t1 + timedelta(seconds=2)
    )


async def test_order_timeline_shows_each_attempt_and_escapes_what_providers_sent(deps, now):
    record = _two_attempts_then_failed(now)
    await deps.store.create_if_absent(record)
    await deps.orders.store(order("T-1"), "T-1")  # keyed as the record is
    reply = json.dumps(
        json.dumps(
            {
                "Step": STEPS[0],
                "Outcome": "permanent",
                "Error": HOSTILE,
                "Result": {"PaymentReference": "pay-ref-42"},
            }
        )
    )
    deps.durable = FakeDurableClient(
        {
            instance("T-1", 1): _status(
                instance("T-1", 1),
                now.isoformat(),
                [
                    {"EventType": "ExecutionStarted", "Timestamp": now.isoformat()},
                    {
                        "EventType": "TaskCompleted",
                        "Timestamp": now.isoformat(),
                        "FunctionName": "send_step",
                        "Input": json.dumps({"Step": STEPS[0], "Deadline": "2026-01-01T00:00:00Z"}),
                    },
                    {
                        "EventType": "TimerCreated",
                        "Timestamp": now.isoformat(),
                        "FireAt": "2026-01-01T00:00:00Z",
                    },
                    {
                        "EventType": "TimerFired",
                        "Timestamp": (now + timedelta(seconds=60)).isoformat(),
                        "FireAt": "2026-01-01T00:00:00Z",
                    },
                ],
            ),
            instance("T-1", 2): _status(
                instance("T-1", 2),
                now.isoformat(),
                [
                    {
                        "EventType": "TaskCompleted",
                        "Timestamp": (now + timedelta(seconds=62)).isoformat(),
                        "FunctionName": "send_agent_request",
                        "Input": json.dumps(
                            {"Step": STEPS[0], "Payload": {"PaymentReference": "pay-ref-42"}}
                        ),
                    },
                    {
                        "EventType": "EventRaised",
                        "Timestamp": (now + timedelta(seconds=63)).isoformat(),
                        "Name": "reply-reserve-inventory-2",
                        "Input": reply,
                    },
                ],
            ),
        }
    )
    data = await views.order_detail(deps, "T-1")
    assert [a["attempt"] for a in data["attempts"]] == [0, 1, 2]
    assert deps.durable.asked == [(instance("T-1", 1), True), (instance("T-1", 2), True)]
    first = [e.text for e in data["attempts"][1]["events"]]
    assert any(t.startswith("Supervisor: attempt 1 missed its deadline") for t in first), first
    assert "reserve inventory: no answer by its deadline: deadline missed" in first
    second = data["attempts"][2]["events"]
    (refused,) = [e for e in second if e.kind == "reply"]
    assert refused.text.startswith("reserve inventory: refused (permanent)")
    assert refused.detail is not None
    assert HOSTILE in refused.detail
    assert data["can_resubmit"]
    assert data["can_compensate"]

    html = (
        _render(_request("/orders/T-1"), "order.html", deps, page="orders", done=None, **data)
        .get_body()
        .decode()
    )
    assert HOSTILE not in html
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in html
    assert "pay-ref-42" not in html
    assert "PaymentReference" not in html
    assert 'id="attempt-2"' in html
    assert "Resubmit" in html


async def test_unknown_and_malformed_ids_are_not_found(deps):
    assert await views.order_detail(deps, "NOPE-1") is None
    assert await views.order_detail(deps, HOSTILE) is None
    html = (
        _render(
            _request("/orders/x"),
            "error.html",
            None,
            status=404,
            message=f"No order {HOSTILE}",
            status_code=404,
        )
        .get_body()
        .decode()
    )
    assert HOSTILE not in html
    assert "No order &lt;img" in html


async def test_compensate_is_recorded_with_who_asked(deps, now):
    record = _two_attempts_then_failed(now)
    await deps.store.create_if_absent(record)
    updated = await views.act(deps, "T-1", "compensate", "local", "customer cancelled")
    assert updated.CompensationRequested
    assert updated.ProcessState is ProcessState.ERROR
    assert updated.History[-1].By == "operator:local"
    assert updated.History[-1].Reason == "compensation requested: customer cancelled"
    data = await views.order_detail(deps, "T-1")
    assert not data["can_compensate"]  # asked already: the Starter will run it


async def test_resubmit_refuses_an_order_not_in_error(deps, now):
    await deps.store.create_if_absent(pending("T-2", now))
    try:
        await views.act(deps, "T-2", "resubmit", "local", "try again")
    except sm.IllegalTransition:
        pass
    else:
        raise AssertionError("resubmitting a Pending order must be refused")
    stored, _ = await deps.store.read("T-2")
    assert stored.ProcessState is ProcessState.PENDING
    assert len(stored.History) == 1


def test_throughput_buckets_the_last_hour(now):
    since = now - timedelta(hours=1)
    data = views._throughput(
        [
            ("Processed", now - timedelta(minutes=1)),
            ("Error", now - timedelta(minutes=1)),
            ("Processed", since + timedelta(minutes=2)),
            ("Processed", since - timedelta(1)),
            ("Compensated", now - timedelta(minutes=1)),
            ("CompensationFailed", since + timedelta(minutes=2)),
        ],
        since,
        now,
    )
    assert len(data["buckets"]) == 12
    # issue 45: the compensated and the compensation-failed orders are counted too
    assert data["total"] == {
        "Processed": 2,
        "Compensated": 1,
        "Error": 1,
        "CompensationFailed": 1,
    }
    assert (data["buckets"][0]["Processed"], data["buckets"][-1]["Error"]) == (1, 1)
    last = {bar["state"]: bar for bar in data["buckets"][-1]["bars"]}
    # stacked: each state's bar sits on the one below it
    assert last["Compensated"]["y"] + last["Compensated"]["h"] == pytest.approx(
        last["Processed"]["y"]
    )


PANS = [
    "4111 1111 1111 1111",
    "5500-0000-0000-0004",
    "378282246310005",
    "6759649826438453",
    "5019 7170 1010 3742",
]


async def test_card_numbers_in_provider_text_are_masked_on_every_page_field(deps, now):
    """LastError, History reasons, compensation errors and orchestration
    events carry provider text: a card number in them is masked wherever the
    order page shows them, alongside hostile markup."""
    from domain.models import CompensationEntry

    said = f"provider said: card {PANS[0]} declined {HOSTILE} (retry with {PANS[1]})"
    record = pending("PAN-1", now)
    record = sm.claim(record, now, POLICY)
    owner = record.LockedBy
    record = start_step(record, STEPS[0], now, now + timedelta(seconds=30))
    record = sm.mark_failed(record, owner, STEPS[0], said, now + timedelta(seconds=1))
    # The state machine masks provider text now; a record written before that
    # still holds the numbers, and the console must mask them itself.
    last = record.History[-1].model_copy(update={"Reason": said})
    record = record.model_copy(update={"LastError": said, "History": [*record.History[:-1], last]})
    assert PANS[0] in record.LastError
    assert any(PANS[0] in (h.Reason or "") for h in record.History)
    record = record.model_copy(
        update={
            "Compensation": [
                CompensationEntry(
                    Step=STEPS[0],
                    Outcome="Failed",
                    At=now + timedelta(seconds=2),
                    Error=f"refund refused for {PANS[2]}; contact {PANS[3]}",
                ),
                CompensationEntry(
                    Step=STEPS[1], Outcome="Failed", At=now + timedelta(seconds=3), Error=PANS[4]
                ),
            ]
        }
    )
    await deps.store.create_if_absent(record)
    deps.durable = FakeDurableClient(
        {
            instance("PAN-1", 1): _status(
                instance("PAN-1", 1),
                now.isoformat(),
                [
                    {
                        "EventType": "TaskFailed",
                        "Timestamp": now.isoformat(),
                        "FunctionName": "run_step",
                        "Reason": f"card {PANS[0]}",
                    }
                ],
            )
        }
    )
    data = await views.order_detail(deps, "PAN-1")
    html = (
        _render(_request("/orders/PAN-1"), "order.html", deps, page="orders", done=None, **data)
        .get_body()
        .decode()
    )
    digits = "".join(ch for ch in html if ch.isdigit() or ch in " -\n<>")
    for pan in PANS:
        assert pan not in html, pan
        assert pan.replace(" ", "").replace("-", "") not in digits.replace(" ", "").replace(
            "-", ""
        ), pan
    assert html.count("[redacted]") >= 7
    assert 'id="last-error">provider said: card [redacted] declined' in html
    assert "&lt;img src=x" in html
    assert HOSTILE not in html
    assert 'id="order-id">PAN-1<' in html


async def test_an_order_id_that_looks_like_a_card_is_masked_as_text_but_still_links(deps, now):
    stored = pending("4111111111111111", now)
    html = (
        _render(
            _request("/orders/4111111111111111"),
            "order.html",
            deps,
            page="orders",
            done=None,
            record=stored,
            order=None,
            attempts=[],
            steps={},
            compensation=[],
            status_messages={
                "queue": "replies-webshop",
                "messages": [],
                "error": None,
                "local_only": True,
            },
            can_resubmit=True,
            can_compensate=False,
        )
        .get_body()
        .decode()
    )
    assert 'id="order-id">[redacted]<' in html
    assert '/api/console/orders/4111111111111111/resubmit"' in html


async def test_an_action_without_a_reason_is_refused_and_changes_nothing(deps, now):
    await deps.store.create_if_absent(errored_by_supervisor("T-3", now))
    for reason in ("", "  ", "ok", "x" * 201):
        with pytest.raises(views.BadRequest, match="reason"):
            await views.act(deps, "T-3", "resubmit", "local", reason)
    stored, _ = await deps.store.read("T-3")
    assert stored.ProcessState is ProcessState.ERROR
