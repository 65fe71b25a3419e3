"""Storage queue triggers (registered when $OFFICIAL_QUEUES is set, so other tests need no Azurite)."""

import json
import os

import azure.durable_functions as df
import azure.functions as func

queue_bp = df.Blueprint()


@queue_bp.queue_trigger(
    arg_name="msg", queue_name="%ORDERS_QUEUE%", connection="AzureWebJobsStorage"
)
@queue_bp.durable_client_input(client_name="client")
async def order_received(msg: func.QueueMessage, client) -> None:
    order = msg.get_json()
    await client.start_new("hello_orchestrator", f"order-{order['id']}")


@queue_bp.queue_trigger(
    arg_name="msg", queue_name="%FLAKY_QUEUE%", connection="AzureWebJobsStorage"
)
def always_fails(msg: func.QueueMessage) -> None:
    line = json.dumps({"body": msg.get_body().decode(), "dequeue_count": msg.dequeue_count}) + "\n"
    with open(os.path.join(os.environ["SAMPLE_OUT_DIR"], "flaky.jsonl"), "a") as f:
        f.write(line)
    raise RuntimeError("this function never succeeds")


@queue_bp.route(route="orders", methods=["POST"])
@queue_bp.queue_output(
    arg_name="msg", queue_name="%ORDERS_QUEUE%", connection="AzureWebJobsStorage"
)
def accept_order(req: func.HttpRequest, msg: func.Out[str]) -> func.HttpResponse:
    msg.set(req.get_body().decode())
    return func.HttpResponse(status_code=202)


@queue_bp.queue_trigger(
    arg_name="msg", queue_name="%FANOUT_QUEUE%", connection="AzureWebJobsStorage"
)
@queue_bp.queue_output(
    arg_name="$return", queue_name="%FANOUT_QUEUE%-out", connection="AzureWebJobsStorage"
)
def fan_out(msg: func.QueueMessage):  # type: ignore[no-untyped-def]
    # No `-> list[str]`: the worker refuses a generic alias as a $return annotation at load
    # ("has invalid non-type return annotation"); the converter takes the list unannotated.
    n = int(msg.get_body())
    return [f"part {i} of {n}" for i in range(n)]
