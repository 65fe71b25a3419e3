"""Record the console's histories (tests/console/histories/*.json) on the live workflow.

    .venv/bin/python -m tests.console.histories.record

The whole local stack (tests/e2e/conftest.py's settings: short deadlines)
runs four orders with the remote service's fault rules, the browser test's
(tests/e2e/test_console_browser.py `inject_faults`):

- declined: the payment is declined after the reservation: compensated;
- retried: the reservation hangs past the agent's call timeout until attempt
  1's deadline; the Supervisor hands the order to attempt 2, which finishes it;
- compfail: the payment is declined and the release refused once: the
  compensation fails; an operator (`local`) asks again and it succeeds;
- agentretry: the charge answers 503 twice, then the agent's third call works.

For each, the state record and every attempt's status with its history, as
the host's durable HTTP API answers `get_status(show_history=True,
show_history_output=True, show_input=True)` to the console (the input names
the request the Starter sent, ADR 021l), are written to `<name>.json`. tests/console/test_timeline.py and
test_effects.py read them.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from adapters.ports import ANY_OWNER
from console import actions
from devstack.stack import Stack
from domain.ids import attempt_instance_id, order_key
from domain.models import ProcessState
from tests.e2e.conftest import E2E, E2E_SETTINGS
from tests.e2e.test_console_browser import inject_faults

HERE = Path(__file__).resolve().parent
STATUS = "/runtime/webhooks/durabletask/instances/{}?showHistory=true&showHistoryOutput=true&showInput=true"


async def statuses(e2e: E2E, key: str, attempts: int) -> dict[str, Any]:
    """Every attempt's status with history, once each has finished."""
    base = f"http://127.0.0.1:{e2e.stack.ports.host}"
    out: dict[str, Any] = {}
    for attempt in range(1, attempts + 1):
        instance = attempt_instance_id(key, attempt)
        for _ in range(240):
            async with e2e.http.get(base + STATUS.format(instance)) as response:
                status = await response.json()
            if status.get("runtimeStatus") in ("Completed", "Failed", "Terminated"):
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError(f"{instance} did not finish: {status}")
        status.pop("input", None)
        out[instance] = status
    return out


async def save(e2e: E2E, name: str, order_id: str) -> None:
    key = order_key("webshop", order_id)
    record, _ = await e2e.store.read(key)
    body = {
        "record": record.model_dump(mode="json"),
        "statuses": await statuses(e2e, key, record.Attempt),
    }
    (HERE / f"{name}.json").write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {name}.json: {record.ProcessState.value}, {record.Attempt} attempts", flush=True)


async def drive(stack: Stack) -> None:
    async with E2E(stack) as e2e:
        declined, retried, compfail, agentretry = e2e.orders(4)
        await inject_faults(e2e, retried, declined, compfail, agentretry)
        await e2e.post([declined, retried, compfail, agentretry])
        ids = {o.OrderID for o in (declined, retried, compfail, agentretry)}
        records = await e2e.wait_terminal(ids, timeout=300, revive=False)
        assert records[compfail.OrderID].ProcessState is ProcessState.COMPENSATION_FAILED
        key = order_key("webshop", compfail.OrderID)
        await e2e.store.update(
            key,
            lambda r: actions.apply(
                r, "compensate", "local", "the provider fixed its release", datetime.now(UTC)
            ),
            ANY_OWNER,
        )
        await e2e.wait_for(
            lambda rs: rs[compfail.OrderID].ProcessState is ProcessState.COMPENSATED,
            timeout=120,
            what="the operator's compensation",
        )
        for name, order in (
            ("declined", declined),
            ("retried", retried),
            ("compfail", compfail),
            ("agentretry", agentretry),
        ):
            await save(e2e, name, order.OrderID)


def main() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="console-histories-") as tmp,
        Stack(Path(tmp), overrides=E2E_SETTINGS) as stack,
    ):
        asyncio.run(drive(stack))


if __name__ == "__main__":
    main()
