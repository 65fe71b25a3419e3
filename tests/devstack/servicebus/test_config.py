"""Config.json parsing: the official emulator's vocabulary, durations, defaults."""

from __future__ import annotations

import pytest

from devstack.servicebus.config import ConfigError, load_config, parse_config, parse_duration
from tests.fixtures.servicebus import PROJECT_CONFIG


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("PT1M", 60),
        ("PT2S", 2),
        ("PT0.5S", 0.5),
        ("P1D", 86400),
        ("PT1H", 3600),
        ("P7D", 604800),
        ("P1DT1H1M1S", 90061),
    ],
)
def test_parses_iso8601_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "P", "PT", "1M", "PT1X", "soon"])
def test_rejects_malformed_durations(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


def test_reads_the_project_config_with_its_queue_names() -> None:
    queues = {q.name: q for q in load_config(PROJECT_CONFIG)}
    # No shared `orders` queue: each application sends to its own (issue 17).
    assert set(queues) == {
        "orders-webshop",
        "orders-partner-portal",
        "orders-smoke",
        "agent-requests",
        "agent-responses",
        "alerts",
        "replies-webshop",
        "replies-partner-portal",
        "replies-smoke",
    }
    orders = queues["orders-webshop"]
    assert orders.lock_duration == 60
    assert orders.max_delivery_count == 5
    assert orders.requires_duplicate_detection
    assert orders.duplicate_window == 600
    assert orders.dead_letter_on_expiration
    assert orders.default_ttl == 86400
    # A repeated alert of one incident keeps its id: detection pages once a day at most.
    assert queues["alerts"].requires_duplicate_detection
    assert queues["alerts"].duplicate_window == 86400


def test_every_registered_application_has_an_ingress_queue_alike() -> None:
    """Submit takes an order's AppId from its ingress queue: each application
    of the template's REPLY_QUEUE_REGISTRY needs the queue Submit reads
    (the template's ORDER_INGRESS_QUEUES), all with the same properties."""
    import dataclasses
    import json

    from adapters.settings import ingress_queues
    from devstack.stack import TEMPLATE

    values = json.loads(TEMPLATE.read_text())["Values"]
    wanted = ingress_queues(values)
    assert set(wanted) == set(json.loads(values["REPLY_QUEUE_REGISTRY"]))
    queues = {q.name: q for q in load_config(PROJECT_CONFIG)}
    first = queues[next(iter(wanted.values()))]
    for queue in wanted.values():
        assert dataclasses.replace(queues[queue], name=first.name) == first, queue


def test_applies_defaults_and_limits() -> None:
    document = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Queues": [
                        {"Name": "a"},
                        {
                            "Name": "b",
                            "Properties": {"MaxSizeInMegabytes": 2, "MaxMessageCount": 7},
                        },
                    ]
                }
            ]
        }
    }
    a, b = parse_config(document)
    assert (a.lock_duration, a.max_delivery_count, a.max_message_count) == (60, 10, None)
    assert (b.max_size_bytes, b.max_message_count) == (2 * 1024 * 1024, 7)


@pytest.mark.parametrize(
    "document",
    [
        {},
        {"UserConfig": {"Namespaces": [{"Queues": [{"Name": "a"}, {"Name": "A"}]}]}},
        {"UserConfig": {"Namespaces": [{"Queues": [{"Properties": {}}]}]}},
    ],
)
def test_rejects_bad_configs(document: dict) -> None:
    with pytest.raises(ConfigError):
        parse_config(document)


def test_reads_sessions_and_forwarding() -> None:
    queue, _ = parse_config(
        {
            "UserConfig": {
                "Namespaces": [
                    {
                        "Queues": [
                            {
                                "Name": "s",
                                "Properties": {
                                    "RequiresSession": True,
                                    "ForwardTo": "",
                                    "ForwardDeadLetteredMessagesTo": "dead-ends",
                                },
                            },
                            {"Name": "dead-ends"},
                        ]
                    }
                ]
            }
        }
    )
    assert queue.requires_session
    assert queue.forward_to is None  # the official emulator writes "" for "none"
    assert queue.forward_dead_lettered_to == "dead-ends"


def _one_queue(props: dict) -> dict:
    return {
        "UserConfig": {
            "Namespaces": [{"Name": "ns", "Queues": [{"Name": "q", "Properties": props}]}]
        }
    }


@pytest.mark.parametrize("window", ["PT20S", "PT10M", "P7D"])
def test_a_duplicate_detection_window_within_azure_range_is_taken(window: str) -> None:
    """Azure: "Max value is 7 days and minimum is 20 seconds" (QueueProperties.
    DuplicateDetectionHistoryTimeWindow, Azure.Messaging.ServiceBus.Administration)."""
    [queue] = parse_config(_one_queue({"DuplicateDetectionHistoryTimeWindow": window}))
    assert queue.duplicate_window == parse_duration(window)


@pytest.mark.parametrize("window", ["PT1S", "PT19S", "P7DT1S", "P8D"])
def test_a_duplicate_detection_window_outside_azure_range_is_refused(window: str) -> None:
    """Below Azure's 20 s minimum or above its 7-day maximum: refused, as Azure refuses it."""
    with pytest.raises(ConfigError, match=r"outside Azure's range, 20 seconds \(PT20S\) to 7 days"):
        parse_config(_one_queue({"DuplicateDetectionHistoryTimeWindow": window}))
    topic = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "ns",
                    "Topics": [
                        {"Name": "t", "Properties": {"DuplicateDetectionHistoryTimeWindow": window}}
                    ],
                }
            ]
        }
    }
    with pytest.raises(ConfigError, match="topic 't'"):
        parse_config(topic)
