"""A shipped Grafana dashboard's SQL, expanded as Grafana's ClickHouse data source
(``grafana-clickhouse-datasource``, v4) expands it, so it runs on chDB or any ClickHouse.

In:  a panel target's ``rawSql`` (or a query variable's), the time range and interval of the panel
     (``Range``) and the dashboard variables' values (``Values``: a string, a tuple of strings, or
     ``AllOf`` for "All").
Out: ``expand``: the SQL ClickHouse receives; ``resolve``: the values of a dashboard's variables,
     the query variables' read through ``run`` (a function that runs SQL and returns its rows), as
     Grafana fills them in before the panels run. ``Unexpanded`` when something would reach
     ClickHouse unexpanded (an unknown variable or macro, a macro with the wrong arguments).

The steps, in the plugin's order (its documented behaviour; the code it follows is named):
1. ``$__conditionalAll(condition, $var)`` (the plugin's front end, ``applyConditionalAll``): the
   condition, or ``1=1`` when ``$var`` is "All" or empty; arguments split at top-level commas.
2. Grafana's template variables: ``$var``, ``${var}``, ``${var:format}``, ``[[var]]`` and the global
   ``${__from}`` / ``${__to}`` (epoch ms). Without a format the plugin's own applies (a list becomes
   ``'a','b'``, one value stays as it is); ``singlequote`` quotes each value escaping ``'`` as
   ``\\'``, ``sqlstring`` escapes it as ``''``, ``csv`` and ``raw`` join with commas. "All" (without a
   custom all value) stands for every option. A name Grafana does not know is left as it is.
3. The back end's macros (``pkg/macros/macros.go`` on ``sqlds``): each ``$__name`` with its
   arguments matched as ``\\$__name\\b(?:\\((.*?)\\))?`` (so an argument cannot hold a parenthesis:
   the plugin would cut it at the first ``)``), split at every comma and trimmed:
   ``$__fromTime`` / ``$__toTime`` -> ``toDateTime(<epoch s>)``; ``$__fromTime_ms`` / ``$__toTime_ms``
   -> ``fromUnixTimestamp64Milli(<epoch ms>)``; ``$__timeFilter(c)`` -> ``c >= <from> AND c <= <to>``
   (also ``_ms``), ``$__timeFrom(c)``, ``$__timeTo(c)``; ``$__dateFilter(c)`` (``toDate('YYYY-MM-DD')``);
   ``$__dateTimeFilter(d, t)`` / ``$__dt``; ``$__timeInterval(c)`` ->
   ``toStartOfInterval(toDateTime(c), INTERVAL <s> second)`` (also ``_ms``); ``$__timeGroup(c, 5m)``
   the same with the period given; ``$__interval_s`` -> the interval in whole seconds, at least 1.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["AllOf", "Range", "Unexpanded", "Value", "Values", "conditional_all", "expand", "interpolate", "resolve"]


class Unexpanded(ValueError):
    """The SQL would reach ClickHouse with a part Grafana or the plugin would not have expanded."""


@dataclass(frozen=True)
class AllOf:
    """A multi-value variable with "All" picked: every option it has."""

    options: tuple[str, ...]


Value = str | tuple[str, ...] | AllOf
Values = Mapping[str, Value]


@dataclass(frozen=True)
class Range:
    """A panel's time range (UTC) and interval (``$__interval_s``: Grafana's from the panel's width,
    or its min interval)."""

    start: datetime
    end: datetime
    interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("a Range takes timezone-aware times (Grafana's range is absolute)")
        if self.end <= self.start:
            raise ValueError(f"empty range: {self.start.isoformat()} to {self.end.isoformat()}")

    @property
    def from_ms(self) -> int:
        return int(self.start.timestamp() * 1000)

    @property
    def to_ms(self) -> int:
        return int(self.end.timestamp() * 1000)


def expand(sql: str, rng: Range, values: Values) -> str:
    """``sql`` as ClickHouse receives it from the plugin (module docstring)."""
    out = _macros(interpolate(conditional_all(sql, values), rng, values), rng)
    left = re.search(r"\$\{?\w+|\[\[\w+", out)
    if left:
        raise Unexpanded(f"{left.group(0)!r} is neither a variable of the dashboard nor a macro of the plugin")
    return out


# --------------------------------------------------------------------------- 1. $__conditionalAll

_CONDITIONAL = "$__conditionalAll("


def _args(text: str, open_at: int) -> tuple[list[str], int]:
    """The comma-separated arguments of the call whose ``(`` is at ``open_at`` (nested parentheses
    kept whole) and the index just after its ``)``."""
    depth, args, begin = 0, [], open_at + 1
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                args.append(text[begin:i])
                return args, i + 1
        elif ch == "," and depth == 1:
            args.append(text[begin:i])
            begin = i + 1
    raise Unexpanded(f"unclosed macro call: {text[open_at - 20 : open_at + 40]!r}")


def conditional_all(sql: str, values: Values) -> str:
    """Step 1: each ``$__conditionalAll(condition, $var)``, from the last one back, as the plugin does."""
    at = sql.rfind(_CONDITIONAL)
    while at != -1:
        args, end = _args(sql, at + len(_CONDITIONAL) - 1)
        if len(args) != 2:
            raise Unexpanded(f"$__conditionalAll takes a condition and a variable, got {len(args)} arguments")
        name = args[1].strip().lstrip("$").strip("{}")
        if name not in values:
            raise Unexpanded(f"$__conditionalAll names ${name}, which the dashboard does not define")
        value = values[name]
        everything = isinstance(value, AllOf) or value in ("", ()) or value == "$__all"
        sql = sql[:at] + ("1=1" if everything else args[0]) + sql[end:]
        at = sql.rfind(_CONDITIONAL)
    return sql


# --------------------------------------------------------------------------- 2. template variables

# Grafana's variable syntax (public/app/features/templating/template_srv: variableRegex)
_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")


def _quote(value: str, escaped: str) -> str:
    return "'" + value.replace("'", escaped) + "'"


def _format(value: Value, fmt: str | None) -> str:
    items = list(value.options) if isinstance(value, AllOf) else [value] if isinstance(value, str) else list(value)
    many = not isinstance(value, str)
    if fmt is None:  # the plugin's own format: a list quoted and joined, one value as it is
        return "'" + "','".join(items) + "'" if many else items[0]
    if fmt == "singlequote":
        return ",".join(_quote(v, "\\'") for v in items)
    if fmt == "sqlstring":
        return ",".join(_quote(v, "''") for v in items)
    if fmt in ("csv", "raw"):
        return ",".join(items)
    raise Unexpanded(f"variable format {fmt!r} is not one this module knows (singlequote, sqlstring, csv, raw)")


def interpolate(sql: str, rng: Range, values: Values) -> str:
    """Step 2: Grafana's template variables (and ``__from`` / ``__to``); unknown names stay."""
    known: dict[str, Value] = {**values, "__from": str(rng.from_ms), "__to": str(rng.to_ms)}

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if name not in known:
            return m.group(0)
        return _format(known[name], fmt)

    return _VARIABLE.sub(one, sql)


# --------------------------------------------------------------------------- 3. the back end's macros


def _seconds(t: datetime) -> str:
    return f"toDateTime({int(t.timestamp())})"


def _millis(t: datetime) -> str:
    return f"fromUnixTimestamp64Milli({int(t.timestamp() * 1000)})"


def _date(t: datetime) -> str:
    return f"toDate('{t.astimezone(UTC):%Y-%m-%d}')"


def _interval_s(rng: Range) -> int:
    return int(max(rng.interval_s, 1.0))


def _one(name: str, args: list[str]) -> str:
    if len(args) != 1 or not args[0]:
        raise Unexpanded(f"$__{name} takes one argument (a column), got {args}")
    return args[0]


def _between(column: str, lo: str, hi: str) -> str:
    return f"{column} >= {lo} AND {column} <= {hi}"


_PERIOD = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_PERIOD_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _time_group(rng: Range, args: list[str]) -> str:
    period = _PERIOD.fullmatch(args[1]) if len(args) == 2 else None
    if period is None:
        raise Unexpanded(f"$__timeGroup takes a column and a period such as 5m, got {args}")
    seconds = max(int(int(period.group(1)) * _PERIOD_S[period.group(2)]), 1)
    return f"toStartOfInterval(toDateTime({args[0]}), INTERVAL {seconds} second)"


def _date_time(rng: Range, args: list[str]) -> str:
    if len(args) != 2:
        raise Unexpanded(f"$__dateTimeFilter takes a date column and a time column, got {args}")
    dates = _between(args[0], _date(rng.start), _date(rng.end))
    return f"({dates}) AND ({_between(args[1], _seconds(rng.start), _seconds(rng.end))})"


_MACROS: dict[str, Callable[[Range, list[str]], str]] = {
    "fromTime": lambda r, a: _seconds(r.start),
    "toTime": lambda r, a: _seconds(r.end),
    "fromTime_ms": lambda r, a: _millis(r.start),
    "toTime_ms": lambda r, a: _millis(r.end),
    "timeFilter": lambda r, a: _between(_one("timeFilter", a), _seconds(r.start), _seconds(r.end)),
    "timeFilter_ms": lambda r, a: _between(_one("timeFilter_ms", a), _millis(r.start), _millis(r.end)),
    "timeFrom": lambda r, a: f"{_one('timeFrom', a)} >= {_seconds(r.start)}",
    "timeTo": lambda r, a: f"{_one('timeTo', a)} <= {_seconds(r.end)}",
    "dateFilter": lambda r, a: _between(_one("dateFilter", a), _date(r.start), _date(r.end)),
    "dateTimeFilter": _date_time,
    "dt": _date_time,
    "timeInterval": lambda r, a: (
        f"toStartOfInterval(toDateTime({_one('timeInterval', a)}), INTERVAL {_interval_s(r)} second)"
    ),
    "timeInterval_ms": lambda r, a: (
        f"toStartOfInterval(toDateTime64({_one('timeInterval_ms', a)}, 3), "
        f"INTERVAL {max(int(r.interval_s * 1000), 1)} millisecond)"
    ),
    "timeGroup": _time_group,
    "interval_s": lambda r, a: str(_interval_s(r)),
}


def _macros(sql: str, rng: Range) -> str:
    """Step 3: the back end's macros, each found as ``sqlds`` finds it (module docstring)."""
    for name, macro in _MACROS.items():
        pattern = re.compile(r"\$__" + re.escape(name) + r"\b(?:\((.*?)\))?")
        for m in list(pattern.finditer(sql)):
            args = [a.strip() for a in m.group(1).split(",")] if m.group(1) is not None else []
            sql = sql.replace(m.group(0), macro(rng, args))
    unknown = re.search(r"\$__\w+", sql)
    if unknown:
        raise Unexpanded(f"{unknown.group(0)} is not one of the ClickHouse data source's documented macros")
    return sql


# --------------------------------------------------------------------------- a dashboard's variables


def _options(
    variable: Mapping[str, Any], rng: Range, values: Values, run: Callable[[str], Sequence[Sequence[Any]]]
) -> list[str]:
    kind = variable["type"]
    if kind == "custom":
        return [o.strip() for o in str(variable["query"]).split(",") if o.strip()]
    query = variable["query"]
    sql = query["rawSql"] if isinstance(query, Mapping) else str(query)
    rows = run(expand(sql, rng, values))
    # one column: text and value; two: the value, then the text (the plugin's convention)
    return [str(row[0]) for row in rows]


def resolve(
    dashboard: Mapping[str, Any],
    rng: Range,
    run: Callable[[str], Sequence[Sequence[Any]]],
    picked: Values | None = None,
) -> dict[str, Value]:
    """Every variable of ``dashboard``'s templating list, in its order (a variable may use those above
    it), as Grafana fills them in: ``picked`` where given; a textbox or constant its query; a query or
    custom variable the options it reads, "All" where it is the current choice, else its first option
    (Grafana's choice when the saved one is not among the options); a data source variable none."""
    picked = dict(picked or {})
    values: dict[str, Value] = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        name, kind = variable["name"], variable["type"]
        if kind == "datasource":
            continue
        if name in picked:
            values[name] = picked[name]
        elif kind in ("textbox", "constant"):
            values[name] = str(variable.get("query", ""))
        elif kind in ("query", "custom"):
            options = _options(variable, rng, values, run)
            current = variable.get("current", {}).get("value")
            if variable.get("includeAll") and current in ("$__all", ["$__all"]):
                values[name] = AllOf(tuple(options))
            elif options:
                values[name] = options[0]
            else:
                raise Unexpanded(f"variable {name} has no options on this store and range")
        else:
            raise Unexpanded(f"variable {name}: type {kind!r} is not one this module expands")
    return values
