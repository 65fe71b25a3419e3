"""Subscription rules: SQL filters, correlation filters and SQL rule actions,
evaluated against a message the way Service Bus does.

The SQL filter language is parsed with Lark (a grammar, not hand-written
parsing code). The subset implemented:

- properties: `sys.<Name>` (system properties), `user.<Name>`, a bare name
  or `[name with spaces]` (application properties);
- literals: 'strings' ('' escapes a quote), integers, decimals, TRUE, FALSE, NULL;
- comparisons `= <> != < <= > >=`, arithmetic `+ - * / %`, unary minus, parentheses;
- `AND`, `OR`, `NOT` with SQL three-valued logic (a missing property is NULL,
  and a comparison with NULL is unknown, which does not match);
- `IN (...)`, `NOT IN`, `LIKE 'pattern' [ESCAPE 'c']` (`%` and `_`), `NOT LIKE`,
  `IS NULL`, `IS NOT NULL`, `EXISTS(property)`, `NOT EXISTS(...)`.

Rule actions: `SET property = expression` and `REMOVE property`, separated by
`;`. Values set on user properties keep their SQL type (string, long, double,
boolean); system properties that can be set are those of the AMQP
properties section (To, ReplyTo, Label/Subject, ContentType, CorrelationId,
MessageId, ReplyToSessionId).

Evaluation errors (division by zero, arithmetic on a string) raise
`FilterEvaluationError`; the subscription then dead-letters the message when
`DeadLetteringOnFilterEvaluationExceptions` is set, as Service Bus does.
Comparing values of different kinds (a string with a number) is unknown,
not an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import LarkError

_GRAMMAR = r"""
?start: or_expr

?or_expr: and_expr
    | or_expr _OR and_expr -> or_
?and_expr: not_expr
    | and_expr _AND not_expr -> and_
?not_expr: predicate
    | _NOT not_expr -> not_
?predicate: sum
    | sum COMP_OP sum -> compare
    | sum _IS _NULL -> is_null
    | sum _IS _NOT _NULL -> is_not_null
    | sum _IN "(" sum ("," sum)* ")" -> in_
    | sum _NOT _IN "(" sum ("," sum)* ")" -> not_in
    | sum _LIKE STRING (_ESCAPE STRING)? -> like
    | sum _NOT _LIKE STRING (_ESCAPE STRING)? -> not_like
    | _EXISTS "(" property ")" -> exists
?sum: product
    | sum ADD_OP product -> arith
?product: unary
    | product MUL_OP unary -> arith
?unary: atom
    | "-" unary -> neg
?atom: STRING -> string
    | NUMBER -> number
    | _TRUE -> true
    | _FALSE -> false
    | _NULL -> null
    | property
    | "(" or_expr ")"
property: NAME ("." NAME)?
    | BRACKETED

action: statement (";" statement)* ";"?
statement: _SET property "=" or_expr -> set_
    | _REMOVE property -> remove

COMP_OP: "<>" | "!=" | "<=" | ">=" | "=" | "<" | ">"
ADD_OP: "+" | "-"
MUL_OP: "*" | "/" | "%"
STRING: /'(?:[^']|'')*'/
NUMBER: /\d+(\.\d+)?([eE][+-]?\d+)?/
NAME: /[A-Za-z_$@#][A-Za-z0-9_$@#-]*/i
BRACKETED: /\[[^\]]+\]/

_OR: "OR"i
_AND: "AND"i
_NOT: "NOT"i
_IS: "IS"i
_NULL: "NULL"i
_IN: "IN"i
_LIKE: "LIKE"i
_ESCAPE: "ESCAPE"i
_EXISTS: "EXISTS"i
_TRUE: "TRUE"i
_FALSE: "FALSE"i
_SET: "SET"i
_REMOVE: "REMOVE"i

%import common.WS
%ignore WS
"""

_FILTER_PARSER = Lark(_GRAMMAR, start="start", parser="lalr")
_ACTION_PARSER = Lark(_GRAMMAR, start="action", parser="lalr")


class FilterSyntaxError(ValueError):
    """A SQL filter or action that does not parse (reported when the config is read)."""


class FilterEvaluationError(Exception):
    """Evaluating a filter or action failed for one message."""


#: System property names a SQL expression may use (`sys.Label` and `sys.Subject` are one).
SYSTEM_PROPERTIES = {
    "messageid": "message_id",
    "correlationid": "correlation_id",
    "to": "to",
    "replyto": "reply_to",
    "label": "subject",
    "subject": "subject",
    "sessionid": "group_id",
    "replytosessionid": "reply_to_group_id",
    "contenttype": "content_type",
}
#: System properties computed by the broker, readable but not settable.
BROKER_PROPERTIES = {"sequencenumber", "deliverycount", "size"}


@dataclass
class MessageView:
    """What a rule sees of a message, and the changes an action makes.

    Attributes:
        system: System property values by SQL name (lower case), None when absent.
        user: Application property values by name.
        set_system: System properties an action set (SQL name, lower case).
        set_user: Application properties an action set.
        removed_user: Application properties an action removed.
    """

    system: dict[str, Any]
    user: dict[str, Any]
    set_system: dict[str, Any] = field(default_factory=dict)
    set_user: dict[str, Any] = field(default_factory=dict)
    removed_user: set[str] = field(default_factory=set)


def _property(node: Tree) -> tuple[str, str]:
    """(scope, name) of a property node: scope is "sys" or "user"."""
    parts = [str(t) for t in node.children]
    if len(parts) == 1:
        name = parts[0]
        if name.startswith("["):
            name = name[1:-1]
        return "user", name
    scope, name = parts
    if scope.lower() not in ("sys", "user"):
        return "user", f"{scope}.{name}"
    return scope.lower(), name


def _read(view: MessageView, node: Tree) -> tuple[bool, Any]:
    """(exists, value) of a property."""
    scope, name = _property(node)
    if scope == "sys":
        key = name.lower()
        if key not in SYSTEM_PROPERTIES and key not in BROKER_PROPERTIES:
            raise FilterEvaluationError(f"unknown system property sys.{name}")
        value = view.system.get(key)
        return value is not None, value
    if name in view.user:
        return True, view.user[name]
    return False, None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _like(value: str, pattern: str, escape: str | None) -> bool:
    out = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if escape and char == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if char == "%" else "." if char == "_" else re.escape(char))
        i += 1
    return re.fullmatch("".join(out), value, flags=re.DOTALL) is not None


def _string(token: Token) -> str:
    return str(token)[1:-1].replace("''", "'")


def _compare(op: str, left: Any, right: Any) -> bool | None:
    if left is None or right is None:
        return None
    if (
        (_number(left) and _number(right))
        or (isinstance(left, bool) and isinstance(right, bool))
        or (isinstance(left, str) and isinstance(right, str))
    ):
        pass
    else:
        return None  # different kinds: unknown, so the rule does not match
    if op == "=":
        return left == right
    if op in ("<>", "!="):
        return left != right
    if isinstance(left, bool):
        return None
    return {
        "<": left < right,
        "<=": left <= right,
        ">": left > right,
        ">=": left >= right,
    }[op]


def _arith(op: str, left: Any, right: Any) -> Any:
    if left is None or right is None:
        return None
    if op == "+" and isinstance(left, str) and isinstance(right, str):
        return left + right
    if not (_number(left) and _number(right)):
        raise FilterEvaluationError(f"cannot apply {op} to {left!r} and {right!r}")
    if op in ("/", "%") and right == 0:
        raise FilterEvaluationError("division by zero")
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if op == "/":
        return left // right if isinstance(left, int) and isinstance(right, int) else left / right
    return left % right


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


def evaluate(node: Tree | Token, view: MessageView) -> Any:
    """The value of an expression node for one message (None is SQL NULL / unknown)."""
    kind = node.data if isinstance(node, Tree) else None
    if kind == "string":
        return _string(node.children[0])
    if kind == "number":
        text = str(node.children[0])
        return float(text) if any(c in text for c in ".eE") else int(text)
    if kind == "true":
        return True
    if kind == "false":
        return False
    if kind == "null":
        return None
    if kind == "property":
        return _read(view, node)[1]
    if kind == "neg":
        value = evaluate(node.children[0], view)
        if value is None:
            return None
        if not _number(value):
            raise FilterEvaluationError(f"cannot negate {value!r}")
        return -value
    if kind == "arith":
        left, op, right = node.children
        return _arith(str(op), evaluate(left, view), evaluate(right, view))
    if kind == "compare":
        left, op, right = node.children
        return _compare(str(op), evaluate(left, view), evaluate(right, view))
    if kind == "and_":
        left = evaluate(node.children[0], view)
        if left is False:
            return False
        right = evaluate(node.children[1], view)
        if right is False:
            return False
        return None if left is None or right is None else True
    if kind == "or_":
        left = evaluate(node.children[0], view)
        if left is True:
            return True
        right = evaluate(node.children[1], view)
        if right is True:
            return True
        return None if left is None or right is None else False
    if kind == "not_":
        return _not(evaluate(node.children[0], view))
    if kind in ("is_null", "is_not_null"):
        is_null = evaluate(node.children[0], view) is None
        return is_null if kind == "is_null" else not is_null
    if kind in ("in_", "not_in"):
        value = evaluate(node.children[0], view)
        options = [evaluate(child, view) for child in node.children[1:]]
        found: bool | None
        if value is None:
            found = None
        elif any(_compare("=", value, option) for option in options):
            found = True
        else:
            found = None if any(option is None for option in options) else False
        return found if kind == "in_" else _not(found)
    if kind in ("like", "not_like"):
        value = evaluate(node.children[0], view)
        pattern = _string(node.children[1])
        escape = _string(node.children[2]) if len(node.children) > 2 else None
        matched = None if not isinstance(value, str) else _like(value, pattern, escape)
        return matched if kind == "like" else _not(matched)
    if kind == "exists":
        return _read(view, node.children[0])[0]
    raise FilterEvaluationError(f"unsupported expression {node!r}")


def _check_system_properties(tree: Tree) -> None:
    """Refuse, when the config is read, a system property this emulator cannot evaluate."""
    for node in tree.find_data("property"):
        scope, name = _property(node)
        key = name.lower()
        if scope == "sys" and key not in SYSTEM_PROPERTIES and key not in BROKER_PROPERTIES:
            raise FilterSyntaxError(f"system property sys.{name} is not supported")


def _parse(parser: Lark, text: str, what: str) -> Tree:
    try:
        return parser.parse(text)
    except LarkError as exc:
        raise FilterSyntaxError(f"cannot parse {what} {text!r}: {exc}") from exc


@dataclass(frozen=True)
class SqlFilter:
    """A SQL filter: the message matches when the expression is TRUE."""

    expression: str
    tree: Tree = field(compare=False, repr=False)

    @classmethod
    def parse(cls, expression: str) -> SqlFilter:
        tree = _parse(_FILTER_PARSER, expression, "SQL filter")
        _check_system_properties(tree)
        return cls(expression, tree)

    def matches(self, view: MessageView) -> bool:
        return evaluate(self.tree, view) is True


@dataclass(frozen=True)
class CorrelationFilter:
    """Equality on system properties and application properties, all of which must hold.

    Attributes:
        system: Expected system property values by SQL name (lower case).
        user: Expected application property values.
    """

    system: dict[str, Any]
    user: dict[str, Any]

    def matches(self, view: MessageView) -> bool:
        for key, expected in self.system.items():
            if view.system.get(key) != expected:
                return False
        for key, expected in self.user.items():
            if key not in view.user or _compare("=", view.user[key], expected) is not True:
                return False
        return True


@dataclass(frozen=True)
class TrueFilter:
    """Every message matches (the `$Default` rule of a subscription without rules)."""

    def matches(self, _view: MessageView) -> bool:
        return True


@dataclass(frozen=True)
class SqlAction:
    """SET / REMOVE statements applied to a matching message's copy for one subscription."""

    expression: str
    tree: Tree = field(compare=False, repr=False)

    @classmethod
    def parse(cls, expression: str) -> SqlAction:
        tree = _parse(_ACTION_PARSER, expression, "SQL rule action")
        _check_system_properties(tree)
        for statement in tree.children:
            scope, name = _property(statement.children[0])
            if scope == "sys" and (
                name.lower() not in SYSTEM_PROPERTIES or name.lower() == "sessionid"
            ):
                raise FilterSyntaxError(f"sys.{name} cannot be set by a rule action")
            if scope == "sys" and statement.data == "remove":
                raise FilterSyntaxError(f"sys.{name} cannot be removed by a rule action")
        return cls(expression, tree)

    def apply(self, view: MessageView) -> None:
        """Record the action's changes in `view` (later statements see earlier ones)."""
        for statement in self.tree.children:
            scope, name = _property(statement.children[0])
            if statement.data == "remove":
                view.user.pop(name, None)
                view.set_user.pop(name, None)
                view.removed_user.add(name)
                continue
            value = evaluate(statement.children[1], view)
            if scope == "sys":
                view.system[name.lower()] = value
                view.set_system[name.lower()] = value
            else:
                view.user[name] = value
                view.set_user[name] = value
                view.removed_user.discard(name)


Filter = SqlFilter | CorrelationFilter | TrueFilter


@dataclass(frozen=True)
class Rule:
    """A subscription rule: a filter and an optional action."""

    name: str
    filter: Filter
    action: SqlAction | None = None


def evaluate_rules(
    rules: list[Rule], make_view: Callable[[], MessageView]
) -> list[MessageView] | None:
    """The views of a message for every matching rule (one copy per match, as Service Bus
    makes one copy per matching rule that has an action), or None when nothing matches.

    Raises:
        FilterEvaluationError: A rule's filter or action could not be evaluated.
    """
    matched: list[MessageView] = []
    plain_match = False
    for rule in rules:
        view = make_view()
        if not rule.filter.matches(view):
            continue
        if rule.action is None:
            plain_match = True
            continue
        rule.action.apply(view)
        matched.append(view)
    if plain_match:
        matched.insert(0, make_view())
    return matched or None
