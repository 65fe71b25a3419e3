"""The message gate's back-off copy against the Service Bus emulator (the
project's Config.json): when the settlement after scheduling a copy fails,
the original comes back while its copy lives on. What keeps that to one page
(simulation seeds 100271 and 263, issue 21): the copy is named by the
original (`retry/seq-N/k/...`) and alerts under the original's alert id, so
the alerts queue drops the second alert of the two lineages; the agents'
queues keep a message an hour (DefaultMessageTimeToLive PT1H), far inside the
alerts queue's one-day duplicate window. A redelivered original that fails
again makes a copy of its own (named by its delivery, ADR 021i): a copy named
by the message alone was dropped as a duplicate of one that may already have
run, and nothing came after that delivery's failure (simulation seed
5000216)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from azure.servicebus import ServiceBusReceiveMode

from adapters.servicebus import ServiceBusPublisher
from adapters.settlement import BackoffPolicy, MessageGate, Settle, _delivery_name
from devstack.servicebus.config import QueueSettings, load_config
from domain.errors import TransientError
from reporting import Alerts
from tests.fixtures.servicebus import PROJECT_CONFIG
from tests.integration.app_env import Bus

pytestmark = pytest.mark.timeout(120)

QUEUE = "agent-responses"  # where forged replies arrive


class AlertsDown:
    """The publisher with the alerts queue unreachable while `down` (the
    product's own publisher underneath: every other send is real)."""

    def __init__(self, publisher: ServiceBusPublisher) -> None:
        self._publisher = publisher
        self.down = True
        self.tried: list[str] = []

    async def send(self, queue: str, body: bytes, message_id: str, *args: Any, **kw: Any) -> None:
        if queue == "alerts":
            self.tried.append(message_id)
            if self.down:
                raise TransientError("alerts queue unreachable")
        await self._publisher.send(queue, body, message_id, *args, **kw)

    async def schedule(self, *args: Any, **kw: Any) -> None:
        await self._publisher.schedule(*args, **kw)


class SettleFailsOnce:
    """The trigger's message actions whose first settlement fails (the link
    dropped before it): the message stays locked, as on the broker."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def complete(self, message) -> None:
        self.calls.append("complete")
        if self.calls.count("complete") == 1:
            raise ConnectionError("complete: link detached")

    def abandon(self, message) -> None:
        self.calls.append("abandon")

    def deadletter(self, message, deadletter_reason=None, deadletter_error_description=None):
        self.calls.append(f"deadletter {deadletter_reason}")


async def _refused(body: bytes) -> Settle:
    return Settle.dead_letter("ForgedReply", "no proof of origin")


async def _receive(bus: Bus, queue: str, wait: float = 10):
    receiver = bus.client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK)
    await receiver.__aenter__()
    messages = await receiver.receive_messages(max_message_count=1, max_wait_time=wait)
    assert messages, f"no message on {queue}"
    return receiver, messages[0]


async def _settle_as(receiver, message, calls: list[str]) -> None:
    last = calls[-1]
    if last == "complete":
        await receiver.complete_message(message)
    elif last.startswith("deadletter"):
        await receiver.dead_letter_message(message, reason=last.split()[1])
    else:
        await receiver.abandon_message(message)
    await receiver.__aexit__(None, None, None)


def test_the_agents_queues_keep_a_message_far_less_long_than_alerts_are_deduplicated():
    """The bound the one page rests on: a lineage of copies on an agent queue
    (each copy lives its queue's time to live at most, plus its back-off
    delay) ends well inside the alerts queue's duplicate-detection window."""
    queues = {e.name: e for e in load_config(PROJECT_CONFIG) if isinstance(e, QueueSettings)}
    window = queues["alerts"].duplicate_window
    delays = BackoffPolicy().delays
    for name in ("agent-requests", "agent-responses"):
        lineage = (len(delays) + 1) * queues[name].default_ttl + sum(delays)
        assert queues[name].dead_letter_on_expiration
        assert lineage < window, (name, lineage, window)


async def test_a_copy_outliving_its_failed_complete_and_the_original_page_once(
    servicebus_emulator,
):
    bus = Bus(servicebus_emulator.connection_string)
    publisher = ServiceBusPublisher(bus.client)
    try:
        channel = AlertsDown(publisher)
        gate = MessageGate(QUEUE, Alerts(channel), channel, BackoffPolicy((1.0, 1.0), 5))
        mid = f"forged/{uuid.uuid4().hex[:10]}"
        body = json.dumps({"Outcome": "ok", "Nonce": mid}).encode()
        await bus.send(QUEUE, body, message_id=mid)

        # Delivery 1: refused, its alert cannot be queued, so a copy is
        # scheduled; then the complete fails and the original comes back.
        receiver, message = await _receive(bus, QUEUE)
        seq = message.sequence_number
        # Named while the delivery holds its lock (the SDK forgets the token once settled).
        copy_ids = [f"retry/seq-{seq}/1/seq-{seq}.{_delivery_name(message)}"]
        actions = SettleFailsOnce()
        with pytest.raises(ConnectionError):
            await gate.run(message, actions, _refused)
        await receiver.abandon_message(message)
        await receiver.__aexit__(None, None, None)

        # Delivery 2, alerts still down: a copy of its own; this complete
        # goes through. Two lineages now, each with one copy.
        receiver, again = await _receive(bus, QUEUE)
        assert again.message_id == mid
        assert again.delivery_count == 1
        copy_ids = sorted([*copy_ids, f"retry/seq-{seq}/1/seq-{seq}.{_delivery_name(again)}"])
        assert len(set(copy_ids)) == 2  # each delivery its own lock, so its own copy
        await gate.run(again, actions, _refused)
        assert actions.calls[-1] == "complete"
        await _settle_as(receiver, again, actions.calls)

        # Alerts up now: each copy alerts under the original's id.
        channel.down = False
        seen = []
        for _ in copy_ids:
            receiver, copy = await _receive(bus, QUEUE)
            seen.append(copy.message_id)
            await gate.run(copy, actions, _refused)
            assert actions.calls[-1] == "deadletter ForgedReply"
            await _settle_as(receiver, copy, actions.calls)
        assert sorted(seen) == copy_ids
        await asyncio.sleep(1.5)  # past the copies' back-off delay: nothing else comes
        assert [m for m in await bus.drain(QUEUE, wait=0.5) if m.get("Nonce") == mid] == []
        # Two tries while the queue was down, one by the first copy; the
        # second copy's alert this process already sent (reporting.alerts
        # counts an alert id once). Another process would send it again, and
        # the alerts queue drops it (below).
        assert len(channel.tried) == 3
        assert len(set(channel.tried)) == 1

        # The alerts queue kept the first of the two lineages' alerts, and
        # drops any further one under that id.
        [alert_id] = set(channel.tried)
        await publisher.send("alerts", b'{"Kind": "ForgedReply"}', alert_id)
        alerts = [a for a in await bus.drain("alerts", wait=0.5) if a["_message_id"] == alert_id]
        assert [(a["Kind"], a.get("MessageId")) for a in alerts] == [("ForgedReply", seen[0])]
    finally:
        await publisher.close()
        await bus.close()
