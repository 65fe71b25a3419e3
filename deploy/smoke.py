"""The smoke test after a deploy: does the deployed app process an order?

    python -m deploy.smoke --azure    # the azd environment (azure.yaml's postdeploy hook; make smoke)
    python -m deploy.smoke --local    # the local stack `make up` runs (.devstack/)

1. Counts the functions the host indexed (Azure: `az functionapp function
   list`; locally the host's GET /admin/functions) against the app's own list
   (deploy/app_functions.py: what `import function_app` registers with the
   same client applications). A host that indexed fewer is named with the
   missing functions and where its indexing errors are logged.
2. Posts one order (OrderID SMOKE-...) of the smoke application
   (domain.ids.SMOKE_APP_ID) to its ingress queue orders-smoke. The order
   travels the whole path (Submit, the workflow, an agent per step, the reply
   bridge, the status), but the agents answer a smoke order's steps from a
   built-in no-op (agents.smoke): nothing reaches REMOTE_SERVICE_URL, so no
   reservation, charge or shipment is made.
3. Receives its statuses from the smoke application's reply queue
   replies-smoke, which no client reads, until the order is Processed, and
   prints how long that took from the send; on any other final status or a
   timeout, the last status seen and where to look.

Right after a first `azd provision` the deployer's role assignments on the
smoke queues may not have reached Service Bus yet (Azure RBAC takes up to 10
minutes): a refused send or receive is retried for --propagation seconds,
each wait said out loud. In Azure the test runs as the deployer (azd's login,
else the az CLI's): main.bicep grants every operator Sender on orders-smoke
and Receiver on replies-smoke, and nothing else of a client's. SMOKE_TEST=skip
skips the test (the hook then says so). Exit 0 only when the order was
Processed."""

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

from domain.ids import SMOKE_APP_ID

ROOT = Path(__file__).resolve().parents[1]
FINAL = {"Processed", "Failed", "Rejected", "Compensated", "CompensationFailed"}
# Flex scales each function group from zero (the first order may wait for
# three cold starts: Submit, the agents, the reply bridge) after the role
# assignments have propagated.
DEFAULT_TIMEOUT = 900.0
# Azure RBAC: "role assignment changes can take up to 10 minutes".
DEFAULT_PROPAGATION = 600.0
PROGRESS_EVERY = 30.0


@dataclass
class Target:
    """Where the smoke test runs.

    Attributes:
        name: what the lines call it.
        settings: the app settings that decide the function list
            (ORDER_INGRESS_QUEUES, REPLY_QUEUE_REGISTRY).
        indexed: the function names the host indexed.
        servicebus: a new aio ServiceBusClient authenticated as the sender.
        app_id: the application the order is sent as (the smoke application).
        where_to_look: lines printed when the order does not come back Processed.
        where_functions_log: where the host logs its indexing (missing functions).
    """

    name: str
    settings: dict[str, str]
    indexed: Callable[[], Awaitable[list[str]]]
    servicebus: Callable[[], Any]
    app_id: str = SMOKE_APP_ID
    where_to_look: list[str] = field(default_factory=list)
    where_functions_log: str = ""


@dataclass
class Result:
    ok: bool
    lines: list[str]
    order_id: str | None = None
    seconds: float | None = None


@dataclass
class _Waiter:
    """Retries what Service Bus refuses while role assignments propagate."""

    say: Callable[[str], None]
    propagation: float
    pause: float = 15.0
    started: float = field(default_factory=time.monotonic)

    async def until_allowed(
        self, what: str, role: str, action: Callable[[], Awaitable[Any]]
    ) -> Any:
        from azure.servicebus.exceptions import (
            ServiceBusAuthenticationError,
            ServiceBusAuthorizationError,
        )

        while True:
            try:
                return await action()
            except (ServiceBusAuthorizationError, ServiceBusAuthenticationError) as error:
                waited = time.monotonic() - self.started
                if waited >= self.propagation:
                    raise _Refused(f"{what} still refused after {waited:.0f} s: {error}") from error
                self.say(
                    f"waiting for the role assignment {role} to propagate "
                    f"({what} refused after {waited:.0f} s; Azure RBAC takes up to "
                    f"{self.propagation:.0f} s here)"
                )
                await asyncio.sleep(self.pause)


class _Refused(Exception):
    pass


async def run(
    target: Target,
    timeout: float = DEFAULT_TIMEOUT,
    out: Callable[[str], None] = print,
    propagation: float = DEFAULT_PROPAGATION,
) -> Result:
    from deploy.app_functions import expected_functions

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
    ingress = json.loads(target.settings["ORDER_INGRESS_QUEUES"]).get(target.app_id)
    reply_entry = json.loads(target.settings["REPLY_QUEUE_REGISTRY"]).get(target.app_id)
    if ingress is None or reply_entry is None:
        say(
            f"FAIL the deployment has no {target.app_id} application (queues orders-{target.app_id}, "
            f"replies-{target.app_id}): deploy with smokeApplication=true"
        )
        return Result(False, lines)
    reply_queue = reply_entry["queue"] if isinstance(reply_entry, dict) else reply_entry
    waiter = _Waiter(say, propagation)
    try:
        return await _order_round_trip(target, ingress, reply_queue, timeout, waiter, say, lines)
    except _Refused as error:
        say(f"FAIL {error}")
        say(
            "the deployer needs Azure Service Bus Data Sender on orders-smoke and Receiver on "
            "replies-smoke (main.bicep grants them to AZURE_PRINCIPAL_ID and OPERATOR_PRINCIPAL_IDS)"
        )
        return Result(False, lines)


async def _order_round_trip(
    target: Target,
    ingress: str,
    reply_queue: str,
    timeout: float,
    waiter: _Waiter,
    say: Callable[[str], None],
    lines: list[str],
) -> Result:
    """2. and 3.: one order sent, its statuses received until a final one."""
    from azure.servicebus import ServiceBusMessage

    from cli.orders import generate
    from domain.codec import encode

    order = next(generate(target.app_id, reply_queue, 1, f"SMOKE-{uuid.uuid4().hex[:8]}"))
    order_id = order.OrderID
    message = ServiceBusMessage(
        encode(order), message_id=f"submit/{order_id}", content_type="application/json"
    )
    async with target.servicebus() as client:

        async def send() -> None:
            async with client.get_queue_sender(ingress) as sender:
                await sender.send_messages(message)

        await waiter.until_allowed(f"sending to {ingress}", f"Sender on {ingress}", send)
        sent = time.monotonic()
        say(f"posted {order_id} to {ingress}; waiting for its status on {reply_queue}")
        latest: tuple[str, str | None] | None = None
        last_said = sent
        while (elapsed := time.monotonic() - sent) < timeout:
            batch = await waiter.until_allowed(
                f"receiving from {reply_queue}",
                f"Receiver on {reply_queue}",
                lambda: _receive(client, reply_queue),
            )
            for status in batch:
                if status[0] != order_id:
                    continue
                latest = (status[1], status[2])
                say(f"{order_id} {status[1]} after {time.monotonic() - sent:.1f} s")
            if latest and latest[0] == "Processed":
                seconds = time.monotonic() - sent
                say(f"ok: {order_id} Processed {seconds:.1f} s after it was sent")
                return Result(True, lines, order_id, seconds)
            if latest and latest[0] in FINAL:
                say(f"FAIL {order_id} ended {latest[0]}: {latest[1] or 'no detail'}")
                _where(target, order_id, say)
                return Result(False, lines, order_id)
            if time.monotonic() - last_said >= PROGRESS_EVERY:
                last_said = time.monotonic()
                seen = f"last status {latest[0]}" if latest else "no status yet"
                say(
                    f"still waiting for {order_id} on {reply_queue} after {elapsed:.0f} s "
                    f"({seen}; the first order after a deploy waits for cold starts)"
                )
    last = f"last status {latest[0]}" if latest else "no status at all"
    say(f"FAIL {order_id} not Processed within {timeout:.0f} s ({last})")
    _where(target, order_id, say)
    return Result(False, lines, order_id)


async def _receive(client: Any, queue: str) -> list[tuple[str, str, str | None]]:
    """One batch of statuses, each completed: the queue is the smoke
    application's, read by nobody else (another smoke order's statuses are
    dropped with it)."""
    statuses = []
    async with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
        for message in await receiver.receive_messages(max_message_count=50, max_wait_time=5):
            status = _status(message)
            if status is not None:
                statuses.append(status)
            await receiver.complete_message(message)
    return statuses


def _where(target: Target, order_id: str, say: Callable[[str], None]) -> None:
    for hint in target.where_to_look:
        say(f"look at {hint.format(order_id=order_id)}")


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

    apps = [
        *client_applications(env),
        {"appId": SMOKE_APP_ID, "replyQueueName": f"replies-{SMOKE_APP_ID}"},
    ]
    credential = _deployer_credential()
    namespace = _need(env, "SERVICEBUS_FULLY_QUALIFIED_NAMESPACE")
    name, group = _need(env, "AZURE_FUNCTION_APP_NAME"), _need(env, "AZURE_RESOURCE_GROUP")
    settings = {
        "ORDER_INGRESS_QUEUES": json.dumps({a["appId"]: f"orders-{a['appId']}" for a in apps}),
        "REPLY_QUEUE_REGISTRY": json.dumps({a["appId"]: a["replyQueueName"] for a in apps}),
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
        where_to_look=[
            "Application Insights ("
            + portal
            + "): traces | where message has '{order_id}' | order by timestamp",
            "the state record, as an operator: python -m cli show {order_id} (infra/README.md, Running the CLI against Azure)",
            f"operator alerts: python -m cli alerts; the console's Dead letters page for orders-{SMOKE_APP_ID}",
            "the app's settings: an unresolved Key Vault reference stops every function "
            "(az functionapp config appsettings list; docs/deploying.md, The keys)",
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


def _deployer_credential() -> Any:
    """The deployer: azd's login in the hook, else the az CLI's."""
    from azure.identity.aio import (
        AzureCliCredential,
        AzureDeveloperCliCredential,
        ChainedTokenCredential,
    )

    return ChainedTokenCredential(AzureDeveloperCliCredential(), AzureCliCredential())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--azure", action="store_true", help="the azd environment's deployment")
    where.add_argument("--local", action="store_true", help="the running local stack")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds the order may take from its send to Processed",
    )
    parser.add_argument(
        "--propagation",
        type=float,
        default=DEFAULT_PROPAGATION,
        help="seconds a refused send or receive is retried while role assignments propagate",
    )
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
    return 0 if asyncio.run(run(target, args.timeout, propagation=args.propagation)).ok else 1


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
