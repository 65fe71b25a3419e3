"""SQL filters, correlation filters and rule actions as pure logic (no
broker), and the official emulator's rule vocabulary in Config.json."""

from __future__ import annotations

import pytest

from devstack.servicebus.config import ConfigError, TopicSettings, parse_config
from devstack.servicebus.filters import (
    CorrelationFilter,
    FilterEvaluationError,
    FilterSyntaxError,
    MessageView,
    Rule,
    SqlAction,
    SqlFilter,
    TrueFilter,
    evaluate_rules,
)


def _view() -> MessageView:
    return MessageView(
        {"messageid": "123456", "label": "order", "subject": "order", "to": None},
        {"userProp1": "value1", "n": 5, "f": 2.5, "s": "abc", "flag": True, "odd name": 1},
    )


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        ("sys.MessageId = '123456' AND userProp1 = 'value1'", True),  # the official sample
        ("sys.messageid = '123456'", True),  # system property names are case-insensitive
        ("sys.Label = 'order' AND sys.Subject = 'order'", True),
        ("n > 3 AND n <= 5 AND n <> 4 AND n != 6", True),
        ("n >= 6 OR f < 2.5", False),
        ("n + 1 = 6 AND n * 2 - 1 = 9 AND n % 2 = 1 AND -n = -5", True),
        ("n / 2 = 2", True),  # integer division, as in SQL
        ("f * 2 = 5.0 AND n = 5.0", True),
        ("n IN (1, 5, 9) AND s NOT IN ('x', 'y')", True),
        ("n IN (1, 2)", False),
        ("s LIKE 'a%' AND s LIKE '_b_' AND s NOT LIKE 'b%'", True),
        ("s LIKE 'a!%' ESCAPE '!'", False),
        ("'50%' LIKE '50!%' ESCAPE '!'", True),
        ("missing IS NULL AND s IS NOT NULL", True),
        ("EXISTS(n) AND NOT EXISTS(missing)", True),
        ("flag = TRUE AND NOT flag = FALSE", True),
        ("user.s = 'abc' AND [odd name] = 1", True),
        ("s = 'it''s'", False),
        # Three-valued logic: a missing property is NULL; comparisons with it are unknown.
        ("missing = 1", False),
        ("NOT missing = 1", False),
        ("missing = 1 OR n = 5", True),
        ("NOT (missing = 1 AND n = 4)", True),  # unknown AND false is false
        ("missing IN (1, 2)", False),
        ("s = 5", False),  # a string never equals a number
        ("sys.To IS NULL", True),
        ("(n = 5 OR n = 6) AND (s = 'abc')", True),
        ("1 = 1", True),
    ],
)
def test_sql_filters(expression: str, matches: bool) -> None:
    assert SqlFilter.parse(expression).matches(_view()) is matches


@pytest.mark.parametrize("expression", ["n / 0 = 1", "s + 1 = 2", "-s = 1", "n % 0 = 1"])
def test_evaluation_errors(expression: str) -> None:
    with pytest.raises(FilterEvaluationError):
        SqlFilter.parse(expression).matches(_view())


@pytest.mark.parametrize(
    "expression",
    ["", "n =", "n = = 1", "n LIKE 5", "AND n = 1", "n IN ()", "sys.EnqueuedTimeUtc > 1"],
)
def test_syntax_errors(expression: str) -> None:
    with pytest.raises(FilterSyntaxError):
        SqlFilter.parse(expression)


def test_correlation_filter() -> None:
    view = _view()
    assert CorrelationFilter({"messageid": "123456"}, {"n": 5}).matches(view)
    assert not CorrelationFilter({"messageid": "123456"}, {"n": 6}).matches(view)
    assert not CorrelationFilter({}, {"missing": None}).matches(view)
    assert not CorrelationFilter({"to": "x"}, {}).matches(view)


def test_actions_set_and_remove_in_order() -> None:
    action = SqlAction.parse(
        "SET sys.To = 'Entity'; SET n = n * 2; SET copy = n; REMOVE s; SET sys.Label = 'x';"
    )
    view = _view()
    action.apply(view)
    assert view.set_system == {"to": "Entity", "label": "x"}
    assert view.set_user == {"n": 10, "copy": 10}
    assert view.removed_user == {"s"}


@pytest.mark.parametrize("expression", ["SET sys.SessionId = 'x'", "REMOVE sys.To", "DROP n"])
def test_refused_actions(expression: str) -> None:
    with pytest.raises(FilterSyntaxError):
        SqlAction.parse(expression)


def test_one_copy_for_plain_rules_and_one_per_matching_action() -> None:
    rules = [
        Rule("a", SqlFilter.parse("n = 5")),
        Rule("b", TrueFilter()),
        Rule("c", SqlFilter.parse("n = 5"), SqlAction.parse("SET tag = 'c'")),
        Rule("d", SqlFilter.parse("n = 6"), SqlAction.parse("SET tag = 'd'")),
    ]
    views = evaluate_rules(rules, _view)
    assert views is not None
    assert [v.set_user for v in views] == [{}, {"tag": "c"}]
    assert evaluate_rules([Rule("none", SqlFilter.parse("n = 6"))], _view) is None


def _topic_document(rules: list[dict]) -> dict:
    return {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "sbemulatorns",
                    "Queues": [],
                    "Topics": [
                        {
                            "Name": "topic.1",
                            "Properties": {"DefaultMessageTimeToLive": "PT1H"},
                            "Subscriptions": [
                                {
                                    "Name": "subscription.1",
                                    "Properties": {"DefaultMessageTimeToLive": "P1D"},
                                    "Rules": rules,
                                },
                                {"Name": "subscription.2"},
                            ],
                        }
                    ],
                }
            ],
            "Logging": {"Type": "File"},
        }
    }


def test_reads_the_official_rule_shapes() -> None:
    # The rules of the official emulator's sample Config.json.
    [topic] = parse_config(
        _topic_document(
            [
                {
                    "Name": "app-prop-filter-1",
                    "Properties": {
                        "FilterType": "Correlation",
                        "CorrelationFilter": {"ContentType": "application/json"},
                    },
                },
                {
                    "Name": "user-prop-filter-1",
                    "Properties": {
                        "FilterType": "Correlation",
                        "CorrelationFilter": {"Properties": {"prop1": "value1"}},
                    },
                },
                {
                    "Name": "sql-filter-1",
                    "Properties": {
                        "FilterType": "Sql",
                        "SqlFilter": {
                            "SqlExpression": "sys.MessageId = '123456' AND userProp1 = 'value1'"
                        },
                        "Action": {"SqlExpression": "SET sys.To = 'Entity'"},
                    },
                },
            ]
        )
    )
    assert isinstance(topic, TopicSettings)
    first, second = topic.subscriptions
    assert first.name == "topic.1/Subscriptions/subscription.1"
    assert [r.name for r in first.rules] == [
        "app-prop-filter-1",
        "user-prop-filter-1",
        "sql-filter-1",
    ]
    assert first.rules[2].action is not None
    assert first.default_ttl == 3600  # capped by the topic's
    assert [r.name for r in second.rules] == ["$Default"]  # no rules: everything matches


@pytest.mark.parametrize(
    "rule",
    [
        {"Name": "r", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "a ="}}},
        {"Name": "r", "Properties": {"FilterType": "Sql"}},
        {"Name": "r", "Properties": {"FilterType": "Correlation", "CorrelationFilter": {}}},
        {"Name": "r", "Properties": {"FilterType": "Correlation", "CorrelationFilter": {"X": 1}}},
        {"Name": "r", "Properties": {"FilterType": "Boolean"}},
        {
            "Name": "r",
            "Properties": {
                "FilterType": "Sql",
                "SqlFilter": {"SqlExpression": "1=1"},
                "Action": {"SqlExpression": "SET sys.SessionId = 'x'"},
            },
        },
        {"Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}}},
    ],
)
def test_rejects_bad_rules(rule: dict) -> None:
    with pytest.raises(ConfigError):
        parse_config(_topic_document([rule]))


def test_rejects_forwarding_to_nowhere() -> None:
    document = _topic_document([])
    document["UserConfig"]["Namespaces"][0]["Topics"][0]["Subscriptions"][1]["Properties"] = {
        "ForwardTo": "nowhere"
    }
    with pytest.raises(ConfigError, match="nowhere"):
        parse_config(document)
