"""Route templates and the showHistory conversion: pure logic, in-process."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devstack.host import HostError, http_api
from devstack.host.app import FunctionSpec
from devstack.host.http_api import public_history
from devstack.host.http_triggers import compile_route, routing_path


def spec(route: str | None, name: str = "f", methods: list[str] | None = None) -> FunctionSpec:
    trigger: dict[str, Any] = {"type": "httpTrigger", "name": "req", "route": route}
    if methods:
        trigger["methods"] = methods
    return FunctionSpec(
        name=name,
        trigger_type="httpTrigger",
        trigger=trigger,
        bindings=[trigger],
        func=lambda req: None,
        is_async=False,
    )


@pytest.mark.parametrize(
    ("template", "path", "expected"),
    [
        ("items/{id:int}", "/api/items/12", {"id": "12"}),
        ("items/{id:int}", "/api/items/x", None),
        ("items/{id?}", "/api/items", {}),
        ("items/{id?}", "/api/items/7", {"id": "7"}),
        ("items/{kind=all}", "/api/items", {"kind": "all"}),
        ("items/{kind=all}", "/api/items/new", {"kind": "new"}),
        ("files/{*rest}", "/api/files/a/b", {"rest": "a/b"}),
        ("files/{**rest}", "/api/files", {}),
        ("v{major:int}/status", "/api/v2/status", {"major": "2"}),
        (
            "Orders/{id:guid}",
            "/api/orders/0f8fad5b-d9cb-469f-a165-70867728950e",
            {"id": "0f8fad5b-d9cb-469f-a165-70867728950e"},
        ),
        (None, "/api/f", {}),
        ("items", "/api/items/extra", None),
    ],
)
def test_route_templates(template: str | None, path: str, expected: dict[str, str] | None) -> None:
    assert compile_route(spec(template), "api").match(path) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/api/orders/a%2Fb", "/api/orders/a%2Fb"),
        ("/api/orders/a%2fb", "/api/orders/a%2fb"),
        ("/api/caf%C3%A9/a%20b", "/api/café/a b"),
        ("/api/x%252F", "/api/x%2F"),  # decoded once: the %25 only
        ("/api/%2F%2F/%41", "/api/%2F%2F/A"),
    ],
)
def test_the_routing_path_keeps_encoded_slashes(raw: str, expected: str) -> None:
    assert routing_path(raw) == expected


def test_an_encoded_slash_does_not_separate_segments() -> None:
    assert compile_route(spec("orders/{id}"), "api").match(routing_path("/api/orders/a%2Fb")) == {
        "id": "a%2Fb"
    }
    assert (
        compile_route(spec("orders/{id}/{part}"), "api").match(routing_path("/api/orders/a%2Fb"))
        is None
    )


def test_app_settings_in_routes_are_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERS_ROUTE", "orders")
    assert compile_route(spec("%ORDERS_ROUTE%/{id}"), "api").match("/api/orders/4") == {"id": "4"}
    monkeypatch.delenv("ORDERS_ROUTE")
    with pytest.raises(HostError, match="ORDERS_ROUTE"):
        compile_route(spec("%ORDERS_ROUTE%/{id}"), "api")


def test_an_empty_prefix_and_a_catch_all_in_the_middle() -> None:
    assert compile_route(spec("x/{id}"), "").match("/x/1") == {"id": "1"}
    with pytest.raises(HostError, match="catch-all"):
        compile_route(spec("{*rest}/tail"), "api")


def test_history_is_shown_as_the_extension_shows_it() -> None:
    t = "2026-01-01T00:00:00.000000Z"
    raw = [
        {"EventType": 12, "EventId": -1, "IsPlayed": False, "Timestamp": t},
        {
            "EventType": 0,
            "EventId": -1,
            "Timestamp": t,
            "Name": "orch",
            "Version": "",
            "Input": "1",
            "OrchestrationInstance": {"InstanceId": "i"},
        },
        {"EventType": 4, "EventId": 0, "Timestamp": "S0", "Name": "act", "Input": '"a"'},
        {
            "EventType": 7,
            "EventId": 1,
            "Timestamp": "S1",
            "Name": "child",
            "InstanceId": "i:1",
            "Input": None,
        },
        {"EventType": 13, "EventId": -1, "Timestamp": t},
        {"EventType": 12, "EventId": -1, "Timestamp": t},
        {
            "EventType": 6,
            "EventId": -1,
            "Timestamp": t,
            "TaskScheduledId": 0,
            "Reason": "boom",
            "Details": "tb",
        },
        {"EventType": 8, "EventId": -1, "Timestamp": t, "TaskScheduledId": 1, "Result": '{"x": 1}'},
        {"EventType": 11, "EventId": -1, "Timestamp": t, "TimerId": 2, "FireAt": t},
        {
            "EventType": 1,
            "EventId": -1,
            "Timestamp": t,
            "OrchestrationStatus": "Completed",
            "Result": "[1]",
        },
    ]
    shown = public_history(raw, show_output=True, show_input=True)
    assert [e["EventType"] for e in shown] == [
        "ExecutionStarted",
        "TaskFailed",
        "SubOrchestrationInstanceCompleted",
        "TimerFired",
        "ExecutionCompleted",
    ]
    assert shown[0] == {
        "EventType": "ExecutionStarted",
        "Timestamp": t,
        "FunctionName": "orch",
        "Input": "1",
    }
    assert shown[1] == {
        "EventType": "TaskFailed",
        "Timestamp": t,
        "Reason": "boom",
        "Details": "tb",
        "ScheduledTime": "S0",
        "FunctionName": "act",
        "Input": '"a"',
    }
    assert shown[2]["FunctionName"] == "child"
    assert shown[2]["Result"] == {"x": 1}
    assert "TimerId" not in shown[3]
    assert shown[4]["Result"] == [1]
    hidden = public_history(raw, show_output=False, show_input=False)
    assert not any("Result" in e or "Input" in e for e in hidden)
    assert raw[2]["EventType"] == 4  # the stored events are not changed


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ('{"ok": true}', True),
        ('"plain text"', True),
        ("NaN", True),  # json reads it, orjson does not
        (str(2**70), True),  # past 64 bits: json only
        ("{", False),
        ("", False),
        ("{'single': 'quotes'}", False),
    ],
)
def test_a_raised_events_body_is_checked_as_json_reads_it(text: str, valid: bool) -> None:
    assert http_api._is_json(text) is valid
    try:
        json.loads(text)
    except json.JSONDecodeError:
        assert not valid
    else:
        assert valid
