"""An operator's session with `python -m cli` on an 80-column terminal,
against the local Cosmos DB server and the Service Bus emulator: the list of
Pending orders names a long retry's next try; resubmit and compensate show
the order, ask why and for confirmation (answered on stdin, as at a
terminal) and record the operator's name and reason; a dead letter is
listed with its sequence number, its JSON body wrapped at word boundaries
and the per-queue counts last, then resent and discarded with a reason.
Every line the tool printed is captured and held to 80 columns."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient
from rich.console import Console

import cli.__main__ as tool
from domain import state_machine as sm
from domain.models import OrderState, ProcessState
from tests.integration.adapters.builders import POLICY, make_record
from tests.integration.cli import test_operator_commands as commands

pytestmark = pytest.mark.integration

store = commands.store  # the fixture: the test's own state container
WIDTH = 80
QUEUES = ["orders-webshop", "agent-requests", "agent-responses", "alerts", "replies-webshop"]
DESCRIPTION = (
    "the message could not be processed after 10 deliveries: the state store answered "
    "503 ServiceUnavailable each time; nothing was changed"
)


def _long_retry(order_id: str) -> OrderState:
    """Pending again after its failures spent the short budget: a long retry,
    taken no sooner than NotBefore."""
    now = datetime.now(UTC) - timedelta(minutes=10)
    record = make_record(order_id, now)
    while not (record.LongRetries and record.ProcessState is ProcessState.PENDING):
        record = sm.claim(record, now, POLICY)
        now = record.CompleteBy + timedelta(seconds=1)
        record = sm.recover_expired(record, record.LockedBy, now, POLICY)
    return record


def _failed(order_id: str) -> OrderState:
    now = datetime.now(UTC) - timedelta(minutes=5)
    claimed = sm.claim(make_record(order_id, now), now, POLICY)
    return sm.mark_failed(claimed, claimed.LockedBy, None, "card declined", now)


class _Terminal(io.StringIO):
    """Stdin whose answers are echoed to the output as a terminal shows them."""

    def __init__(self, answers: str, out: io.StringIO) -> None:
        super().__init__(answers)
        self._out = out

    def readline(self, size: int | None = -1) -> str:
        line = super().readline(size)
        self._out.write(line if line.endswith("\n") else line + "\n")
        return line


@pytest.fixture
def session(monkeypatch, cosmos_account, cosmos_database, servicebus_emulator, tmp_path):
    """Runs the tool at 80 columns with `answers` on stdin; returns (exit
    code, everything it printed: the console's output and its prompts)."""
    spec = {"MaxDeliveryCount": 3, "LockDuration": "PT5S"}
    emulator = servicebus_emulator.start({q: spec for q in QUEUES})
    endpoint, key = cosmos_account.endpoint, cosmos_account.key
    for name, value in {
        "LOCAL_SETTINGS": str(tmp_path / "absent.json"),
        "CosmosDbConnection": f"AccountEndpoint={endpoint};AccountKey={key}",
        "COSMOS_VERIFY_TLS": "false",
        "STATE_DATABASE_NAME": cosmos_database,
        "ServiceBusConnection": emulator.connection_string,
        "REPLY_QUEUE_REGISTRY": '{"webshop": "replies-webshop"}',
        "ORDER_INGRESS_QUEUES": '{"webshop": "orders-webshop"}',
        "CLI_OPERATOR": "ada",
    }.items():
        monkeypatch.setenv(name, value)
    transcript: list[str] = []

    def run(*argv: str, answers: str = "") -> tuple[int, str]:
        out = io.StringIO()
        monkeypatch.setattr(tool, "console", Console(file=out, width=WIDTH))
        monkeypatch.setattr(sys, "argv", ["cli", *argv])
        monkeypatch.setattr(sys, "stdin", _Terminal(answers, out))
        monkeypatch.setattr(sys, "stdout", out)  # click's prompts, in the same stream
        try:
            code = tool.main()
        except SystemExit as done:
            code = done.code
        finally:
            monkeypatch.setattr(sys, "stdout", sys.__stdout__)
        text = out.getvalue()
        transcript.append(f"$ python -m cli {' '.join(argv)}\n{text}")
        return code, text

    run.connection = emulator.connection_string  # type: ignore[attr-defined]
    yield run
    print("\n".join(transcript))  # the session, shown when a test fails


def _narrow(text: str) -> None:
    too_wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not too_wide, too_wide


def test_pending_lists_a_long_retrys_next_try(store, session):
    record = _long_retry("CLI-LR1")
    store(lambda s: s.create_if_absent(record))
    code, text = session("list", "--state", "Pending")
    assert code == 0, text
    _narrow(text)
    assert f"next try {record.NotBefore.isoformat()} (long retry 1)" in text

    code, text = session("retry", "CLI-LR1", "--reason", "provider is back", "--yes")
    assert code == 0, text
    _narrow(text)
    assert "CLI-LR1: due now; the starter will pick it up" in text
    record, _ = store(lambda s: s.read("CLI-LR1"))
    assert record.NotBefore <= datetime.now(UTC)
    assert record.History[-1].By == "operator:ada"


def test_resubmit_and_compensate_ask_why_and_record_who(store, session):
    for oid in ("CLI-R1", "CLI-R2", "CLI-C1"):
        store(lambda s, oid=oid: s.create_if_absent(_failed(oid)))

    # answered no: nothing changes
    code, text = session("resubmit", "CLI-R1", answers="a retry budget is needed\nn\n")
    assert code == 0, text
    _narrow(text)
    assert "Resubmit CLI-R1  Error" in text
    assert "last error: card declined" in text
    assert "recorded as done by ada" in text
    assert "Why (recorded with your name):" in text
    assert text.rstrip().endswith("nothing done")
    record, _ = store(lambda s: s.read("CLI-R1"))
    assert record.ProcessState is ProcessState.ERROR

    # answered yes, with the reason typed at the prompt
    code, text = session("resubmit", "CLI-R2", answers="payment provider fixed\ny\n")
    assert code == 0, text
    _narrow(text)
    assert "CLI-R2: Pending; the starter will pick it up" in text
    record, _ = store(lambda s: s.read("CLI-R2"))
    assert record.ProcessState is ProcessState.PENDING
    assert (record.History[-1].By, record.History[-1].Reason) == (
        "operator:ada",
        "resubmitted: payment provider fixed",
    )

    # no reason: refused in one line, nothing done
    code, text = session("compensate", "CLI-C1", "--reason", "", "--yes")
    assert code == 1, text
    assert "error: say why" in text

    code, text = session(
        "compensate", "CLI-C1", "--reason", "customer cancelled", "--operator", "bo", "--yes"
    )
    assert code == 0, text
    _narrow(text)
    record, _ = store(lambda s: s.read("CLI-C1"))
    assert record.CompensationRequested
    assert record.History[-1].By == "operator:bo"
    assert record.History[-1].Reason == "compensation requested: customer cancelled"

    # nothing to answer with (a closed stdin, no --yes): not confirmed, nothing done
    code, text = session("resubmit", "CLI-R1", "--reason", "no terminal")
    assert code == 1, text
    assert "not confirmed; nothing done" in text


async def _dead_letter(connection: str, queue: str, bodies: dict[str, bytes]) -> dict[str, int]:
    async with ServiceBusClient.from_connection_string(connection) as client:
        async with client.get_queue_sender(queue) as sender:
            await sender.send_messages(
                [ServiceBusMessage(b, message_id=mid) for mid, b in bodies.items()]
            )
        async with client.get_queue_receiver(queue) as receiver:
            got: list = []
            while len(got) < len(bodies):
                got += await receiver.receive_messages(max_message_count=10, max_wait_time=3)
            for m in got:
                await receiver.dead_letter_message(
                    m, reason="RetriesExhausted", error_description=DESCRIPTION
                )
        async with client.get_queue_receiver(
            queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as dlq:
            peeked = await dlq.peek_messages(max_message_count=10)
    return {str(m.message_id): m.sequence_number for m in peeked}


async def _queue(connection: str, queue: str, dead: bool = False) -> list:
    async with ServiceBusClient.from_connection_string(connection) as client:
        sub = ServiceBusSubQueue.DEAD_LETTER if dead else None
        async with client.get_queue_receiver(queue, sub_queue=sub) as receiver:
            return list(await receiver.peek_messages(max_message_count=20))


def test_dead_letters_at_80_columns_then_resent_and_discarded(session):
    order = {
        "OrderID": "O-1",
        "Customer": {"CustomerId": "C-1", "Name": "a name long enough to need wrapping " * 3},
        "Lines": [{"Sku": f"SKU-{i}", "Quantity": i, "UnitPrice": "9.99"} for i in range(3)],
    }
    sequences = asyncio.run(
        _dead_letter(
            session.connection,
            "orders-webshop",
            {
                "submit/O-1": json.dumps(order, separators=(",", ":")).encode(),
                "submit/O-2": b'{"OrderID": "O-2"}',
            },
        )
    )

    code, text = session("deadletters")
    assert code == 0, text
    _narrow(text)
    lines = text.splitlines()
    # the per-queue counts come last, so they stay on the screen
    assert lines[-6] == "2 dead letters on 5 queues"
    assert lines[-5].split() == ["orders-webshop", "2"]
    # each dead letter with the sequence number the actions take
    assert f"#{sequences['submit/O-1']} submit/O-1 RetriesExhausted" in text
    # the JSON body indented, one field a line: no value broken across lines
    for sku in ("SKU-0", "SKU-1", "SKU-2"):
        assert any(f'"Sku": "{sku}"' in line for line in lines)
    assert "".join(DESCRIPTION.split()) in "".join(text.split())

    seq = sequences["submit/O-1"]
    code, text = session(
        "deadletters", "orders-webshop", "--resend", str(seq), answers="Cosmos is back\ny\n"
    )
    assert code == 0, text
    _narrow(text)
    assert f"dead letter {seq} of orders-webshop resent by ada" in text
    (copy,) = asyncio.run(_queue(session.connection, "orders-webshop"))
    props = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in copy.application_properties.items()
    }
    assert (props["ResentBy"], props["ResentReason"]) == ("operator:ada", "Cosmos is back")

    seq = sequences["submit/O-2"]
    code, text = session(
        "deadletters", "orders-webshop", "--discard", str(seq), "--reason", "a test", "--yes"
    )
    assert code == 0, text
    assert f"dead letter {seq} of orders-webshop discarded by ada" in text
    assert asyncio.run(_queue(session.connection, "orders-webshop", dead=True)) == []

    # a dead letter that is gone: one line
    code, text = session(
        "deadletters", "orders-webshop", "--discard", str(seq), "--reason", "again", "--yes"
    )
    assert code == 1, text
    assert text.startswith("error: no dead letter"), text


def _parked(order_id: str, reply_to: str, tries: int) -> OrderState:
    """Failed, its status parked in the outbox since 5 minutes ago."""
    record = _failed(order_id)
    assert record.PendingStatus is not None
    pending = record.PendingStatus.model_copy(update={"Tries": tries})
    return record.model_copy(update={"ReplyTo": reply_to, "PendingStatus": pending})


def test_parked_statuses_at_80_columns_then_resent(store, session):
    for oid, queue, tries in (("CLI-P1", "replies-webshop", 4), ("CLI-P2", "replies-gone", 9)):
        record = _parked(oid, queue, tries)
        store(lambda s, r=record: s.create_if_absent(r))

    code, text = session("statuses")
    assert code == 0, text
    _narrow(text)
    lines = text.splitlines()
    assert "CLI-P2  Failed" in lines  # the oldest first
    assert "  refused 9 times" in text
    # the per-queue counts last, so they stay on the screen
    tail = "\n".join(lines[-5:])
    assert "2 statuses parked on 2 reply queues" in tail
    assert "replies-gone  1, most tries 9" in tail

    # answered no: nothing sent
    code, text = session("statuses", "replies-webshop", "--resend", answers="queue is back\nn\n")
    assert code == 0, text
    assert text.rstrip().endswith("nothing done")
    record, _ = store(lambda s: s.read("CLI-P1"))
    assert record.PendingStatus is not None

    code, text = session(
        "statuses", "replies-webshop", "--resend", "--reason", "queue is back", "--yes"
    )
    assert code == 0, text
    _narrow(text)
    assert "1 resent to replies-webshop by ada" in text
    record, _ = store(lambda s: s.read("CLI-P1"))
    assert record.PendingStatus is None
    (sent,) = asyncio.run(_queue(session.connection, "replies-webshop"))
    assert sent.message_id == _parked("CLI-P1", "replies-webshop", 4).PendingStatus.MessageId

    # a queue that refuses: said in one line, one more try counted
    code, text = session(
        "statuses", "replies-gone", "--resend", "--order", "CLI-P2", "-r", "again", "--yes"
    )
    assert code == 0, text
    assert "0 resent to replies-gone by ada; the queue refused the next" in text
    record, _ = store(lambda s: s.read("CLI-P2"))
    assert record.PendingStatus is not None
    assert record.PendingStatus.Tries == 10
