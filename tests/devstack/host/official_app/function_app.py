"""An app written the way the official Durable Functions Python samples are (not the product).

The HTTP starter, the hello-cities chain and the human-interaction (approval) pattern
follow the samples in Azure/azure-functions-durable-python and the Microsoft Learn
quickstart: `client.create_check_status_response(req, instance_id)` answers the HTTP
call, and callers poll the returned URLs. Nothing here knows about devstack.host.
The other HTTP functions exercise routing: route parameters and constraints, a
catch-all, methods, and what a function may return.
"""

import json
import os
from datetime import timedelta

import azure.durable_functions as df
import azure.functions as func

myApp = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)


# ---- the quickstart: HTTP starter, orchestrator, activity ------------------------------


@myApp.route(route="orchestrators/{functionName}", methods=["POST"])
@myApp.durable_client_input(client_name="client")
async def http_start(req: func.HttpRequest, client):
    function_name = req.route_params.get("functionName")
    payload = req.get_body()
    instance_id = await client.start_new(
        function_name, None, json.loads(payload) if payload else None
    )
    response = client.create_check_status_response(req, instance_id)
    return response


@myApp.route(route="orchestrators-wait/{functionName}", methods=["POST"])
@myApp.durable_client_input(client_name="client")
async def http_start_and_wait(req: func.HttpRequest, client):
    instance_id = await client.start_new(req.route_params["functionName"])
    return await client.wait_for_completion_or_create_check_status_response(
        req, instance_id, timeout_in_milliseconds=int(req.params.get("timeout", "20000"))
    )


@myApp.orchestration_trigger(context_name="context")
def hello_orchestrator(context):
    result1 = yield context.call_activity("hello", "Seattle")
    result2 = yield context.call_activity("hello", "Tokyo")
    result3 = yield context.call_activity("hello", "London")
    return [result1, result2, result3]


@myApp.activity_trigger(input_name="city")
def hello(city: str):
    return f"Hello {city}"


# ---- human interaction: wait for an approval event or a deadline -----------------------


@myApp.orchestration_trigger(context_name="context")
def approval_orchestrator(context: df.DurableOrchestrationContext):
    hours = (context.get_input() or {}).get("hours", 72)
    deadline = context.current_utc_datetime + timedelta(hours=hours)
    approval = context.wait_for_external_event("Approval")
    timeout = context.create_timer(deadline)
    winner = yield context.task_any([approval, timeout])
    if winner == approval:
        timeout.cancel()
        return {"approved": approval.result}
    return {"approved": None, "escalated": True}


# ---- sub-orchestrations that finish in their first episode -----------------------------


@myApp.orchestration_trigger(context_name="context")
def family(context: df.DurableOrchestrationContext):
    """Calls the child named in its input; reports what the child returned or raised."""
    child = context.get_input()["child"]
    try:
        value = yield context.call_sub_orchestrator(
            child, {"n": 20}, instance_id=f"{context.instance_id}-kid"
        )
    except Exception as exc:  # the child's failure, as the SDK raises it in the parent
        return {"failed": str(exc)}
    return {"value": value}


@myApp.orchestration_trigger(context_name="context")
def child_returns_at_once(context: df.DurableOrchestrationContext):
    return context.get_input()["n"] + 1


@myApp.orchestration_trigger(context_name="context")
def child_returns_before_yield(context: df.DurableOrchestrationContext):
    n = context.get_input()["n"]
    if n > 0:
        return n * 2
    yield context.call_activity("hello", "never")


@myApp.orchestration_trigger(context_name="context")
def child_raises_at_once(context: df.DurableOrchestrationContext):
    n = context.get_input()["n"]
    if n > 0:
        raise ValueError(f"child refused {n}")
    yield context.call_activity("hello", "never")


# ---- routing -----------------------------------------------------------------------------


@myApp.route(route="items/{id:int}", methods=["GET"])
def get_item(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps({"id": int(req.route_params["id"]), "q": req.params.get("q")}),
        mimetype="application/json",
        headers={"X-Item": req.route_params["id"]},
    )


@myApp.route(route="items/{name}", methods=["GET", "PUT"])
def named_item(req: func.HttpRequest) -> func.HttpResponse:
    body = req.get_json() if req.method == "PUT" else None
    return func.HttpResponse(
        json.dumps({"name": req.route_params["name"], "method": req.method, "body": body}),
        status_code=201 if req.method == "PUT" else 200,
        mimetype="application/json",
    )


@myApp.route(route="files/{*path}")
def files(req: func.HttpRequest) -> str:
    return f"path={req.route_params.get('path', '')}"


@myApp.route(route="orders/{id}")
def order(req: func.HttpRequest) -> str:
    return f"order {req.route_params['id']}"


@myApp.route(route="orders/{id}/{part}")
def order_part(req: func.HttpRequest) -> str:
    return f"order {req.route_params['id']} part {req.route_params['part']}"


@myApp.route(route="admin-only", auth_level=func.AuthLevel.ADMIN)
def admin_only(req: func.HttpRequest) -> str:
    return "admin ok"


@myApp.route()
def broken(req: func.HttpRequest) -> func.HttpResponse:
    raise RuntimeError("boom")


@myApp.route(route="nothing")
def returns_none(req: func.HttpRequest):  # type: ignore[no-untyped-def]
    # Not annotated `-> None`: the worker refuses that at load (the http output's
    # converter does not accept NoneType); unannotated, it loads and the None is a 500.
    return None


@myApp.route(route="cookies")
def cookies(req: func.HttpRequest) -> func.HttpResponse:
    response = func.HttpResponse("two cookies")
    response.headers.add("Set-Cookie", "a=1; Path=/")
    response.headers.add("Set-Cookie", "b=2; Path=/")
    return response


# ---- a durable entity (the samples' counter), used from an orchestration and from clients -


@myApp.entity_trigger(context_name="context")
def Counter(context: df.DurableEntityContext):
    current_value = context.get_state(lambda: 0)
    operation = context.operation_name
    if operation == "add":
        amount = context.get_input()
        current_value += amount
    elif operation == "reset":
        current_value = 0
    elif operation == "get":
        pass
    elif operation == "fail":
        raise ValueError(f"counter cannot fail at {current_value}")
    elif operation == "delete":
        context.destruct_on_exit()
        return
    context.set_state(current_value)
    context.set_result(current_value)


@myApp.orchestration_trigger(context_name="context")
def counter_orchestrator(context: df.DurableOrchestrationContext):
    entity_id = df.EntityId("Counter", context.get_input()["key"])
    context.signal_entity(entity_id, "add", 1)
    after_add = yield context.call_entity(entity_id, "add", 5)
    try:
        yield context.call_entity(entity_id, "fail")
        error = None
    except Exception as exc:
        error = str(exc)
    value = yield context.call_entity(entity_id, "get")
    return {"after_add": after_add, "error": error, "get": value}


@myApp.route(route="counters/{key}", methods=["GET", "POST"])
@myApp.durable_client_input(client_name="client")
async def counter_http(req: func.HttpRequest, client):
    entity_id = df.EntityId("Counter", req.route_params["key"])
    if req.method == "POST":
        await client.signal_entity(entity_id, "add", req.get_json())
        return func.HttpResponse(status_code=202)
    state = await client.read_entity_state(entity_id)
    if not state.entity_exists:
        return func.HttpResponse(status_code=404)
    return func.HttpResponse(json.dumps(state.entity_state), mimetype="application/json")


# ---- rewind: an activity that fails the first time ---------------------------------------


@myApp.orchestration_trigger(context_name="context")
def rewindable(context: df.DurableOrchestrationContext):
    greeting = yield context.call_activity("hello", "Oslo")
    second = yield context.call_activity("fails_first_time", context.instance_id)
    return [greeting, second]


@myApp.activity_trigger(input_name="key")
def fails_first_time(key: str) -> str:
    marker = os.path.join(os.environ["SAMPLE_OUT_DIR"], f"failed-once-{key}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first attempt fails")
    return "second attempt works"


# ---- call_http --------------------------------------------------------------------------


@myApp.orchestration_trigger(context_name="context")
def http_caller(context: df.DurableOrchestrationContext):
    base = context.get_input()["base"]
    item = yield context.call_http("GET", f"{base}/api/items/9?q=x")
    accepted = yield context.call_http(
        "POST", f"{base}/api/jobs", {"size": 3}, headers={"X-Trace": "t1"}
    )
    return {"item": item, "accepted": accepted}


@myApp.route(route="jobs", methods=["POST"])
def start_job(req: func.HttpRequest) -> func.HttpResponse:
    """A long-running-operation endpoint: 202 with where to poll."""
    echo = {
        "body": req.get_json(),
        "trace": req.headers.get("X-Trace"),
        "type": req.headers.get("Content-Type"),
    }
    return func.HttpResponse(
        json.dumps(echo),
        status_code=202,
        mimetype="application/json",
        headers={"Location": req.url.replace("/jobs", "/items/1"), "Retry-After": "1"},
    )


if os.environ.get("OFFICIAL_QUEUES"):
    from queue_functions import queue_bp

    myApp.register_functions(queue_bp)
