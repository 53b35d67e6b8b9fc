"""Alert expressions: a built-in analytics signal with parameters, or a ClickHouse ``SELECT``.

In:  an ``expr`` text from a rule, e.g. ``kv_cache_usage_max{window="1m", model=~"tiny-.*"}``,
     ``slo_burn_rate{window="1h", short="5m"}`` or ``SELECT replica, max(x) AS value FROM ...``;
     at evaluation a ``Context`` (ClickHouse client, metadata sessions, cost weights) and the
     evaluation time.
Out: ``parse_expr`` -> ``Expr`` (``ExprError`` names the signal's parameters); ``evaluate`` ->
     the ``Sample`` list (labels, value) the rule's condition is applied to, or ``SignalError``.
     The signals are ``alerts.signals.SIGNALS``; every number comes from ``analytics``; a cycle
     cache (``Context.cache``) makes rules that share a signal and its parameters read it once,
     and their label matchers (``model="x"``, ``replica!~"r-.*"``) are applied to the shared
     answer.

A parameter that the signal does not take is a label matcher (``= != =~ !~``) on its answer.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from adhoc.guard import Refused, check
from alerts.errors import ExprError, SignalError
from alerts.model import Matcher, parse_matchers
from alerts.read_sql import query
from alerts.reading import Context, Params, Sample
from alerts.signals import SIGNALS, Param
from common.durations import parse_duration

__all__ = ["Expr", "evaluate", "parse_expr"]


@dataclass(frozen=True)
class Expr:
    text: str
    signal: str | None  # None: SQL
    params: tuple[tuple[str, Any], ...] = ()
    matchers: tuple[Matcher, ...] = ()

    @property
    def kwargs(self) -> Params:
        return dict(self.params)


_CALL = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*(?:\{(.*)\})?\s*$", re.DOTALL)
_SQL = re.compile(r"^\s*(SELECT|WITH)\b", re.IGNORECASE)


def parse_expr(text: str) -> Expr:
    """Read ``signal{k="v", ...}`` or a SQL ``SELECT``; raise ``ExprError`` (a ``ValueError``)
    saying what is wrong."""
    if _SQL.match(text):
        try:  # the same statement check as ad-hoc SQL: one read-only SELECT of this store
            check(text)
        except Refused as exc:
            raise ExprError(f"the rule's SQL is refused: {exc}") from None
        return Expr(text=text.strip(), signal=None)
    m = _CALL.match(text)
    if not m:
        raise ExprError(
            f'expr {text.strip()[:60]!r}: write a built-in signal such as kv_cache_usage_max{{window="1m"}} '
            "or a ClickHouse SELECT"
        )
    name, inner = m.group(1), m.group(2) or ""
    if name not in SIGNALS:
        hint = difflib.get_close_matches(name, SIGNALS, n=1)
        raise ExprError(
            f"unknown signal {name!r}"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; known: {', '.join(sorted(SIGNALS))}"
        )
    signal = SIGNALS[name]
    params: Params = {}
    matchers: list[Matcher] = []
    for matcher in parse_matchers(inner):
        if matcher.name in signal.params:
            if matcher.op != "=":
                raise ExprError(f"{name}: parameter {matcher.name} takes =, not {matcher.op}")
            params[matcher.name] = _param(name, matcher.name, signal.params[matcher.name], matcher.value)
        else:
            matchers.append(matcher)
    for key, p in signal.params.items():
        params.setdefault(key, _param(name, key, p, p.default))
    return Expr(text=text.strip(), signal=name, params=tuple(sorted(params.items())), matchers=tuple(matchers))


def _param(signal: str, key: str, p: Param, value: str) -> float | str:
    if p.kind == "duration":
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise ExprError(f"{signal}: {key}: {exc}") from None
        if seconds <= 0:
            raise ExprError(f"{signal}: {key} must be longer than 0")
        return seconds
    if p.kind == "choice":
        if value not in p.choices:
            raise ExprError(f"{signal}: {key} must be one of {', '.join(p.choices)}, not {value!r}")
        return value
    if p.kind == "number":
        try:
            return float(value)
        except ValueError:
            raise ExprError(f"{signal}: {key} must be a number, not {value!r}") from None
    return value


def evaluate(ctx: Context, expr: Expr, at: datetime) -> list[Sample]:
    """The samples of ``expr`` at ``at`` (label matchers applied); ``SignalError`` on failure."""
    key = (expr.signal, expr.params, expr.text if expr.signal is None else "", at)
    if not ctx.shared:
        ctx.cache.pop(key, None)
    if key not in ctx.cache:
        try:
            if expr.signal is None:
                ctx.cache[key] = query(ctx, expr.text, at)
            else:
                ctx.cache[key] = SIGNALS[expr.signal].fn(ctx, expr.kwargs, at)
        except SignalError as exc:
            ctx.cache[key] = exc
        except Exception as exc:  # noqa: BLE001 - the store's or the analytics' failure, named
            ctx.cache[key] = SignalError(
                f"{expr.signal or 'SQL'}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            )
    answer = ctx.cache[key]
    if isinstance(answer, SignalError):
        raise answer
    samples: list[Sample] = answer
    return [s for s in samples if all(m.matches(s.labels) for m in expr.matchers)]
