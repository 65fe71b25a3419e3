"""The operator commands of `python -m cli` against the local Cosmos DB server:
`show`, `list`, `stuck`, `resubmit` and `compensate` read and change the real
state record (each command opens its own client, as the tool does)."""

from __future__ import annotations

import asyncio
import io
import sys
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

import cli.__main__ as tool
from adapters.cosmos_client import build_client, ensure_state_container
from adapters.settings import CosmosAccount
from adapters.state_store import CosmosStateStore
from domain import state_machine as sm
from domain.models import OrderState, ProcessState
from tests.fixtures.cosmos import STATE_CONTAINER
from tests.integration.adapters.builders import POLICY, make_record

pytestmark = pytest.mark.integration


def _run_async(account: CosmosAccount, database: str, use):
    async def go():
        client = build_client(account)
        async with client:
            container = await ensure_state_container(client, database, STATE_CONTAINER)
            return await use(CosmosStateStore(container))

    return asyncio.run(go())


@pytest.fixture
def store(cosmos_account: CosmosAccount, cosmos_database: str):
    """Runs a coroutine on the test's own state container; drops the database after."""
    yield lambda use: _run_async(cosmos_account, cosmos_database, use)

    async def drop():
        client = build_client(cosmos_account)
        async with client:
            await client.delete_database(cosmos_database)

    asyncio.run(drop())


@pytest.fixture
def cli(monkeypatch, cosmos_account: CosmosAccount, cosmos_database: str, tmp_path):
    endpoint, key = cosmos_account.endpoint, cosmos_account.key
    env = {
        "LOCAL_SETTINGS": str(tmp_path / "absent.json"),
        "CosmosDbConnection": f"AccountEndpoint={endpoint};AccountKey={key}",
        "COSMOS_VERIFY_TLS": "false",
        "STATE_DATABASE_NAME": cosmos_database,
        "ServiceBusConnection": "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=x;"
        "SharedAccessKey=y;UseDevelopmentEmulator=true",
        "REPLY_QUEUE_REGISTRY": '{"webshop": "replies-webshop"}',
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def run(*argv: str, width: int = 300) -> tuple[int, str]:
        out = io.StringIO()
        monkeypatch.setattr(tool, "console", Console(file=out, width=width))
        monkeypatch.setattr(sys, "argv", ["cli", *argv])
        try:
            code = tool.main()
        except SystemExit as done:  # typer ends a command that succeeded this way
            code = done.code
        return code, out.getvalue()

    return run


def _failed(order_id: str) -> OrderState:
    now = datetime.now(UTC) - timedelta(minutes=5)
    claimed = sm.claim(make_record(order_id, now), now, POLICY)
    return sm.mark_failed(claimed, claimed.LockedBy, None, "card declined", now)


def _stuck(order_id: str) -> OrderState:
    now = datetime.now(UTC) - timedelta(minutes=5)
    claimed = sm.claim(make_record(order_id, now), now, POLICY)
    return claimed.model_copy(update={"CompleteBy": now + timedelta(seconds=1)})


@pytest.mark.parametrize(
    ("command", "said", "changed"),
    [
        (
            "resubmit",
            "Pending; the starter will pick it up",
            lambda r: r.ProcessState is ProcessState.PENDING,
        ),
        ("compensate", "compensation requested", lambda r: r.CompensationRequested is True),
    ],
)
def test_an_operator_transition_changes_an_error_order(store, cli, command, said, changed):
    order_id = f"CLI-{command}"
    store(lambda s: s.create_if_absent(_failed(order_id)))

    code, text = cli(command, order_id, "--reason", "cause fixed", "--operator", "ada", "--yes")

    assert code == 0, text
    assert f"{order_id}: {said}" in text
    record, _ = store(lambda s: s.read(order_id))
    assert changed(record)
    assert record.History[-1].By == "operator:ada"
    assert record.History[-1].Reason.endswith(": cause fixed")


def test_a_refused_transition_is_one_line_and_changes_nothing(store, cli):
    store(lambda s: s.create_if_absent(make_record("CLI-3")))

    code, text = cli("resubmit", "CLI-3", "--reason", "cause fixed", "--yes")

    assert code == 1
    assert text.startswith("error: "), text
    assert len(text.strip().splitlines()) == 1, text
    record, _ = store(lambda s: s.read("CLI-3"))
    assert record.ProcessState is ProcessState.PENDING
    assert len(record.History) == len(make_record("CLI-3").History)


def test_show_list_and_stuck_read_the_records(store, cli):
    store(lambda s: s.create_if_absent(_failed("CLI-4")))
    store(lambda s: s.create_if_absent(_stuck("CLI-5")))

    code, shown = cli("show", "CLI-4")
    assert code == 0, shown
    assert "CLI-4" in shown
    assert "card declined" in shown

    code, listed = cli("list", "--state", "Error", width=200)
    assert code == 0, listed
    assert "CLI-4" in listed
    assert "CLI-5" not in listed

    code, stuck = cli("stuck")
    assert code == 0, stuck
    assert "1 stuck Processing orders" in stuck
    assert "CLI-5" in stuck


LONG = (
    "payment/charge for CLI-6/charge-payment: HTTP 422: the card issuer declined the "
    "charge after a second look at the account, reason code 05, do not honour; ask the "
    "customer for another card"
)


def _squeezed(text: str) -> str:
    return "".join(text.split())


def test_at_80_columns_nothing_is_cut(store, cli):
    """`show`, `list --state` and `stuck` on an 80-column terminal: every time
    in full (microseconds and offset) and every reason whole, wrapped."""
    now = datetime.now(UTC) - timedelta(minutes=5)
    claimed = sm.claim(make_record("CLI-6", now), now, POLICY)
    failed = sm.mark_failed(claimed, claimed.LockedBy, None, LONG, now)
    store(lambda s: s.create_if_absent(failed))
    store(lambda s: s.create_if_absent(_stuck("CLI-7")))
    record, _ = store(lambda s: s.read("CLI-6"))
    stuck, _ = store(lambda s: s.read("CLI-7"))

    code, shown = cli("show", "CLI-6", width=80)
    assert code == 0, shown
    assert all(len(line) <= 80 for line in shown.splitlines())
    assert _squeezed(LONG) in _squeezed(shown)
    for h in record.History:
        assert h.At.isoformat() in shown
    assert "…" not in shown
    assert "--json" in shown  # says where the whole record is

    code, listed = cli("list", "--state", "Error", width=80)
    assert code == 0, listed
    assert all(len(line) <= 80 for line in listed.splitlines())
    assert _squeezed(LONG) in _squeezed(listed)
    assert "…" not in listed

    code, late = cli("stuck", width=80)
    assert code == 0, late
    assert stuck.CompleteBy.isoformat() in late


def test_show_json_is_the_whole_record(store, cli):
    store(lambda s: s.create_if_absent(_failed("CLI-8")))
    record, _ = store(lambda s: s.read("CLI-8"))

    code, raw = cli("show", "CLI-8", "--json", width=80)
    assert code == 0, raw
    assert OrderState.model_validate_json(raw) == record


def test_list_without_a_state_counts_every_state(store, cli):
    store(lambda s: s.create_if_absent(_failed("CLI-9")))
    store(lambda s: s.create_if_absent(make_record("CLI-10")))

    code, counts = cli("list", width=80)
    assert code == 0, counts
    lines = {
        line.split()[0]: line.split()[1]
        for line in counts.splitlines()[1:]
        if len(line.split()) == 2
    }
    assert lines["Error"] == "1"
    assert lines["Pending"] == "1"
    assert set(lines) == {s.value for s in ProcessState}
    assert "--state" in counts
