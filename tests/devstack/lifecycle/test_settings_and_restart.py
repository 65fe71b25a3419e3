"""`python -m devstack up --free-ports` (what `make up ARGS=--free-ports` runs) hands over its
settings: the README's CLI walk works from a fresh clone's directory with no edits. Then the
stack is stopped and started again on the same run directory: every order, alert, dead
letter and Durable history entry is still there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from azure.cosmos import CosmosClient
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from .conftest import READY_TIMEOUT, ROOT, state, wait_until_gone

pytestmark = pytest.mark.slow

CONNECTIONS = (
    "ServiceBusConnection",
    "CosmosDbConnection",
    "AzureWebJobsStorage",
    "LOCAL_SETTINGS",
)
FINAL = {"Processed", "Failed", "Rejected", "Compensated", "CompensationFailed", "Error"}


def cli(clone: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m cli ...` as the README runs it: from the clone, no settings in the env."""
    env = {k: v for k, v in os.environ.items() if k not in CONNECTIONS}
    env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"})
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def values(path: Path) -> dict[str, str]:
    return json.loads(path.read_text())["Values"]


def cosmos_records(v: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every item of the state and orders containers: (container, id) -> (etag, state)."""
    endpoint = v["CosmosDbConnection"].split("AccountEndpoint=")[1].split(";")[0]
    key = v["CosmosDbConnection"].split("AccountKey=")[1].split(";")[0]
    out: dict[str, dict[str, Any]] = {}
    with CosmosClient(endpoint, key, connection_verify=False) as c:
        for db, coll in (
            (v["STATE_DATABASE_NAME"], v["STATE_CONTAINER_NAME"]),
            (v["ORDERS_DATABASE_NAME"], v["ORDERS_CONTAINER_NAME"]),
        ):
            container = c.get_database_client(db).get_container_client(coll)
            for item in container.query_items("SELECT * FROM c", enable_cross_partition_query=True):
                if item["id"].startswith("_"):
                    continue  # the app's own gauges (the backlog), rewritten by its timers
                out[f"{coll}/{item['id']}"] = {
                    "etag": item["_etag"],
                    "state": item.get("ProcessState"),
                }
    return out


def peek_ids(v: dict[str, str], queue: str, dead: bool = False) -> list[str]:
    with ServiceBusClient.from_connection_string(v["ServiceBusConnection"]) as client:
        receiver = client.get_queue_receiver(
            queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER if dead else None
        )
        with receiver:
            ids: list[str] = []
            seq = 0
            while True:
                page = receiver.peek_messages(max_message_count=100, sequence_number=seq)
                if not page:
                    return ids
                ids.extend(str(m.message_id) for m in page)
                seq = max(m.sequence_number or 0 for m in page) + 1


def history(host_port: int) -> dict[str, int]:
    """Every finished orchestration instance and the length of its history."""
    base = f"http://127.0.0.1:{host_port}/runtime/webhooks/durabletask/instances"
    with urllib.request.urlopen(base, timeout=30) as r:
        instances = json.loads(r.read())
    out = {}
    for inst in instances:
        if inst["runtimeStatus"] not in ("Completed", "Failed", "Terminated"):
            continue
        iid = inst["instanceId"]
        with urllib.request.urlopen(
            f"{base}/{urllib.parse.quote(iid, safe='')}?showHistory=true", timeout=30
        ) as r:
            out[iid] = len(json.loads(r.read())["historyEvents"])
    return out


def host_port(run_dir: Path) -> int:
    return state(run_dir)["servers"]["host"]["port"]


def wait_until(predicate, what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"no {what} after {timeout}s")


def test_up_hands_over_its_settings_and_the_data_survives_a_restart(launch, mark, tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    run_dir = clone / ".devstack" / "up"
    up_args = ("-m", "devstack", "up", "--free-ports", "--run-dir", str(run_dir))

    up = launch(*up_args, cwd=clone)
    up.wait_output("devstack: up", READY_TIMEOUT)
    settings = clone / "local.settings.json"
    assert settings.exists(), up.output  # none existed: `up` wrote it
    v = values(settings)
    sb_port = state(run_dir)["servers"]["servicebus"]["port"]
    assert f"sb://127.0.0.1:{sb_port};" in v["ServiceBusConnection"]
    assert f"ServiceBusConnection={v['ServiceBusConnection']}" in up.output
    assert values(run_dir / "local.settings.json") == v

    # Right after `up`, a query answers (the containers exist before the host starts).
    early = cli(clone, "list", "--state", "Pending")
    assert early.returncode == 0, early.stdout + early.stderr
    assert "not found" not in early.stdout + early.stderr

    # The README's walk, as written.
    post = cli(clone, "post", "--app", "webshop", "--count", "20")
    assert post.returncode == 0, post.stdout + post.stderr
    started = time.monotonic()
    watch = cli(clone, "watch", "--app", "webshop", "--expect", "20", "--timeout", "280")
    assert watch.returncode == 0, watch.stdout + watch.stderr
    assert time.monotonic() - started < 280, "watch ran to its timeout: 20 final statuses not seen"

    # A dead letter and an alert: a message Submit cannot read.
    with (
        ServiceBusClient.from_connection_string(v["ServiceBusConnection"]) as client,
        client.get_queue_sender("orders-webshop") as sender,
    ):
        sender.send_messages(ServiceBusMessage("this is not an order", message_id=uuid.uuid4().hex))
    dead = wait_until(lambda: peek_ids(v, "orders-webshop", dead=True), "dead letter")
    alerts = wait_until(lambda: peek_ids(v, "alerts"), "alert")
    records = wait_until(
        lambda: (
            (r := cosmos_records(v))
            and sum(1 for x in r.values() if x["state"] in FINAL) >= 20
            and r
        ),
        "20 finished orders",
    )
    before = {
        "records": records,
        "dead": sorted(dead),
        "alerts": sorted(alerts),
        "history": history(host_port(run_dir)),
    }
    assert len(before["history"]) >= 20

    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(60) == 128 + signal.SIGTERM
    assert wait_until_gone(mark, timeout=20) == []

    again = launch(*up_args, cwd=clone)
    again.wait_output("devstack: up", READY_TIMEOUT)
    assert "loaded" in again.output, again.output
    assert "state was RESET" not in again.output
    v2 = values(settings)  # rewritten for the new ports
    assert v2["ServiceBusConnection"] != v["ServiceBusConnection"]
    after = {
        "records": cosmos_records(v2),
        "dead": sorted(peek_ids(v2, "orders-webshop", dead=True)),
        "alerts": sorted(peek_ids(v2, "alerts")),
        "history": history(host_port(run_dir)),
    }
    assert after["records"] == before["records"]  # same items, same etags
    assert after["dead"] == before["dead"]
    assert after["alerts"] == before["alerts"]
    assert {k: after["history"].get(k) for k in before["history"]} == before["history"]
    # and the CLI finds one of them on the restarted stack, with no edits
    order_id = next(
        k.split("/", 1)[1]
        for k, r in before["records"].items()
        if k.startswith(v["STATE_CONTAINER_NAME"] + "/") and r["state"] in FINAL
    )
    show = cli(clone, "show", order_id)
    assert show.returncode == 0, show.stdout + show.stderr

    again.process.send_signal(signal.SIGTERM)
    assert again.process.wait(60) == 128 + signal.SIGTERM
    assert wait_until_gone(mark, timeout=20) == []


def test_a_connection_error_names_the_setting_the_stack_and_make_status(tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    dead_port = 9  # discard: nothing listens there
    template = json.loads((ROOT / "local.settings.template.json").read_text())
    template["Values"]["ServiceBusConnection"] = (
        f"Endpoint=sb://127.0.0.1:{dead_port};SharedAccessKeyName=k;SharedAccessKey=v;"
        "UseDevelopmentEmulator=true"
    )
    (clone / "local.settings.json").write_text(json.dumps(template))
    result = cli(clone, "post", "--app", "webshop", "--count", "1", timeout=120)
    assert result.returncode == 1
    text = " ".join(result.stdout.split())
    assert f"ServiceBusConnection=sb://127.0.0.1:{dead_port}" in text
    assert "local.settings.json" in text
    assert "no running stack" in text
    assert "make status" in text
