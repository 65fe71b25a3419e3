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
import hashlib
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


_DURATION = re.compile(r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?$")


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
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("min", "max")
            and not node.keywords
        ):
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
        if isinstance(spec.get("default"), (int, str, list))
        and not isinstance(spec.get("default"), bool)
    }


def module_params(doc: dict[str, Any], module: str) -> dict[str, Any]:
    config = doc["modules"][module]["config"]
    if "loop_type" in config or "condition" in config:
        config = config["config"]
    return config.get("params", {})


# main.bicep's integer variables for the deadlines deployed to Azure
# (infra/README.md, "Timing on Flex"), in the order they depend on each other.
TIMING_VARS = (
    "durableQueuePollingSeconds",
    "claimFloorSeconds",
    "stepFloorSeconds",
    "azureClaimTimeoutSeconds",
    "azureStepTimeoutSeconds",
)


def main_timing(overrides: dict[str, int] | None = None) -> dict[str, int]:
    """main.bicep's integer parameters (defaults, or overrides) and its timing variables, evaluated."""
    names = {k: v for k, v in main_defaults().items() if isinstance(v, int)}
    names.update(overrides or {})
    for var in TIMING_VARS:
        names[var] = eval_int(var_source(MAIN, var), names)
    return names


def passthrough_defaults(module: str) -> dict[str, Any]:
    """Values main.bicep gives a module, for the params it passes straight
    through from a main.bicep parameter with a literal default or from one of
    its timing variables."""
    defaults = {**main_defaults(), **main_timing(), "applications": main_applications()}
    params = module_params(parse(MAIN), module)
    return {
        name: defaults[value]
        for name, value in params.items()
        if isinstance(value, str) and value in defaults
    }


def main_applications(smoke: bool = True) -> list[dict[str, Any]]:
    """main.bicep's `applications`: the default client applications and,
    with smokeApplication (its default), the smoke application."""
    env = {"clientApplications": main_defaults()["clientApplications"], "smokeApplication": smoke}
    return evaluate("applications", env, parse(MAIN))


def interpolate(template: str, names: dict[str, int]) -> str:
    """'PT${expr}M' -> 'PT42M', evaluating each ${expr} as an integer expression."""
    return re.sub(r"\$\{([^}]*)\}", lambda m: str(eval_int(m.group(1), names)), template)


_COMPARISONS = {
    "greater_than": lambda a, b: a > b,
    "greater_than_or_equals": lambda a, b: a >= b,
    "less_than": lambda a, b: a < b,
    "less_than_or_equals": lambda a, b: a <= b,
}


def evaluate(value: Any, env: dict[str, Any], doc: dict[str, Any]) -> Any:
    """Evaluate the subset of Bicep expressions the role and queue lists use.

    Names resolve to `env` (parameters given by the test, loop items, lambda
    variables) before the document's variables; `${a.b}` interpolation, `a.b`,
    `a[b]`, `!empty(x)`, `==`, `!=`, `<`, `<=`, `>`, `>=`, `?:`, array comprehensions (`[for x in xs: ...]`),
    and the functions map, filter, flatten, concat, union, split, trim, empty,
    contains, range, length, indexOf and take are understood. Anything else raises, so a test never silently
    reads an expression it does not understand as a literal."""

    def ev(v: Any, scope: dict[str, Any]) -> Any:
        if isinstance(v, (bool, int)) or v is None:
            return v
        if isinstance(v, str):
            if v in scope:
                return scope[v]
            if v in doc.get("variables", {}):
                return ev(variable(doc, v), scope)
            if "${" in v:
                return re.sub(r"\$\{([^}]*)\}", lambda m: str(_path(m.group(1), scope)), v)
            return v
        if isinstance(v, list):
            return [ev(x, scope) for x in v]
        if isinstance(v, dict) and "loop_type" in v:
            detail = v["loop_type"]["detail"]
            return [
                ev(v["config"], {**scope, detail["item_name"]: item})
                for item in ev(detail["array_name"], scope)
            ]
        if isinstance(v, dict) and "operator" in v:
            op, ops = v["operator"]["type"], v["operator"]["operands"]
            if op == "property_accessor":
                return ev(ops["operand_1"], scope)[ops["operand_2"]]
            if op == "index_accessor":
                return ev(ops["operand_1"], scope)[ev(ops["operand_2"], scope)]
            if op == "not":
                return not ev(ops["bool_value"], scope)
            if op == "equals":
                return ev(ops["operand_1"], scope) == ev(ops["operand_2"], scope)
            if op == "not_equals":
                return ev(ops["operand_1"], scope) != ev(ops["operand_2"], scope)
            if op in _COMPARISONS:
                return _COMPARISONS[op](ev(ops["operand_1"], scope), ev(ops["operand_2"], scope))
            if op == "conditional":
                branch = "true_value" if ev(ops["condition"], scope) else "false_value"
                return ev(ops[branch], scope)
            raise ValueError(f"unsupported operator {op}")
        if isinstance(v, dict) and "function" in v:
            name, args = v["function"]["type"], v["function"]["parameters"]
            values = list(args.values())

            def lam(index: int):
                detail = values[index]["detail"]
                return lambda item: ev(detail["expression"], {**scope, detail["var_1"]: item})

            if name == "map":
                return [lam(1)(x) for x in ev(values[0], scope)]
            if name == "filter":
                return [x for x in ev(values[0], scope) if lam(1)(x)]
            if name == "flatten":
                return [x for inner in ev(values[0], scope) for x in inner]
            if name == "concat":
                return [x for a in values for x in ev(a, scope)]
            if name == "union":
                out: list[Any] = []
                for a in values:
                    for x in ev(a, scope):
                        if x not in out:  # ARM keeps one copy of each value, within an array too
                            out.append(x)
                return out
            if name == "split":
                return ev(values[0], scope).split(ev(values[1], scope))
            if name == "trim":
                return ev(values[0], scope).strip()
            if name == "empty":
                return not ev(values[0], scope)
            if name == "contains":
                return ev(values[1], scope) in ev(values[0], scope)
            if name == "range":
                start = ev(values[0], scope)
                return list(range(start, start + ev(values[1], scope)))
            if name == "length":
                return len(ev(values[0], scope))
            if name in ("indexOf", "index_of"):
                found = ev(values[0], scope)
                item = ev(values[1], scope)
                return found.index(item) if item in found else -1
            if name == "take":
                return ev(values[0], scope)[: ev(values[1], scope)]
            if name == "toObject":
                key, val = lam(1), lam(2)
                return {key(x): val(x) for x in ev(values[0], scope)}
            raise ValueError(f"unsupported function {name}")
        if isinstance(v, dict):
            return {k: ev(x, scope) for k, x in v.items()}
        raise ValueError(f"cannot evaluate {v!r}")

    def _path(expr: str, scope: dict[str, Any]) -> Any:
        call = re.fullmatch(r"\s*uniqueString\((.*)\)\s*", expr)
        if call:
            # Deterministic like ARM's (not the same hash): equal inputs, equal output.
            parts = [str(_path(arg, scope)) for arg in call.group(1).split(",")]
            return hashlib.sha256("|".join(parts).encode()).hexdigest()[:13]
        head, *rest = expr.strip().split(".")
        value = ev(head, scope)
        for part in rest:
            value = value[part]
        return value

    return ev(value, env)
