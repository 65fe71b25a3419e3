"""The official Service Bus emulator's config is generated from the project's
one source of truth (devstack/servicebus/Config.json), is current, and stays
inside the official schema and the limits its descriptions state; the
project's own emulator still reads both files."""

from __future__ import annotations

import json

import jsonschema
import pytest

from devstack.docker import servicebus_config as gen
from devstack.servicebus.config import load_config, parse_duration
from tests.infra.bicep_model import COMPOSE

MAX_ENTITIES = 50  # "Max Queues + Topics per namespace is 50"


def python_schema() -> dict:
    """The official schema with its name pattern spelled for Python's re.

    `[\\w-\\.\\/]` (a class escape before `-`) is read by .NET, the
    emulator's own engine, as "word characters, '-', '.', '/"'; Python's re
    refuses it as a bad range. Escaping the `-` says the same thing to both."""
    text = gen.SCHEMA.read_text()
    dotnet, python = r"[\\w-\\.\\/]", r"[\\w\\-\\.\\/]"
    assert dotnet in text
    return json.loads(text.replace(dotnet, python))


def generated() -> dict:
    return json.loads(gen.TARGET.read_text())


def limit_violations(document: dict) -> list[str]:
    """Every value beyond what the official schema states in words or keywords."""
    schema = gen.load_schema()
    limits = gen.duration_limits(schema)
    count = gen.queue_property_schema(schema)["MaxDeliveryCount"]
    problems = []
    for ns in document["UserConfig"]["Namespaces"]:
        if len(ns.get("Queues", [])) + len(ns.get("Topics", [])) > MAX_ENTITIES:
            problems.append(f"{ns['Name']}: more than {MAX_ENTITIES} entities")
        for queue in ns.get("Queues", []):
            for key, value in queue.get("Properties", {}).items():
                if key in limits and value:
                    low, high = limits[key]
                    if not low <= parse_duration(value) <= high:
                        problems.append(f"{queue['Name']}.{key}={value}")
                if key == "MaxDeliveryCount" and not count["minimum"] <= value <= count["maximum"]:
                    problems.append(f"{queue['Name']}.{key}={value}")
                if key not in gen.queue_property_schema(schema):
                    problems.append(f"{queue['Name']}.{key}: unknown to the official emulator")
    return problems


def test_vendored_schema_is_a_valid_draft7_schema_and_states_limits():
    schema = gen.load_schema()
    jsonschema.Draft7Validator.check_schema(python_schema())
    assert set(gen.duration_limits(schema)) == {
        "DefaultMessageTimeToLive",
        "DuplicateDetectionHistoryTimeWindow",
        "LockDuration",
    }


def test_generated_config_is_current():
    assert gen.TARGET.read_text() == gen.render(), "run python -m devstack.docker.servicebus_config"
    assert gen.main(["--check"]) == 0


def test_generated_config_validates_against_the_official_schema():
    jsonschema.Draft7Validator(python_schema()).validate(generated())


def test_generated_config_is_within_the_stated_limits():
    assert limit_violations(generated()) == []


def test_the_source_itself_is_beyond_those_limits():
    """Why the copy exists: mounting the project's file stops the official emulator."""
    problems = limit_violations(json.loads(gen.SOURCE.read_text()))
    assert any("DefaultMessageTimeToLive=P1D" in p for p in problems), problems
    assert any("DuplicateDetectionHistoryTimeWindow=PT1H" in p for p in problems), problems


@pytest.mark.parametrize(
    ("value", "expected"),
    [("P7D", "PT1H"), ("PT1M", "PT5M"), ("PT30M", "PT30M")],
)
def test_ttl_is_clamped_into_range(value: str, expected: str):
    source = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "sbemulatorns",
                    "Queues": [
                        {
                            "Name": "q",
                            "Properties": {
                                "DefaultMessageTimeToLive": value,
                                "MaxDeliveryCount": 50,
                                "MaxMessageCount": 3,
                            },
                        }
                    ],
                }
            ],
            "Logging": {"Type": "File"},
        }
    }
    (queue,) = gen.official_config(source, gen.load_schema())["UserConfig"]["Namespaces"][0][
        "Queues"
    ]
    assert queue["Properties"] == {"DefaultMessageTimeToLive": expected, "MaxDeliveryCount": 10}


def test_a_broken_generator_fails_the_schema_checks():
    bad = generated()
    bad["UserConfig"]["Namespaces"][0]["Queues"][0]["Properties"]["MaxDeliveryCount"] = 11
    bad["UserConfig"]["Namespaces"][0]["Queues"][1]["Properties"]["DefaultMessageTimeToLive"] = (
        "P1D"
    )
    assert len(limit_violations(bad)) == 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(python_schema()).validate(bad)


def test_same_queues_and_both_files_read_by_the_projects_emulator():
    source = {q.name: q for q in load_config(gen.SOURCE)}
    copy = {q.name: q for q in load_config(gen.TARGET)}
    assert list(source) == list(copy)
    for name in source:
        assert copy[name].requires_duplicate_detection == source[name].requires_duplicate_detection
        assert copy[name].max_delivery_count == source[name].max_delivery_count


def test_compose_mounts_the_generated_file():
    mount = (
        '"./devstack/docker/servicebus-config.json:/ServiceBus_Emulator/ConfigFiles/Config.json:ro"'
    )
    assert mount in COMPOSE.read_text()
    assert "./devstack/servicebus/Config.json:" not in COMPOSE.read_text()
