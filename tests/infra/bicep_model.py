"""Read the Bicep templates under infra/ as data, for the structural tests.

Bicep cannot be compiled here, so the tests parse each file with pycep-parser
(which turns a file into a dict of parameters, variables, resources, modules
and outputs) and follow the few references they need by hand. Two pycep habits
shape the helpers below:

- a bare identifier (a parameter, a variable, a loop item) comes out as a plain
  string, the same as a string literal; the helpers resolve a string that names
  a parameter or variable, and treat the rest as literals;
- pycep gets operator precedence wrong in arithmetic (``a * (b + c) + d`` comes
  out as ``a * ((b + c) + d)``), so integer expressions are evaluated from the
  source text with Python's own parser instead (Bicep's ``+ - * / min max`` and
  parentheses read the same in Python; ``/`` on ints is Bicep's integer division).
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from pycep import BicepParser

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MAIN = INFRA / "main.bicep"
TEMPLATE = ROOT / "local.settings.template.json"
HOST_JSON = ROOT / "host.json"
SERVICEBUS_CONFIG = ROOT / "devstack" / "servicebus" / "Config.json"
COMPOSE = ROOT / "docker-compose.yml"


def bicep_files() -> list[Path]:
    return sorted(INFRA.rglob("*.bicep"))


@cache
def parse(path: Path) -> dict[str, Any]:
    return BicepParser().parse(file_path=path)


def template_settings() -> dict[str, str]:
    return json.loads(TEMPLATE.read_text())["Values"]


def param_default(doc: dict[str, Any], name: str) -> Any:
    return doc["parameters"][name].get("default")


def variable(doc: dict[str, Any], name: str) -> Any:
    return doc["variables"][name]["value"]


def accessor(value: Any) -> tuple[Any, Any] | None:
    """`a.b` -> (a, b); anything else -> None."""
    if isinstance(value, dict) and "operator" in value:
        op = value["operator"]
        if op["type"] == "property_accessor":
            return op["operands"]["operand_1"], op["operands"]["operand_2"]
    return None


def function_call(value: Any) -> tuple[str, dict[str, Any]] | None:
    """`f(x, y)` -> ("f", {parameter name: value})."""
    if isinstance(value, dict) and "function" in value:
        return value["function"]["type"], value["function"]["parameters"]
    return None


def literal_int(value: Any) -> int:
    """An int literal; pycep writes -1 as a unary minus operator."""
    if isinstance(value, bool):
        raise TypeError(value)
    if isinstance(value, int):
        return value
    op = value["operator"]
    if op["type"] == "minus":
        return -literal_int(op["operands"]["integer_value"])
    raise TypeError(f"not an int literal: {value!r}")


_DURATION = re.compile(
    r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?$"
)


def duration_seconds(iso: str) -> int:
    """ISO 8601 duration (the subset Service Bus uses: days, hours, minutes, seconds)."""
    match = _DURATION.match(iso)
    if not match or iso in ("P", "PT"):
        raise ValueError(f"not an ISO 8601 duration: {iso!r}")
    parts = {k: int(v or 0) for k, v in match.groupdict().items()}
    return ((parts["d"] * 24 + parts["h"]) * 60 + parts["m"]) * 60 + parts["s"]


def var_source(path: Path, name: str) -> str:
    """The right-hand side of a one-line `var name = ...` in a file's text."""
    match = re.search(rf"^var {re.escape(name)} = (.+)$", path.read_text(), re.MULTILINE)
    if not match:
        raise KeyError(f"{path.name}: no one-line var {name}")
    return match.group(1).strip()


def eval_int(source: str, names: dict[str, int]) -> int:
    """Evaluate a Bicep integer expression (+ - * / min max, parentheses)."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            return names[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.Div):
                return int(left / right)  # Bicep truncates toward zero
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("min", "max") and not node.keywords:
                args = [ev(a) for a in node.args]
                return min(args) if node.func.id == "min" else max(args)
        raise ValueError(f"unsupported Bicep expression: {ast.dump(node)}")

    return ev(ast.parse(source, mode="eval"))


def main_defaults() -> dict[str, Any]:
    """main.bicep's parameters with literal defaults."""
    doc = parse(MAIN)
    return {
        name: spec["default"]
        for name, spec in doc["parameters"].items()
        if isinstance(spec.get("default"), (int, str, list)) and not isinstance(spec.get("default"), bool)
    }


def module_params(doc: dict[str, Any], module: str) -> dict[str, Any]:
    config = doc["modules"][module]["config"]
    if "loop_type" in config or "condition" in config:
        config = config["config"]
    return config.get("params", {})


def passthrough_defaults(module: str) -> dict[str, Any]:
    """Values main.bicep gives a module, for the params it passes straight
    through from a main.bicep parameter with a literal default."""
    defaults = main_defaults()
    params = module_params(parse(MAIN), module)
    return {name: defaults[value] for name, value in params.items() if isinstance(value, str) and value in defaults}


def interpolate(template: str, names: dict[str, int]) -> str:
    """'PT${expr}M' -> 'PT42M', evaluating each ${expr} as an integer expression."""
    return re.sub(r"\$\{([^}]*)\}", lambda m: str(eval_int(m.group(1), names)), template)
