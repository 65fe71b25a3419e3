"""The smoke test after a deploy: does the deployed app process an order?

    python -m deploy.smoke --azure    # the azd environment (azure.yaml's postdeploy hook; make smoke)
    python -m deploy.smoke --local    # the local stack `make up` runs (.devstack/)

1. Counts the functions the host indexed (Azure: `az functionapp function
   list`; locally the host's GET /admin/functions) against the app's own list
   (deploy/app_functions.py: what `import function_app` registers with the
   same client applications). A host that indexed fewer is named with the
   missing functions and where its indexing errors are logged.
2. Posts one order (OrderID SMOKE-...) to a client application's ingress
   queue with that client's own identity: only the client holds Sender there.
3. Peeks the client's reply queue (nothing is consumed: the statuses stay for
   the application, which can skip OrderIDs starting with SMOKE-) until the
   order is Processed, and prints how long that took from the send; on any
   other final status or a timeout, the last status seen and where to look.

The client's identity in Azure: SMOKE_CLIENT_ID (application id of the
client's service principal) with SMOKE_CLIENT_SECRET or
SMOKE_CLIENT_CERTIFICATE_PATH (tenant AZURE_TENANT_ID), or
SMOKE_CLIENT_CREDENTIAL=cli to use the az CLI's login when az is signed in as
the client's service principal. SMOKE_CLIENT_APP picks the application
(default: the first with a principal id). SMOKE_TEST=skip skips the test (the
hook then says so). Exit 0 only when the order was Processed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FINAL = {"Processed", "Failed", "Rejected", "Compensated", "CompensationFailed"}
DEFAULT_TIMEOUT = 300.0


@dataclass
class Target:
    """Where the smoke test runs.

    Attributes:
        name: what the lines call it.
        settings: the app settings that decide the function list
            (ORDER_INGRESS_QUEUES, REPLY_QUEUE_REGISTRY).
        indexed: the function names the host indexed.
        servicebus: a new aio ServiceBusClient authenticated as the client.
        app_id: the client application the order is sent as.
        where_to_look: lines printed when the order does not come back Processed.
        where_functions_log: where the host logs its indexing (missing functions).
    """

    name: str
    settings: dict[str, str]
    indexed: Callable[[], Awaitable[list[str]]]
    servicebus: Callable[[], Any]
    app_id: str
    where_to_look: list[str] = field(default_factory=list)
    where_functions_log: str = ""


@dataclass
class Result:
    ok: bool
    lines: list[str]
    order_id: str | None = None
    seconds: float | None = None


async def run(target: Target, timeout: float = DEFAULT_TIMEOUT, out=print) -> Result:
    from azure.servicebus import ServiceBusMessage

    from cli.orders import generate
    from deploy.app_functions import expected_functions
    from domain.codec import encode

    lines: list[str] = []

    def say(text: str) -> None:
        lines.append(f"smoke: {text}")
        out(f"smoke: {text}")

    # 1. The functions.
    expected = await asyncio.to_thread(expected_functions, target.settings)
    indexed = await target.indexed()
    missing = sorted(set(expected) - set(indexed))
    say(f"{target.name}: {len(set(indexed) & set(expected))} of {len(expected)} functions indexed")
    if missing:
        say(f"FAIL not indexed: {', '.join(missing)}")
        say(f"look at the host's indexing errors: {target.where_functions_log}")
        return Result(False, lines)

    # 2. One order, as the client.
    ingress = json.loads(target.settings["ORDER_INGRESS_QUEUES"])[target.app_id]
    reply_entry = json.loads(target.settings["REPLY_QUEUE_REGISTRY"])[target.app_id]
    reply_queue = reply_entry["queue"] if isinstance(reply_entry, dict) else reply_entry
    order = next(generate(target.app_id, reply_queue, 1, f"SMOKE-{uuid.uuid4().hex[:8]}"))
    order_id = order.OrderID
    latest: tuple[str, str | None] | None = None
    async with target.servicebus() as client:
        async with client.get_queue_sender(ingress) as sender:
            await sender.send_messages(
                ServiceBusMessage(
                    encode(order),
                    message_id=f"submit/{order_id}",
                    content_type="application/json",
                )
            )
        sent = time.monotonic()
        say(
            f"posted {order_id} to {ingress} as {target.app_id}; waiting for Processed on {reply_queue}"
        )

        # 3. Its statuses, peeked.
        next_sequence = 0
        async with client.get_queue_receiver(reply_queue) as receiver:
            while time.monotonic() - sent < timeout:
                batch = await receiver.peek_messages(
                    max_message_count=100, sequence_number=next_sequence
                )
                if batch:
                    next_sequence = max(m.sequence_number or 0 for m in batch) + 1
                else:
                    await asyncio.sleep(1)
                for message in batch:
                    status = _status(message)
                    if status is None or status[0] != order_id:
                        continue
                    latest = (status[1], status[2])
                    say(f"{order_id} {status[1]} after {time.monotonic() - sent:.1f} s")
                    if status[1] == "Processed":
                        seconds = time.monotonic() - sent
                        say(f"ok: {order_id} Processed {seconds:.1f} s after it was sent")
                        return Result(True, lines, order_id, seconds)
                    if status[1] in FINAL:
                        say(f"FAIL {order_id} ended {status[1]}: {status[2] or 'no detail'}")
                        for hint in target.where_to_look:
                            say(f"look at {hint.format(order_id=order_id)}")
                        return Result(False, lines, order_id)
    last = f"last status {latest[0]}" if latest else "no status at all"
    say(f"FAIL {order_id} not Processed within {timeout:.0f} s ({last})")
    for hint in target.where_to_look:
        say(f"look at {hint.format(order_id=order_id)}")
    return Result(False, lines, order_id)


def _status(message: Any) -> tuple[str, str, str | None] | None:
    try:
        data = json.loads(b"".join(message.body))
    except (ValueError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    oid, status = data.get("OrderID"), data.get("Status")
    if not isinstance(oid, str) or not isinstance(status, str):
        return None
    return oid, status, data.get("Detail")


# --- the local stack -----------------------------------------------------------------


def local_target(settings: Mapping[str, str], host_url: str, log_hint: str) -> Target:
    """A running local stack: its settings (Stack.settings) and host URL."""
    import aiohttp
    from azure.servicebus.aio import ServiceBusClient

    async def indexed() -> list[str]:
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{host_url}/admin/functions") as response,
        ):
            response.raise_for_status()
            return [fn["name"] for fn in await response.json()]

    return Target(
        name=f"local host {host_url}",
        settings={k: settings[k] for k in ("ORDER_INGRESS_QUEUES", "REPLY_QUEUE_REGISTRY")},
        indexed=indexed,
        servicebus=lambda: ServiceBusClient.from_connection_string(
            settings["ServiceBusConnection"]
        ),
        app_id=next(iter(json.loads(settings["ORDER_INGRESS_QUEUES"]))),
        where_to_look=[
            f"the host's log, {log_hint}",
            "the state record: python -m cli show {order_id}",
            "operator alerts and dead letters: python -m cli alerts; the console's Dead letters page",
        ],
        where_functions_log=log_hint,
    )


def _running_local_stack(runs: Path) -> tuple[dict[str, str], str, str]:
    from devstack.stack import Ports, app_settings, find_stacks

    stacks = [s for s in find_stacks(sorted(runs.glob("*"))) if s.running]
    if not stacks:
        raise SystemExit(f"smoke: no local stack is running under {runs} (make up)")
    state = stacks[0].state
    servers = state["servers"]
    # Only the Service Bus connection and the client lists matter here.
    ports = Ports(servicebus=servers["servicebus"]["port"], host=servers["host"]["port"])
    host = servers["host"]
    return app_settings(ports), f"http://127.0.0.1:{host['port']}", host["log"]


# --- Azure ---------------------------------------------------------------------------


def azure_target(env: Mapping[str, str]) -> Target:
    from azure.servicebus.aio import ServiceBusClient

    from deploy.preflight import client_applications

    apps = [a for a in client_applications(env) if a.get("principalId")]
    wanted = env.get("SMOKE_CLIENT_APP") or (apps[0]["appId"] if apps else "")
    if not wanted:
        raise SystemExit(
            "smoke: FAIL no client application has an identity: set <APP>_PRINCIPAL_ID and deploy again"
        )
    all_apps = client_applications(env)
    app = next((a for a in all_apps if a["appId"] == wanted), None)
    if app is None:
        raise SystemExit(f"smoke: FAIL SMOKE_CLIENT_APP {wanted!r} is not a client application")
    credential = _client_credential(env)
    namespace = _need(env, "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE")
    name, group = _need(env, "AZURE_FUNCTION_APP_NAME"), _need(env, "AZURE_RESOURCE_GROUP")
    settings = {
        "ORDER_INGRESS_QUEUES": json.dumps({a["appId"]: f"orders-{a['appId']}" for a in all_apps}),
        "REPLY_QUEUE_REGISTRY": json.dumps({a["appId"]: a["replyQueueName"] for a in all_apps}),
    }

    async def indexed() -> list[str]:
        # Flex syncs the function list a little after the deploy: ask a few times.
        names: list[str] = []
        for _ in range(12):
            done = await asyncio.to_thread(
                subprocess.run,
                [
                    "az",
                    "functionapp",
                    "function",
                    "list",
                    "-g",
                    group,
                    "-n",
                    name,
                    "--query",
                    "[].name",
                    "-o",
                    "json",
                    "--only-show-errors",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if done.returncode != 0:
                raise SystemExit(f"smoke: FAIL az functionapp function list: {done.stderr.strip()}")
            names = [n.split("/", 1)[-1] for n in json.loads(done.stdout or "[]")]
            if names:
                return names
            await asyncio.sleep(10)
        return names

    portal = f"resource group {group}, function app {name}"
    return Target(
        name=f"function app {name}",
        settings=settings,
        indexed=indexed,
        servicebus=lambda: ServiceBusClient(namespace, credential),
        app_id=app["appId"],
        where_to_look=[
            "Application Insights ("
            + portal
            + "): traces | where message has '{order_id}' | order by timestamp",
            "the state record, as an operator: python -m cli show {order_id} (infra/README.md, Running the CLI against Azure)",
            "operator alerts: python -m cli alerts; the console's Dead letters page for orders-"
            + app["appId"],
            "the agents' remote service: REMOTE_SERVICE_URL must answer from Azure",
        ],
        where_functions_log=(
            f"Application Insights of {portal}: traces | where message has 'indexing' or "
            "severityLevel >= 3 (an import error of function_app.py indexes nothing)"
        ),
    )


def _need(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise SystemExit(
            f"smoke: FAIL {name} is not set: run from the azd environment (azd env get-values)"
        )
    return value


def _client_credential(env: Mapping[str, str]) -> Any:
    from azure.identity.aio import (
        AzureCliCredential,
        CertificateCredential,
        ClientSecretCredential,
    )

    if env.get("SMOKE_CLIENT_CREDENTIAL") == "cli":
        return AzureCliCredential()
    client_id, tenant = env.get("SMOKE_CLIENT_ID"), env.get("AZURE_TENANT_ID")
    if client_id and tenant and env.get("SMOKE_CLIENT_SECRET"):
        return ClientSecretCredential(tenant, client_id, env["SMOKE_CLIENT_SECRET"])
    if client_id and tenant and env.get("SMOKE_CLIENT_CERTIFICATE_PATH"):
        return CertificateCredential(tenant, client_id, env["SMOKE_CLIENT_CERTIFICATE_PATH"])
    raise SystemExit(
        "smoke: FAIL no client identity to send the order as: set SMOKE_CLIENT_ID and "
        "SMOKE_CLIENT_SECRET (or SMOKE_CLIENT_CERTIFICATE_PATH) of the client application's "
        "service principal, or SMOKE_CLIENT_CREDENTIAL=cli; SMOKE_TEST=skip skips the test"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--azure", action="store_true", help="the azd environment's deployment")
    where.add_argument("--local", action="store_true", help="the running local stack")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    parser.add_argument(
        "--runs", type=Path, default=ROOT / ".devstack", help="where local stacks run (--local)"
    )
    args = parser.parse_args(argv)
    if os.environ.get("SMOKE_TEST") == "skip":
        print(
            "smoke: skipped (SMOKE_TEST=skip): nothing checks that this deployment processes orders"
        )
        return 0
    if args.azure:
        target = azure_target(_azd_env())
    else:
        settings, host, log = _running_local_stack(args.runs)
        target = local_target(settings, host, log)
    return 0 if asyncio.run(run(target, args.timeout)).ok else 1


def _azd_env() -> dict[str, str]:
    """The hook's environment; `azd env get-values` fills what is missing when run alone."""
    env = dict(os.environ)
    if "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE" not in env:
        done = subprocess.run(
            ["azd", "env", "get-values", "--output", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode == 0:
            env = {**json.loads(done.stdout), **env}
    return env


if __name__ == "__main__":
    sys.exit(main())
