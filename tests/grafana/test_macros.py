"""``tests.grafana.macros`` expands as Grafana's ClickHouse data source documents it.

In:  SQL with the plugin's macros and Grafana's variables; the outputs the plugin's documentation
     (docs/sources/query-editor.md, template-variables.md) and its own tests give for them.
Out: assertions on the expanded text (no store needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.grafana.macros import AllOf, Range, Unexpanded, Values, conditional_all, expand, interpolate, resolve

# the documentation's example range: from 1415792726.123 to 1447328726.456 (epoch seconds)
DOCS = Range(datetime.fromtimestamp(1415792726.123, UTC), datetime.fromtimestamp(1447328726.456, UTC), interval_s=20)


@pytest.mark.parametrize(
    "sql,expanded",
    [
        ("$__timeFilter(time)", "time >= toDateTime(1415792726) AND time <= toDateTime(1447328726)"),
        (
            "$__timeFilter_ms(time)",
            "time >= fromUnixTimestamp64Milli(1415792726123) AND time <= fromUnixTimestamp64Milli(1447328726456)",
        ),
        ("$__fromTime", "toDateTime(1415792726)"),
        ("$__toTime", "toDateTime(1447328726)"),
        ("$__fromTime_ms", "fromUnixTimestamp64Milli(1415792726123)"),
        ("$__toTime_ms", "fromUnixTimestamp64Milli(1447328726456)"),
        ("$__timeFrom(time)", "time >= toDateTime(1415792726)"),
        ("$__timeTo(time)", "time <= toDateTime(1447328726)"),
        ("$__interval_s", "20"),
        ("$__timeInterval(column)", "toStartOfInterval(toDateTime(column), INTERVAL 20 second)"),
        ("$__timeInterval_ms(column)", "toStartOfInterval(toDateTime64(column, 3), INTERVAL 20000 millisecond)"),
        ("$__timeGroup(column, 5m)", "toStartOfInterval(toDateTime(column), INTERVAL 300 second)"),
        ("$__dateFilter(date)", "date >= toDate('2014-11-12') AND date <= toDate('2015-11-12')"),
        (
            "$__dt(date, time)",
            "(date >= toDate('2014-11-12') AND date <= toDate('2015-11-12')) AND "
            "(time >= toDateTime(1415792726) AND time <= toDateTime(1447328726))",
        ),
        # an argument is cut at its first ")" (sqlds' pattern): the plugin sends this broken SQL too
        (
            "$__timeFilter(toDateTime(ts))",
            "toDateTime(ts >= toDateTime(1415792726) AND toDateTime(ts <= toDateTime(1447328726))",
        ),
    ],
)
def test_macros_expand_as_documented(sql: str, expanded: str) -> None:
    assert expand(sql, DOCS, {}) == expanded


def test_the_interval_is_at_least_a_second() -> None:
    assert expand("$__interval_s", Range(DOCS.start, DOCS.end, 0.2), {}) == "1"


def test_conditional_all_as_the_plugin_tests_it() -> None:
    sql = "SELECT * FROM t WHERE $__conditionalAll(location IN ($loc), $loc)"
    assert conditional_all(sql, {"loc": "Berlin"}) == "SELECT * FROM t WHERE location IN ($loc)"
    assert conditional_all(sql, {"loc": AllOf(("Berlin", "Paris"))}) == "SELECT * FROM t WHERE 1=1"
    assert conditional_all(sql, {"loc": ""}) == "SELECT * FROM t WHERE 1=1"
    two = "WHERE $__conditionalAll(a IN (f(x), $a), $a) AND $__conditionalAll(b = 1, ${b})"
    assert conditional_all(two, {"a": ("x",), "b": AllOf(())}) == "WHERE a IN (f(x), $a) AND 1=1"


def test_variables_take_grafana_formats() -> None:
    values: Values = {"m": ("a", "o'b"), "one": "x'y", "all": AllOf(("p", "q"))}
    assert interpolate("${m:singlequote}", DOCS, values) == "'a','o\\'b'"
    assert interpolate("${m:sqlstring}", DOCS, values) == "'a','o''b'"
    assert interpolate("$m", DOCS, values) == "'a','o'b'"  # the plugin's own format: quoted, joined
    assert interpolate("${one}", DOCS, values) == "x'y"  # one value as it is
    assert interpolate("${one:sqlstring}", DOCS, values) == "'x''y'"
    assert interpolate("[[all]] ${all:csv}", DOCS, values) == "'p','q' p,q"
    assert interpolate("${__from} ${__to}", DOCS, {}) == "1415792726123 1447328726456"
    assert interpolate("$__interval_s $unknown", DOCS, values) == "$__interval_s $unknown"  # left to the next step


def test_what_would_reach_clickhouse_unexpanded_is_refused() -> None:
    with pytest.raises(Unexpanded, match="tenant"):
        expand("SELECT 1 WHERE tenant IN (${tenant:singlequote})", DOCS, {})
    with pytest.raises(Unexpanded, match="__rate"):
        expand("SELECT $__rate(x)", DOCS, {})
    with pytest.raises(Unexpanded, match="one argument"):
        expand("WHERE $__timeFilter", DOCS, {})
    with pytest.raises(Unexpanded, match="does not define"):
        expand("WHERE $__conditionalAll(x = 1, $nope)", DOCS, {})
    with pytest.raises(ValueError, match="timezone-aware"):
        Range(datetime(2026, 1, 1), datetime(2026, 1, 2))  # noqa: DTZ001 - the point of the test


def test_variables_resolve_in_order() -> None:
    dashboard: dict[str, Any] = {
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "grafana-clickhouse-datasource"},
                {"name": "prices", "type": "textbox", "query": "H100=2.99"},
                {"name": "w", "type": "constant", "query": "4"},
                {"name": "table", "type": "query", "query": {"editorType": "sql", "rawSql": "SELECT 't$w'"}},
                {
                    "name": "model",
                    "type": "query",
                    "includeAll": True,
                    "multi": True,
                    "current": {"value": ["$__all"]},
                    "query": {"rawSql": "SELECT model FROM ${table} WHERE $__timeFilter(ts)"},
                },
                {"name": "size", "type": "custom", "query": "small, large"},
            ]
        }
    }
    asked: list[str] = []

    def run(sql: str) -> Sequence[Sequence[Any]]:
        asked.append(sql)
        return [("t4",)] if "FROM" not in sql else [("a",), ("b",)]

    values = resolve(dashboard, DOCS, run)
    assert values == {"prices": "H100=2.99", "w": "4", "table": "t4", "model": AllOf(("a", "b")), "size": "small"}
    assert asked[1] == "SELECT model FROM t4 WHERE ts >= toDateTime(1415792726) AND ts <= toDateTime(1447328726)"
    assert resolve(dashboard, DOCS, run, {"model": ("b",), "prices": "L4=0.8"})["model"] == ("b",)
