"""Generate the official Service Bus emulator's Config.json from the project's.

devstack/servicebus/Config.json is the one source of truth for the local
queues: the project's own AMQP emulator reads it as written, and
tests/infra/test_queues.py holds it to the queues infra/ deploys. The official
emulator (docker-compose.yml) refuses to start on values beyond its schema's
limits (TTL at most PT1H, duplicate-detection window at most PT5M, ...) and on
properties it does not know, so this module writes a copy it accepts:

- every duration is clamped into the range the official schema states;
- MaxDeliveryCount is clamped into 1..10;
- the project-only properties (MaxSizeInMegabytes, MaxMessageCount) are dropped.

The limits are read from the official JSON Schema, vendored next to this file
(servicebus-config.schema.json, from github.com/Azure/azure-service-bus-emulator-installer,
ServiceBus-Emulator/Schema/Config-schema.json at commit 40fb40fb48a81b21),
whose descriptions state them.

    python -m devstack.docker.servicebus_config           # write the file
    python -m devstack.docker.servicebus_config --check   # exit 1 if stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from devstack.servicebus.config import parse_duration

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "devstack" / "servicebus" / "Config.json"
TARGET = Path(__file__).resolve().parent / "servicebus-config.json"
SCHEMA = Path(__file__).resolve().parent / "servicebus-config.schema.json"

_RANGE = re.compile(r"minimum value is (P[0-9A-Z]+) \(.*?maximum value is (P[0-9A-Z]+)")


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA.read_text(encoding="utf-8"))


def queue_property_schema(schema: dict[str, Any]) -> dict[str, Any]:
    namespaces = schema["properties"]["UserConfig"]["properties"]["Namespaces"]["items"]
    queue = namespaces["properties"]["Queues"]["items"]
    return queue["properties"]["Properties"]["properties"]


def duration_limits(schema: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """{property: (min seconds, max seconds)} for each queue duration the schema bounds in words."""
    limits = {}
    for name, spec in queue_property_schema(schema).items():
        match = _RANGE.search(spec.get("description", ""))
        if match:
            limits[name] = (parse_duration(match.group(1)), parse_duration(match.group(2)))
    return limits


def format_duration(seconds: float) -> str:
    """Whole seconds as the shortest ISO 8601 duration: PT1H, PT5M, PT90S."""
    seconds = int(seconds)
    if seconds % 3600 == 0:
        return f"PT{seconds // 3600}H"
    if seconds % 60 == 0:
        return f"PT{seconds // 60}M"
    return f"PT{seconds}S"


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def official_config(source: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The project's config document, made acceptable to the official emulator."""
    known = queue_property_schema(schema)
    limits = duration_limits(schema)
    count = known["MaxDeliveryCount"]
    namespaces = []
    for namespace in source["UserConfig"]["Namespaces"]:
        queues = []
        for queue in namespace.get("Queues") or []:
            props = {}
            for key, value in (queue.get("Properties") or {}).items():
                if key not in known:
                    continue  # project-only extension (size and count limits)
                if key in limits and value:
                    value = format_duration(_clamp(parse_duration(value), *limits[key]))
                elif key == "MaxDeliveryCount":
                    value = int(_clamp(value, count["minimum"], count["maximum"]))
                props[key] = value
            queues.append({"Name": queue["Name"], "Properties": props})
        namespaces.append(
            {"Name": namespace["Name"], "Queues": queues, "Topics": namespace.get("Topics") or []}
        )
    return {
        "UserConfig": {
            "Namespaces": namespaces,
            "Logging": source["UserConfig"].get("Logging", {"Type": "File"}),
        }
    }


def render() -> str:
    document = official_config(json.loads(SOURCE.read_text(encoding="utf-8")), load_schema())
    return json.dumps(document, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is not current")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(
                f"{TARGET.relative_to(ROOT)} is stale: run python -m devstack.docker.servicebus_config"
            )
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
