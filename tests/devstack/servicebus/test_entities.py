"""The broker's rules without sockets: a fake clock and a fake consumer drive
entities.Broker directly (fast, deterministic)."""

from __future__ import annotations

import pytest

from devstack.servicebus.codec import parse_message
from devstack.servicebus.config import QueueSettings
from devstack.servicebus.entities import Broker, LockLost, QuotaExceeded, StoredMessage

# A minimal encoded message: properties with message-id "m", a Data body "x".
_PROPERTIES = b"\x00\x53\x73\xc0\x04\x01\xa1\x01m"
_BODY = b"\x00\x53\x75\xa0\x01x"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class FakeConsumer:
    def __init__(self, peek_lock: bool = True) -> None:
        self.peek_lock = peek_lock
        self.credit = 100
        self.got: list = []
        self.counts: list[int] = []

    def has_credit(self) -> bool:
        return self.credit > 0

    def deliver(self, message: StoredMessage, payload: bytes, lock) -> None:
        self.credit -= 1
        self.got.append((message, lock))
        self.counts.append(
            message.delivery_count
        )  # the message object changes later; keep the count seen


def _broker(**settings) -> tuple[Broker, FakeClock]:
    clock = FakeClock()
    return Broker([QueueSettings(name="q", **settings)], clock=clock), clock


def _send(broker: Broker, body: bytes = _PROPERTIES + _BODY) -> int | None:
    return broker.queues["q"].accept(parse_message(body), broker.clock())


def test_parses_the_message_id_and_keeps_the_body_bytes() -> None:
    parsed = parse_message(_PROPERTIES + _BODY)
    assert parsed.message_id == "m"
    assert parsed.body_raw == _BODY
    assert parsed.properties_raw == _PROPERTIES


def test_lock_expiry_redelivers_then_dead_letters_at_max_delivery_count() -> None:
    broker, clock = _broker(lock_duration=1, max_delivery_count=2)
    consumer = FakeConsumer()
    broker.queues["q"].add_consumer(consumer)
    _send(broker)
    broker.queues["q"].pump()
    assert consumer.counts == [0]
    clock.now += 1001
    broker.run_timers()
    assert consumer.counts == [0, 1]
    clock.now += 1001
    broker.run_timers()
    assert len(consumer.got) == 2
    [dead] = broker.queues["q/$deadletterqueue"].messages.values()
    assert dead.dead_letter_source == "q"
    assert b"MaxDeliveryCountExceeded" in dead.body.app_items


def test_settling_an_expired_lock_is_lock_lost() -> None:
    broker, clock = _broker(lock_duration=1)
    consumer = FakeConsumer()
    broker.queues["q"].add_consumer(consumer)
    _send(broker)
    broker.queues["q"].pump()
    _, lock = consumer.got[0]
    clock.now += 5000
    broker.run_timers()
    with pytest.raises(LockLost):
        broker.settle(lock.token, "complete")


def test_renewal_moves_the_expiry() -> None:
    broker, clock = _broker(lock_duration=1)
    consumer = FakeConsumer()
    broker.queues["q"].add_consumer(consumer)
    _send(broker)
    broker.queues["q"].pump()
    _, lock = consumer.got[0]
    clock.now += 900
    assert broker.renew(lock.token) == clock.now + 1000
    clock.now += 900
    broker.run_timers()
    broker.settle(lock.token, "complete")
    assert broker.queues["q"].messages == {}


def test_duplicates_are_dropped_within_the_window_only() -> None:
    broker, clock = _broker(requires_duplicate_detection=True, duplicate_window=10)
    assert _send(broker) == 1
    assert _send(broker) is None
    clock.now += 10_001
    assert _send(broker) == 2


def test_message_count_limit() -> None:
    broker, _ = _broker(max_message_count=1)
    _send(broker)
    with pytest.raises(QuotaExceeded):
        _send(broker)


def test_timers_of_settled_messages_do_not_accumulate() -> None:
    broker, _ = _broker()
    consumer = FakeConsumer(peek_lock=False)
    consumer.credit = 10**9
    broker.queues["q"].add_consumer(consumer)
    for _ in range(20_000):
        _send(broker)
        broker.queues["q"].pump()  # receive-and-delete: gone at once
    assert broker.queues["q"].messages == {}
    assert len(broker._timers) <= 10_001
