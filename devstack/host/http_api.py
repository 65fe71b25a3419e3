"""The Durable extension's HTTP API on loopback, so `DurableOrchestrationClient` runs unchanged.

Routes, status codes and payloads follow the extension's HttpApiHandler: the client
binding JSON handed to functions points `rpcBaseUrl` here. `/admin/*` is ours: health
and the controllable clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from .clock import ENTITIES, Clock, ControllableClock
from .durable import DurableEngine
from .entities import scheduler_id
from .store import MISSING, TERMINAL, Instance

RPC_PREFIX = "/durabletask/"
WEBHOOK_PREFIX = "/runtime/webhooks/durabletask/"


_JSON_ONLY = "Only application/json request content is supported"


def _is_json(text: str) -> bool:
    """Whether `json.loads` would read `text`: orjson first (the usual event, valid JSON,
    for a fraction of the cost), `json` for what orjson alone refuses (NaN, integers past
    64 bits)."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            json.loads(text)
        except json.JSONDecodeError:
            return False
    return True


def client_binding(base: str, hub: str) -> dict[str, Any]:
    """The JSON the host passes for a `durable_client_input` parameter."""
    webhook = base + WEBHOOK_PREFIX
    q = f"taskHub={hub}&connection=Storage"
    inst = webhook + "instances/INSTANCEID"
    return {
        "taskHubName": hub,
        "creationUrls": {
            "createNewInstancePostUri": webhook
            + "orchestrators/{functionName}[/{instanceId}]?code=",
            "createAndWaitOnNewInstancePostUri": webhook
            + "orchestrators/{functionName}[/{instanceId}]?timeout={timeoutInSeconds}&pollingInterval={intervalInSeconds}",
        },
        "managementUrls": {
            "id": "INSTANCEID",
            "statusQueryGetUri": f"{inst}?{q}",
            "sendEventPostUri": f"{inst}/raiseEvent/{{eventName}}?{q}",
            "terminatePostUri": f"{inst}/terminate?reason={{text}}&{q}",
            "rewindPostUri": f"{inst}/rewind?reason={{text}}&{q}",
            "purgeHistoryDeleteUri": f"{inst}?{q}",
            "restartPostUri": f"{inst}/restart?{q}",
            "suspendPostUri": f"{inst}/suspend?reason={{text}}&{q}",
            "resumePostUri": f"{inst}/resume?reason={{text}}&{q}",
        },
        "baseUrl": base + WEBHOOK_PREFIX.rstrip("/"),
        "requiredQueryStringParameters": "",
        "rpcBaseUrl": base + RPC_PREFIX,
        "httpBaseUrl": "",
        "grpcBaseUrl": "",
    }


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _short(ts: str) -> str:
    return ts[:19] + "Z"


def status_payload(
    inst: Instance, *, show_input: bool = True, history: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": inst.name,
        "instanceId": inst.instance_id,
        "runtimeStatus": inst.status,
        "input": _loads(inst.input) if show_input else None,
        "customStatus": _loads(inst.custom_status),
        "output": _loads(inst.output),
        "createdTime": _short(inst.created_time),
        "lastUpdatedTime": _short(inst.last_updated_time),
    }
    if history is not None:
        body["historyEvents"] = history
    return body


# DTFx's EventType enum, by value: the extension writes the name into the status JSON.
EVENT_TYPE_NAMES = [
    "ExecutionStarted",
    "ExecutionCompleted",
    "ExecutionFailed",
    "ExecutionTerminated",
    "TaskScheduled",
    "TaskCompleted",
    "TaskFailed",
    "SubOrchestrationInstanceCreated",
    "SubOrchestrationInstanceCompleted",
    "SubOrchestrationInstanceFailed",
    "TimerCreated",
    "TimerFired",
    "OrchestratorStarted",
    "OrchestratorCompleted",
    "EventSent",
    "EventRaised",
    "ContinueAsNew",
    "GenericEvent",
    "HistoryState",
    "ExecutionSuspended",
    "ExecutionResumed",
]


def public_history(
    events: list[dict[str, Any]], *, show_output: bool, show_input: bool
) -> list[dict[str, Any]]:
    """The history as the extension's status API shows it (DurableClient.GetDurableOrchestrationStatusAsync).

    EventType becomes its name; each TaskScheduled/SubOrchestrationInstanceCreated is folded
    into its TaskCompleted/TaskFailed/SubOrchestrationInstance{Completed,Failed}, which gains
    FunctionName and ScheduledTime (and the Input, if shown); ExecutionStarted's Name becomes
    FunctionName; OrchestratorStarted/Completed are dropped; Result is shown, as JSON, only
    with showHistoryOutput; EventId and IsPlayed are dropped.
    """
    out: list[dict[str, Any]] = []
    scheduled: dict[str, tuple[int, dict[str, Any]]] = {}  # "<kind>_<EventId>" -> (index, event)
    drop: set[int] = set()
    for i, raw in enumerate(events):
        item = dict(raw)
        et = item.get("EventType")
        if not isinstance(et, int) or not 0 <= et < len(EVENT_TYPE_NAMES):
            out.append(item)
            continue
        name = EVENT_TYPE_NAMES[et]
        item["EventType"] = name
        if name in ("TaskScheduled", "SubOrchestrationInstanceCreated"):
            scheduled[f"{name}_{item.get('EventId')}"] = (i, item)
            item.pop("Version", None)
        elif name in (
            "TaskCompleted",
            "TaskFailed",
            "SubOrchestrationInstanceCompleted",
            "SubOrchestrationInstanceFailed",
        ):
            kind = "TaskScheduled" if name.startswith("Task") else "SubOrchestrationInstanceCreated"
            found = scheduled.get(f"{kind}_{item.get('TaskScheduledId')}")
            if found is not None:
                index, sched = found
                item["ScheduledTime"] = sched.get("Timestamp")
                item["FunctionName"] = sched.get("Name")
                if show_input:
                    item["Input"] = sched.get("Input")
                drop.add(index)
            item.pop("TaskScheduledId", None)
            _history_result(item, show_output and name.endswith("Completed"))
        elif name == "ExecutionStarted":
            item["FunctionName"] = item.pop("Name", None)
            for key in ("OrchestrationInstance", "ParentInstance", "Version", "Tags"):
                item.pop(key, None)
        elif name == "ExecutionCompleted":
            _history_result(item, show_output)
        elif name == "TimerFired":
            item.pop("TimerId", None)
        elif name in ("OrchestratorStarted", "OrchestratorCompleted"):
            drop.add(i)
        if not show_input:
            item.pop("Input", None)
        item.pop("EventId", None)
        item.pop("IsPlayed", None)
        out.append(item)
    return [e for i, e in enumerate(out) if i not in drop]


def _history_result(item: dict[str, Any], show: bool) -> None:
    if not show:
        item.pop("Result", None)
    elif "Result" in item:
        item["Result"] = _loads(item["Result"])


def _bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.lower() == "true"


def _time(value: str | None) -> float | None:
    if not value:
        return None
    text = value.replace("Z", "+00:00")
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _error(status: int, message: str, exception_message: str, exception_type: str) -> web.Response:
    return web.json_response(
        {
            "Message": message,
            "ExceptionMessage": exception_message,
            "ExceptionType": exception_type,
            "StackTrace": "",
        },
        status=status,
    )


class DurableHttpApi:
    def __init__(
        self,
        engine: DurableEngine,
        clock: Clock,
        base_url_ref: list[str],
        timers: Callable[[], list[dict[str, Any]]] = list,
        functions: Callable[[], list[dict[str, Any]]] = list,
    ) -> None:
        self.timers = timers
        self.functions = functions
        self.engine = engine
        self.clock = clock
        self._base = base_url_ref  # filled once the port is known

    def routes(self) -> list[web.RouteDef]:
        out: list[web.RouteDef] = []
        for prefix in (RPC_PREFIX, WEBHOOK_PREFIX):
            out += [
                web.post(prefix + "orchestrators/{name}", self.start),
                web.post(prefix + "orchestrators/{name}/{instance_id}", self.start),
                web.get(prefix + "instances/", self.query),
                web.get(prefix + "instances", self.query),
                web.delete(prefix + "instances/", self.purge_by),
                web.delete(prefix + "instances", self.purge_by),
                web.get(prefix + "instances/{instance_id}", self.get_status),
                web.delete(prefix + "instances/{instance_id}", self.purge),
                web.post(prefix + "instances/{instance_id}/terminate", self.terminate),
                web.post(prefix + "instances/{instance_id}/raiseEvent/{event}", self.raise_event),
                web.get(prefix + "entities/{name}/{key}", self.read_entity),
                web.post(prefix + "entities/{name}/{key}", self.signal_entity),
                web.post(prefix + "instances/{instance_id}/suspend", self.suspend),
                web.post(prefix + "instances/{instance_id}/resume", self.resume),
                web.post(prefix + "instances/{instance_id}/restart", self.restart),
                web.post(prefix + "instances/{instance_id}/rewind", self.rewind),
            ]
        out += [
            web.get("/admin/health", self.health),
            web.get("/admin/functions", self.get_functions),
            web.get("/admin/clock", self.get_clock),
            web.get("/admin/timers", self.get_timers),
            web.post("/admin/clock/advance", self.advance_clock),
            web.post("/admin/heartbeat/stall", self.stall_heartbeat),
        ]
        return out

    def _management(self, instance_id: str) -> dict[str, str]:
        binding = client_binding(self._base[0], self.engine.options.hub_name)
        return {
            k: v.replace("INSTANCEID", instance_id) for k, v in binding["managementUrls"].items()
        }

    async def start(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        instance_id = request.match_info.get("instance_id")
        raw = await request.text()
        input_json = raw if raw.strip() else None
        if input_json is not None:
            try:
                json.loads(input_json)
            except json.JSONDecodeError as exc:
                return _error(
                    400, "Invalid JSON content", str(exc), "Newtonsoft.Json.JsonReaderException"
                )
        result = await self.engine.start_new_batched(
            name, instance_id, input_json, request.query.get("version")
        )
        if result.not_found:
            return _error(
                400,
                "One or more of the arguments submitted is incorrect",
                result.error or "",
                "System.ArgumentException",
            )
        if not result.ok:
            return _error(
                500,
                "Something went wrong while processing your request",
                result.error or "",
                "System.InvalidOperationException",
            )
        payload = self._management(result.instance_id)
        return web.json_response(
            payload,
            status=202,
            headers={"Location": payload["statusQueryGetUri"], "Retry-After": "10"},
        )

    async def get_status(self, request: web.Request) -> web.Response:
        instance_id = request.match_info["instance_id"]
        inst = self.engine.store.get_instance(instance_id)
        if inst is None:
            return web.Response(status=404)
        show_history = _bool(request.query.get("showHistory"), False)
        show_input = _bool(request.query.get("showInput"), True)
        history = None
        if show_history and inst.status != "Pending":
            history = public_history(
                self.engine.store.history(instance_id),
                show_input=show_input,
                show_output=_bool(request.query.get("showHistoryOutput"), False),
            )
        body = status_payload(inst, show_input=show_input, history=history)
        if inst.status in ("Running", "Pending", "ContinuedAsNew", "Suspended"):
            # As the extension's HandleGetStatusRequestAsync: the request's own URL to poll.
            return web.json_response(
                body, status=202, headers={"Location": str(request.url), "Retry-After": "5"}
            )
        if inst.status == "Failed" and _bool(
            request.query.get("returnInternalServerErrorOnFailure"), False
        ):
            return web.json_response(body, status=500)
        return web.json_response(body, status=200)

    def _filters(self, request: web.Request) -> dict[str, Any]:
        statuses = [s for s in request.query.get("runtimeStatus", "").split(",") if s]
        return {
            "created_from": _time(request.query.get("createdTimeFrom")),
            "created_to": _time(request.query.get("createdTimeTo")),
            "statuses": statuses or None,
        }

    async def query(self, request: web.Request) -> web.Response:
        rows = self.engine.store.query_instances(
            prefix=request.query.get("instanceIdPrefix"), **self._filters(request)
        )
        # OrchestrationStatusQueryCondition.ShowInput is true unless the query says otherwise.
        show_input = _bool(request.query.get("showInput"), True)
        return web.json_response(
            [status_payload(r, show_input=show_input) for r in rows],
            headers={"x-ms-continuation-token": ""},
        )

    async def purge(self, request: web.Request) -> web.Response:
        instance_id = request.match_info["instance_id"]
        if self.engine.store.get_instance(instance_id) is None:
            return web.Response(status=404)
        return web.json_response({"instancesDeleted": self.engine.store.purge(instance_id)})

    async def purge_by(self, request: web.Request) -> web.Response:
        filters = self._filters(request)
        if filters["created_from"] is None:
            return web.json_response(
                "Please provide value for 'createdTimeFrom' parameter.", status=400
            )
        deleted = 0
        for inst in self.engine.store.query_instances(**filters):
            if inst.status in TERMINAL:
                deleted += self.engine.store.purge(inst.instance_id)
        if deleted == 0:
            return web.Response(status=404)
        return web.json_response({"instancesDeleted": deleted})

    async def terminate(self, request: web.Request) -> web.Response:
        instance_id = request.match_info["instance_id"]
        inst = self.engine.store.get_instance(instance_id)
        if inst is None:
            return web.Response(status=404)
        if inst.status in TERMINAL:
            return web.Response(status=410)
        self.engine.terminate(instance_id, request.query.get("reason"))
        return web.Response(status=202)

    async def suspend(self, request: web.Request) -> web.Response:
        return self._suspend_or_resume(request, self.engine.suspend)

    async def resume(self, request: web.Request) -> web.Response:
        return self._suspend_or_resume(request, self.engine.resume)

    def _suspend_or_resume(
        self, request: web.Request, action: Callable[[str, str | None], None]
    ) -> web.Response:
        instance_id = request.match_info["instance_id"]
        inst = self.engine.store.get_instance(instance_id)
        if inst is None:
            return web.Response(status=404)
        if inst.status in TERMINAL:
            return web.Response(status=410)
        action(instance_id, request.query.get("reason"))
        return web.Response(status=202)

    async def rewind(self, request: web.Request) -> web.Response:
        instance_id = request.match_info["instance_id"]
        inst = self.engine.store.get_instance(instance_id)
        if inst is None:
            return web.Response(status=404)
        if inst.status in ("Completed", "Terminated", "Canceled"):
            return web.Response(status=410)
        blocking = self.engine.rewind(instance_id, request.query.get("reason"))
        if blocking is not None:  # the extension's InvalidOperationException, unhandled: a 500
            return web.json_response(
                "The rewind operation is only supported on failed orchestration instances.",
                status=500,
            )
        return web.Response(status=202)

    async def restart(self, request: web.Request) -> web.Response:
        new_id = _bool(request.query.get("restartWithNewInstanceId"), True)
        result = self.engine.restart(request.match_info["instance_id"], new_id)
        if result is None:
            return _error(
                400,
                "InstanceId does not match a valid orchestration instance.",
                f"An orchestration with the instanceId {request.match_info['instance_id']} was not found.",
                "System.ArgumentException",
            )
        if not result.ok:
            return _error(
                500,
                "Something went wrong while processing your request",
                result.error or "",
                "System.InvalidOperationException",
            )
        payload = self._management(result.instance_id)
        return web.json_response(
            payload,
            status=202,
            headers={"Location": payload["statusQueryGetUri"], "Retry-After": "10"},
        )

    async def raise_event(self, request: web.Request) -> web.Response:
        """As the extension answers: 404 without the instance, 410 once it has ended, then
        400 for a body that is not JSON, else 202. A JSON body's instance is checked by the
        write of the event (`Store.write_turn`); another's, here, before its 400."""
        instance_id = request.match_info["instance_id"]
        json_type = request.content_type.lower() == "application/json"
        raw = await request.text() if json_type else ""
        if not json_type or not _is_json(raw):
            refused = self.engine.store.event_refusal(instance_id)
            if refused is None:
                message = "Invalid JSON content" if json_type else _JSON_ONLY
                return _error(400, message, "", "")
        else:
            refused = await self.engine.raise_event_batched(
                instance_id, request.match_info["event"], raw
            )
        if refused is None:
            return web.Response(status=202)
        return web.Response(status=404 if refused == MISSING else 410)

    async def read_entity(self, request: web.Request) -> web.Response:
        entity = self.engine.store.get_entity(
            scheduler_id(request.match_info["name"], request.match_info["key"])
        )
        if entity is None or not entity[0]:
            return web.Response(status=404)
        return web.Response(status=200, text=entity[1] or "null", content_type="application/json")

    async def signal_entity(self, request: web.Request) -> web.Response:
        operation = request.query.get("op")
        if not operation:
            return _error(
                400,
                "One or more of the arguments submitted is incorrect",
                "The 'op' query parameter is required",
                "System.ArgumentException",
            )
        name = request.match_info["name"]
        if name.lower() not in self.engine.entities.functions:
            return _error(
                400,
                "One or more of the arguments submitted is incorrect",
                f"The function '{name}' doesn't exist, is disabled, or is not an entity function.",
                "System.ArgumentException",
            )
        raw = await request.text()
        input_json = None
        if raw.strip():
            try:
                # The extension parses the body into a JToken and serializes that as the input.
                input_json = json.dumps(json.loads(raw))
            except json.JSONDecodeError:
                input_json = json.dumps(raw)  # non-JSON content is a string input
        self.engine.store.enqueue_entity_op(
            entity_id=scheduler_id(name, request.match_info["key"]),
            operation=operation,
            input_json=input_json,
        )
        self.clock.poke(ENTITIES)
        return web.Response(status=202)

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    async def get_functions(self, _request: web.Request) -> web.Response:
        """The functions this host indexed, like the real host's
        GET /admin/functions (name and trigger type; deploy/smoke.py counts them)."""
        return web.json_response(self.functions())

    async def get_timers(self, _request: web.Request) -> web.Response:
        return web.json_response(self.timers())

    async def get_clock(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"now": self.clock.now().isoformat(), "controllable": self.clock.controllable}
        )

    async def stall_heartbeat(self, request: web.Request) -> web.Response:
        """POST /admin/heartbeat/stall {"seconds": N}: write no hub heartbeat for N seconds, as
        a starved heartbeat thread would (the tests of lease expiry use it)."""
        body = await request.json()
        seconds = float(body.get("seconds", 0))
        self.engine.store.stall_heartbeat(seconds)
        return web.json_response({"stalled_seconds": seconds})

    async def advance_clock(self, request: web.Request) -> web.Response:
        if not isinstance(self.clock, ControllableClock):
            return web.json_response(
                {"error": "the host runs on real time (start it with --clock controllable)"},
                status=409,
            )
        body = await request.json()
        now = self.clock.advance(float(body.get("seconds", 0)))
        return web.json_response({"now": now.isoformat()})
