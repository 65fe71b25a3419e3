"""Topics and subscriptions through the public SDK: fan-out, SQL and
correlation filters, rule actions, per-subscription TTL and dead-letter
queues, filter evaluation errors, auto-forwarding, session subscriptions,
scheduling and duplicate detection on a topic. The entities are in
Config.topics.json, in the official emulator's Config.json shape."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiver,
    ServiceBusSubQueue,
)
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import ServiceBusError, ServiceBusQuotaExceededError

from tests.fixtures.servicebus import EmulatorProcess, ServiceBusEmulator

from .helpers import body_text, receive_all

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).with_name("Config.topics.json")


@pytest.fixture(scope="module")
def topics(servicebus_emulator: ServiceBusEmulator) -> EmulatorProcess:
    return servicebus_emulator.start(CONFIG, log_level="DEBUG")


@pytest.fixture
def client(topics: EmulatorProcess) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(topics.connection_string) as sb_client:
        yield sb_client


def _drain(receiver: ServiceBusReceiver, expected: int) -> list[str]:
    """Receive and complete; the bodies, in order. Expects nothing more to arrive."""
    received = receive_all(receiver, expected)
    for message in received:
        receiver.complete_message(message)
    assert receiver.receive_messages(max_wait_time=0.5) == []
    return [body_text(m) for m in received]


def _order(body: str, **properties: object) -> ServiceBusMessage:
    subject = properties.pop("subject", None)
    content_type = properties.pop("content_type", None)
    message_id = properties.pop("message_id", None)
    return ServiceBusMessage(
        body,
        subject=subject,  # type: ignore[arg-type]
        content_type=content_type,  # type: ignore[arg-type]
        message_id=message_id,  # type: ignore[arg-type]
        application_properties=properties,  # type: ignore[arg-type]
    )


def test_a_topic_gives_each_matching_subscription_a_copy(client: ServiceBusClient) -> None:
    with client.get_topic_sender("orders-topic") as sender:
        sender.send_messages(
            [
                _order("high-order", subject="order", priority=7),
                _order("low-order", subject="order", priority=2),
                _order("high-other", subject="other", priority=8),
                _order("eu-json", content_type="application/json", region="eu", priority=1),
                _order("eu-text", content_type="text/plain", region="eu", priority=1),
                _order("acme", customer="acme-corp", priority=1),
                _order("vip", vip=True, priority=1),
                _order("vip-eu", vip=True, region="eu", priority=1),
                _order("special", message_id="special", priority=1),
            ]
        )
    expected = {
        "all": [
            "high-order",
            "low-order",
            "high-other",
            "eu-json",
            "eu-text",
            "acme",
            "vip",
            "vip-eu",
            "special",
        ],
        # SQL: comparison AND IN on a system property
        "high": ["high-order"],
        # Correlation: ContentType and a user property
        "eu": ["eu-json"],
        # SQL: LIKE, EXISTS, IS NULL, boolean literal, NOT, <>
        "patterns": ["acme", "vip", "special"],
        "tagged": [],
    }
    for subscription, bodies in expected.items():
        with client.get_subscription_receiver("orders-topic", subscription) as receiver:
            assert _drain(receiver, len(bodies)) == bodies, subscription


def test_a_rule_action_changes_the_subscription_copy_only(client: ServiceBusClient) -> None:
    with client.get_topic_sender("orders-topic") as sender:
        sender.send_messages(_order("urgent", subject="order", priority=9, secret="s3"))
    with client.get_subscription_receiver("orders-topic", "tagged") as receiver:
        [tagged] = receive_all(receiver, 1)
        assert tagged.to == "tagged"
        assert tagged.application_properties[b"seen"] == b"yes"
        assert tagged.application_properties[b"priority"] == 90
        assert b"secret" not in tagged.application_properties
        receiver.complete_message(tagged)
    with client.get_subscription_receiver("orders-topic", "all") as receiver:
        [plain] = receive_all(receiver, 1)
        assert plain.to is None
        assert plain.application_properties[b"priority"] == 9
        assert plain.application_properties[b"secret"] == b"s3"
        receiver.complete_message(plain)
    with client.get_subscription_receiver("orders-topic", "high") as receiver:
        assert _drain(receiver, 1) == ["urgent"]


def test_duplicate_detection_on_the_topic(client: ServiceBusClient) -> None:
    with client.get_topic_sender("orders-topic") as sender:
        sender.send_messages(_order("first", message_id="dup-1", priority=0))
        sender.send_messages(_order("again", message_id="dup-1", priority=0))
    with client.get_subscription_receiver("orders-topic", "all") as receiver:
        assert _drain(receiver, 1) == ["first"]


def test_ttl_and_dead_lettering_are_per_subscription(client: ServiceBusClient) -> None:
    with client.get_topic_sender("expiry-topic") as sender:
        sender.send_messages(ServiceBusMessage("short-lived"))
    time.sleep(1.5)  # the ttl-* subscriptions' DefaultMessageTimeToLive is PT1S
    with client.get_subscription_receiver("expiry-topic", "ttl-dlq") as receiver:
        assert receiver.receive_messages(max_wait_time=1) == []
    with client.get_subscription_receiver(
        "expiry-topic", "ttl-dlq", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        [dead] = receive_all(dlq, 1)
        assert dead.dead_letter_reason == "TTLExpiredException"
        assert dead.dead_letter_source.lower() == "expiry-topic/subscriptions/ttl-dlq"
        dlq.complete_message(dead)
    with client.get_subscription_receiver("expiry-topic", "ttl-drop") as receiver:
        assert receiver.receive_messages(max_wait_time=1) == []
    with client.get_subscription_receiver(
        "expiry-topic", "ttl-drop", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        assert dlq.receive_messages(max_wait_time=1) == []
    # The subscription with the topic's one-hour TTL still has it; dead-letter it by hand.
    with client.get_subscription_receiver("expiry-topic", "keep") as receiver:
        [kept] = receive_all(receiver, 1)
        receiver.dead_letter_message(kept, reason="by-hand", error_description="test")
    with client.get_subscription_receiver(
        "expiry-topic", "keep", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        [dead] = receive_all(dlq, 1)
        assert (body_text(dead), dead.dead_letter_reason) == ("short-lived", "by-hand")
        dlq.complete_message(dead)


def test_a_filter_evaluation_error_dead_letters_where_configured(
    client: ServiceBusClient,
) -> None:
    with client.get_topic_sender("error-topic") as sender:
        sender.send_messages(
            [
                _order("ok", n=2, d=2),
                _order("div-by-zero", n=1, d=0),
            ]
        )
    for subscription in ("dlq-on-error", "skip-on-error"):
        with client.get_subscription_receiver("error-topic", subscription) as receiver:
            assert _drain(receiver, 1) == ["ok"]
    with client.get_subscription_receiver(
        "error-topic", "dlq-on-error", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        [dead] = receive_all(dlq, 1)
        assert body_text(dead) == "div-by-zero"
        assert dead.dead_letter_reason == "FilterEvaluationException"
        assert "division by zero" in dead.dead_letter_error_description
        dlq.complete_message(dead)
    with client.get_subscription_receiver(
        "error-topic", "skip-on-error", sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        assert dlq.receive_messages(max_wait_time=1) == []


def test_auto_forwarding(client: ServiceBusClient) -> None:
    with client.get_queue_sender("fwd-source") as sender:
        sender.send_messages(ServiceBusMessage("via-queue"))
    with client.get_topic_sender("fwd-topic") as sender:
        sender.send_messages(ServiceBusMessage("via-subscription"))
    with client.get_queue_sender("to-topic") as sender:
        sender.send_messages(ServiceBusMessage("queue-to-topic"))
    with client.get_queue_receiver("fwd-source") as receiver:
        assert receiver.receive_messages(max_wait_time=0.5) == []  # nothing rests there
    with client.get_queue_receiver("fwd-target") as receiver:
        assert _drain(receiver, 1) == ["via-queue"]
    with client.get_queue_receiver("fwd-sub-target") as receiver:
        # queue -> topic -> subscription -> queue: three hops
        assert _drain(receiver, 2) == ["via-subscription", "queue-to-topic"]


def test_dead_lettered_messages_are_forwarded(client: ServiceBusClient) -> None:
    with client.get_queue_sender("dlq-source") as sender:
        sender.send_messages(ServiceBusMessage("poison"))
    with client.get_queue_receiver("dlq-source") as receiver:
        [poison] = receive_all(receiver, 1)
        receiver.abandon_message(poison)  # MaxDeliveryCount 1: dead-lettered now
    with client.get_queue_receiver("dlq-target") as receiver:
        [forwarded] = receive_all(receiver, 1)
        assert body_text(forwarded) == "poison"
        assert forwarded.dead_letter_reason == "MaxDeliveryCountExceeded"
        receiver.complete_message(forwarded)
    with client.get_queue_receiver("dlq-source", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        assert dlq.receive_messages(max_wait_time=0.5) == []


def test_session_subscriptions(client: ServiceBusClient) -> None:
    with client.get_topic_sender("session-topic") as sender:
        with pytest.raises(ServiceBusError, match="SessionId was not set"):
            sender.send_messages(ServiceBusMessage("no session"))
        sender.send_messages([ServiceBusMessage(f"s{i}", session_id="t") for i in range(2)])
    with client.get_subscription_receiver("session-topic", "sessions", session_id="t") as r:
        assert _drain(r, 2) == ["s0", "s1"]
    with client.get_subscription_receiver("session-topic", "plain") as receiver:
        assert _drain(receiver, 2) == ["s0", "s1"]  # the refused send left nothing behind


def test_a_send_a_subscription_has_no_room_for_is_refused_whole_and_can_be_retried(
    topics: EmulatorProcess,
) -> None:
    """A send to a topic is atomic: every subscription gets its copy, or the sender gets
    the quota error, nothing is kept and the id is not recorded, so the retry is taken."""
    with ServiceBusClient.from_connection_string(topics.connection_string, retry_total=0) as client:
        for topic, tight_receiver in (
            ("quota-topic", lambda: client.get_subscription_receiver("quota-topic", "tight")),
            ("quota-fwd-topic", lambda: client.get_queue_receiver("quota-tight-queue")),
        ):
            with client.get_topic_sender(topic) as sender:
                sender.send_messages(ServiceBusMessage("first", message_id=f"{topic}-1"))
                with pytest.raises(ServiceBusQuotaExceededError):  # the tight one holds one
                    sender.send_messages(ServiceBusMessage("second", message_id=f"{topic}-2"))
                with pytest.raises(ServiceBusQuotaExceededError):  # a batch: all or nothing
                    sender.send_messages(
                        [ServiceBusMessage(f"b{i}", message_id=f"{topic}-b{i}") for i in range(2)]
                    )
            with client.get_subscription_receiver(topic, "roomy") as receiver:
                assert _drain(receiver, 1) == ["first"]  # nothing of the refused sends
            with tight_receiver() as receiver:
                assert _drain(receiver, 1) == ["first"]
            with client.get_topic_sender(topic) as sender:  # the sender's retry, same id
                sender.send_messages(ServiceBusMessage("second", message_id=f"{topic}-2"))
            with client.get_subscription_receiver(topic, "roomy") as receiver:
                assert _drain(receiver, 1) == ["second"]
            with tight_receiver() as receiver:
                assert _drain(receiver, 1) == ["second"]
            with client.get_topic_sender(topic) as sender:  # and now it is a duplicate
                sender.send_messages(ServiceBusMessage("again", message_id=f"{topic}-2"))
            with client.get_subscription_receiver(topic, "roomy") as receiver:
                assert receiver.receive_messages(max_wait_time=0.5) == []


def test_scheduling_and_cancelling_on_a_topic(client: ServiceBusClient) -> None:
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)
    with client.get_topic_sender("schedule-topic") as sender:
        [kept] = sender.schedule_messages(ServiceBusMessage("scheduled"), soon)
        [cancelled] = sender.schedule_messages(ServiceBusMessage("cancelled"), later)
        assert kept != cancelled
        sender.cancel_scheduled_messages(cancelled)
    for subscription in ("one", "two"):
        with client.get_subscription_receiver("schedule-topic", subscription) as receiver:
            assert [m.sequence_number for m in receiver.peek_messages(10)] != []
            assert _drain(receiver, 1) == ["scheduled"]
            assert receiver.peek_messages(10) == []  # the cancelled copy is gone too


def test_what_a_topic_cannot_do_is_refused_at_open(client: ServiceBusClient) -> None:
    with (
        pytest.raises(ServiceBusError, match="Cannot receive from the topic"),
        client.get_queue_receiver("orders-topic"),
    ):
        pass
    with (
        pytest.raises(ServiceBusError, match="Cannot send to the subscription"),
        client.get_queue_sender("orders-topic/Subscriptions/all") as sender,
    ):
        sender.send_messages(ServiceBusMessage("x"))


async def test_topics_through_the_async_client(topics: EmulatorProcess) -> None:
    async with AsyncServiceBusClient.from_connection_string(topics.connection_string) as client:
        async with client.get_topic_sender("orders-topic") as sender:
            await sender.send_messages(_order("async-high", subject="refund", priority=6))
        for subscription in ("high", "all"):
            async with client.get_subscription_receiver(
                "orders-topic", subscription, max_wait_time=5
            ) as receiver:
                [message] = await receiver.receive_messages(max_wait_time=5)
                assert str(message) == "async-high"
                await receiver.complete_message(message)


@pytest.mark.slow
def test_subscription_messages_and_topic_numbering_survive_a_restart(
    servicebus_emulator: ServiceBusEmulator, tmp_path: Path
) -> None:
    emulator = servicebus_emulator.start(CONFIG, data_dir=tmp_path / "data")
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_topic_sender("schedule-topic") as sender,
    ):
        sender.send_messages(ServiceBusMessage("before", message_id="b"))
    emulator.kill()
    emulator.restart()
    with ServiceBusClient.from_connection_string(emulator.connection_string) as client:
        with client.get_topic_sender("schedule-topic") as sender:
            sender.send_messages(ServiceBusMessage("after", message_id="a"))
        for subscription in ("one", "two"):
            with client.get_subscription_receiver("schedule-topic", subscription) as receiver:
                received = receive_all(receiver, 2)
                assert [body_text(m) for m in received] == ["before", "after"]
                assert received[0].sequence_number < received[1].sequence_number
                for message in received:
                    receiver.complete_message(message)
    emulator.stop()
