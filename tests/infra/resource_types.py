"""Checks resource bodies of the Bicep templates against Azure's published
resource type definitions: the bicep-types-az format (generated/<provider>/
<namespace>/<api version>/types.json of the Azure/bicep-types-az repository,
which the Bicep compiler itself checks bodies against).

What it finds, for each resource the templates declare (not `existing` ones)
and each object inside its body: a property the type does not have; a write
to a ReadOnly property; a Required property left out; a literal string
outside the values a string-literal union allows. Values that are
expressions (parameters, variables, function calls) are not evaluated: only
literals are compared, and objects and arrays are followed. pycep drops child
resources declared inside their parent, so those are not checked here.

Where the definitions come from: BICEP_TYPES_AZ (the repository's
`generated` folder, or the repository), else <repo>/../shared/bicep-types-az.
They are not in this repository (docs/deploying.md, "Checking the
templates")."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tests.infra.bicep_model import ROOT, parse

REQUIRED, READ_ONLY = 1, 2
# Keys of a Bicep resource declaration that are not part of the ARM body.
BICEP_ONLY = {"parent", "scope", "dependsOn", "depends_on"}


def types_root() -> Path | None:
    given = os.environ.get("BICEP_TYPES_AZ")
    candidates = [Path(given)] if given else [ROOT.parent / "shared" / "bicep-types-az"]
    for base in candidates:
        for root in (base / "generated", base):
            if root.is_dir() and any(root.glob("*/*/*/types.json")):
                return root
    return None


@dataclass(frozen=True)
class Types:
    """One types.json: its list of types, addressed by `#/N` references."""

    items: list[dict[str, Any]]
    source: Path

    def get(self, ref: dict[str, str]) -> dict[str, Any]:
        return self.items[int(ref["$ref"].removeprefix("#/"))]


@cache
def _load(path: Path) -> Types:
    return Types(json.loads(path.read_text()), path)


def resource_type(root: Path, rtype: str, version: str) -> tuple[Types, dict[str, Any]] | None:
    """The published body type of `rtype@version`, or None when none is published."""
    namespace = rtype.split("/")[0].lower()
    for path in sorted(root.glob(f"*/{namespace}/{version}/types.json")):
        types = _load(path)
        for item in types.items:
            if item.get("$type") == "ResourceType" and item["name"] == f"{rtype}@{version}":
                return types, types.get(item["body"])
    return None


def _unwrap(config: dict[str, Any]) -> dict[str, Any]:
    while "loop_type" in config or "condition" in config:
        config = config["config"]
    return config


def _is_literal(value: Any, names: set[str]) -> bool:
    return isinstance(value, str) and value not in names and "${" not in value


def _allowed_literals(types: Types, kind: dict[str, Any]) -> set[str] | None:
    """The string values a type allows, or None when it is not a closed set."""
    if kind["$type"] == "StringLiteralType":
        return {kind["value"]}
    if kind["$type"] == "UnionType":
        values: set[str] = set()
        for element in kind["elements"]:
            inner = types.get(element)
            if inner["$type"] != "StringLiteralType":
                return None
            values.add(inner["value"])
        return values
    return None


def _object_properties(
    types: Types, kind: dict[str, Any], value: dict[str, Any]
) -> tuple[dict, Any]:
    """(properties, additionalProperties) of an object type; a discriminated
    one picks its element by the discriminator's literal value when it can."""
    if kind["$type"] == "DiscriminatedObjectType":
        props = dict(kind.get("baseProperties", {}))
        chosen = value.get(kind["discriminator"])
        if isinstance(chosen, str) and chosen in kind["elements"]:
            props.update(types.get(kind["elements"][chosen])["properties"])
        else:  # not a literal: any element's properties may appear, none required
            for ref in kind["elements"].values():
                for key, spec in types.get(ref)["properties"].items():
                    props.setdefault(key, {**spec, "flags": spec.get("flags", 0) & ~REQUIRED})
        props[kind["discriminator"]] = {"type": None, "flags": REQUIRED}
        return props, None
    return kind.get("properties", {}), kind.get("additionalProperties")


def _expression(value: Any) -> dict[str, Any] | None:
    """pycep's form of an operator or function call (not an object that has a
    property named operator or function)."""
    if isinstance(value, dict) and len(value) == 1:
        inner = value.get("operator") or value.get("function")
        if isinstance(inner, dict) and "type" in inner:
            return inner
    return None


def check_value(
    types: Types, kind: dict[str, Any] | None, value: Any, where: str, names: set[str]
) -> list[str]:
    if kind is None or value is None:
        return []
    expression = _expression(value)
    if expression is not None and expression["type"] == "conditional":
        ops = expression["operands"]
        return check_value(types, kind, ops["true_value"], where, names) + check_value(
            types, kind, ops["false_value"], where, names
        )
    if expression is not None:
        return []  # an expression: not evaluated
    if kind["$type"] in ("ObjectType", "DiscriminatedObjectType") and isinstance(value, dict):
        return check_object(types, kind, value, where, names)
    if kind["$type"] == "ArrayType" and isinstance(value, list):
        item = types.get(kind["itemType"])
        return [
            p
            for i, v in enumerate(value)
            for p in check_value(types, item, v, f"{where}[{i}]", names)
        ]
    if kind["$type"] == "UnionType" and isinstance(value, dict):
        objects = [types.get(e) for e in kind["elements"]]
        objects = [o for o in objects if o["$type"] in ("ObjectType", "DiscriminatedObjectType")]
        return check_value(types, objects[0], value, where, names) if len(objects) == 1 else []
    allowed = _allowed_literals(types, kind)
    if allowed is not None and _is_literal(value, names) and value not in allowed:
        return [f"{where}: {value!r} is not one of {sorted(allowed)}"]
    return []


def check_object(
    types: Types, kind: dict[str, Any], value: dict[str, Any], where: str, names: set[str]
) -> list[str]:
    # pycep keeps the quotes of a quoted key ('odata.type').
    value = {_unquote(k): v for k, v in value.items()}
    props, additional = _object_properties(types, kind, value)
    problems = []
    for key, given in value.items():
        spec = props.get(key)
        if spec is None:
            if additional is None:
                problems.append(
                    f"{where}.{key}: no such property in {kind.get('name', 'the type')}"
                )
            continue
        if spec.get("flags", 0) & READ_ONLY:
            problems.append(f"{where}.{key}: read-only")
            continue
        inner = types.get(spec["type"]) if spec.get("type") else None
        problems += check_value(types, inner, given, f"{where}.{key}", names)
    for key, spec in props.items():
        if (
            spec.get("flags", 0) & REQUIRED
            and not spec.get("flags", 0) & READ_ONLY
            and key not in value
        ):
            problems.append(f"{where}.{key}: required, missing")
    return problems


def _unquote(key: str) -> str:
    return key[1:-1] if len(key) > 1 and key[0] == key[-1] == "'" else key


def check_template(path: Path, root: Path) -> list[str]:
    """Every problem of every resource `path` declares."""
    doc = parse(path)
    names = set(doc.get("parameters", {})) | set(doc.get("variables", {}))
    problems = []
    for symbol, resource in doc.get("resources", {}).items():
        if resource.get("existing"):
            continue
        rtype, version = resource["type"], resource["api_version"]
        found = resource_type(root, rtype, version)
        where = f"{path.name}: {symbol} ({rtype}@{version})"
        if found is None:
            problems.append(f"{where}: no published type definition")
            continue
        types, body = found
        config = _unwrap(resource["config"])
        loop_names = names | _loop_names(resource["config"])
        value = {k: v for k, v in config.items() if k not in BICEP_ONLY}
        problems += check_object(types, body, value, where, loop_names)
    return problems


def _loop_names(config: dict[str, Any]) -> set[str]:
    detail = config.get("loop_type", {}).get("detail", {}) if isinstance(config, dict) else {}
    return {v for k, v in detail.items() if k.endswith("_name") and isinstance(v, str)}
