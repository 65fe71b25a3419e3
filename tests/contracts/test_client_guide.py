"""docs/client-guide.md covers every contract, every status a client can
receive and every reason Submit dead-letters an order with, and its Python
and JavaScript examples run as written against the local stack."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import jsonschema
import pytest

from devstack.stack import Stack
from domain import schemas
from domain.models import StatusKind
from tests.clients.helpers import run_js
from tests.e2e.conftest import E2E_SETTINGS

GUIDE = schemas.ROOT / "docs" / "client-guide.md"
SUBMIT = schemas.ROOT / "submit" / "handler.py"


def guide() -> str:
    return GUIDE.read_text()


@pytest.mark.parametrize("name", sorted(schemas.CONTRACTS))
def test_links_every_schema(name: str):
    assert f"contracts/{name}.schema.json" in guide()


@pytest.mark.parametrize("status", [s.value for s in StatusKind])
def test_explains_every_status(status: str):
    assert re.search(rf"^\| {status} \|", guide(), re.MULTILINE), status


def test_explains_every_dead_letter_reason_submit_uses():
    reasons = set(re.findall(r'Settle\.dead_letter\(\s*"(\w+)"', SUBMIT.read_text()))
    assert reasons >= {"InvalidMessage", "ReplyQueueNotAllowed", "OrderConflict"}
    for reason in reasons:
        assert re.search(rf"^\| `{reason}` \|", guide(), re.MULTILINE), reason


def test_names_the_per_application_ingress_queue():
    assert "orders-<AppId>" in guide()
    assert "MessageId" in guide()
    assert "application/json" in guide()


# --- the guide's examples, run as written against the local stack ------------------------

EXAMPLE = re.compile(r"<!-- example: (\w+) -->\n```\w+\n(.*?)```", re.DOTALL)
W3C = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"


def examples() -> dict[str, str]:
    return dict(EXAMPLE.findall(guide()))


def test_the_guide_has_a_python_and_a_javascript_example():
    assert set(examples()) == {"python", "javascript"}
    assert CONNECTION_STRING in guide()


CONNECTION_STRING = (
    "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # No exporter configured: statuses must carry a trace context all the same.
    with Stack(tmp_path_factory.mktemp("guide-stack"), overrides=E2E_SETTINGS) as running:
        yield running


def _run_example(language: str, stack) -> list[dict]:
    code = examples()[language]
    if language == "python":
        command = [sys.executable, "-c", code]
    else:
        node = shutil.which("node")
        assert node, "node is needed to run the guide's JavaScript example"
        # An ES module from standard input, resolving @azure/service-bus from the repo.
        command = [node, "--input-type=module", "-e", code]
    done = subprocess.run(
        command,
        cwd=schemas.ROOT,
        env={**os.environ, "SERVICEBUS_CONNECTION": stack.settings["ServiceBusConnection"]},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("language", ["python", "javascript"])
def test_the_example_runs_as_written(language: str, stack):
    schema = jsonschema.Draft202012Validator(
        json.loads((schemas.CONTRACTS_DIR / "StatusUpdate.schema.json").read_text()),
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )
    printed = _run_example(language, stack)
    assert printed, "the example printed no status"
    for line in printed:
        schema.validate(line["status"])
    (order_id,) = {line["status"]["OrderID"] for line in printed}
    statuses = [line["status"]["Status"] for line in printed]
    assert statuses[0] == "Received"
    assert statuses[-1] == "Processed"
    traces = set()
    for line in printed:
        match = W3C.match(line["traceparent"] or "")
        assert match, f"{line['status']['Status']} of {order_id} has no valid traceparent"
        traces.add(match[1])
    # The Python example sends a traceparent: its statuses continue that trace. The
    # JavaScript example sends none: its statuses carry a fresh one, all the same.
    assert len(traces) == 1
    if language == "python":
        assert traces == {CLIENT_TRACE}
    else:
        assert CLIENT_TRACE not in traces


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_an_amount_in_words_is_dead_lettered_as_the_guide_says(stack):
    """The JavaScript SDK posts an order with `"Total": "ten"`; the app refuses it
    with the reason and the description the guide's table and amount rules give."""
    cs = stack.settings["ServiceBusConnection"]
    order_id = f"ORD-TEN-{os.getpid()}"
    order = {
        "OrderID": order_id,
        "AppId": "webshop",
        "ReplyTo": "replies-webshop",
        "Customer": {"CustomerId": "C-7"},
        "Lines": [{"Sku": "SKU-1", "Quantity": 1, "UnitPrice": "10.00"}],
        "Total": "ten",
    }
    run_js("post", connection=cs, queue="orders-webshop", orders=[order])
    deadline = time.monotonic() + 90
    while True:
        dead = run_js("deadletters", connection=cs, queue="orders-webshop")["messages"]
        mine = [d for d in dead if d["messageId"] == order_id]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert mine, f"{order_id} was not dead-lettered"
    (refused,) = mine
    assert refused["deadLetterReason"] == "InvalidMessage"
    assert "Total" in refused["deadLetterErrorDescription"]
    assert "decimal string" in refused["deadLetterErrorDescription"]
    assert re.search(r"^\| `InvalidMessage` \|.*amount", guide(), re.MULTILINE)
