"""Alert expressions: a built-in analytics signal with parameters, or a ClickHouse ``SELECT``.

In:  an ``expr`` text from a rule, e.g. ``kv_cache_usage_max{window="1m", model=~"tiny-.*"}``,
     ``slo_burn_rate{window="1h", short="5m"}`` or ``SELECT replica, max(x) AS value FROM ...``;
     at evaluation a ``Context`` (ClickHouse client, metadata sessions, cost weights) and the
     evaluation time.
Out: ``parse_expr`` -> ``Expr`` (errors name the signal's parameters); ``evaluate`` -> the
     ``Sample`` list (labels, value) the rule's condition is applied to. Every number comes from
     ``analytics``; a cycle cache (``Context.cache``) makes rules that share a signal and its
     parameters read it once, and their label matchers (``model="x"``, ``replica!~"r-.*"``) are
     applied to the shared answer.

A parameter that the signal does not take is a label matcher (``= != =~ !~``) on its answer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from adhoc.guard import Refused, check
from adhoc.runner import Limits
from alerts.model import Matcher
from analytics.vllm import KV_CACHE_USAGE, REQUESTS_WAITING
from common.durations import parse_duration

__all__ = ["SIGNALS", "Context", "Expr", "Sample", "SignalError", "evaluate", "parse_expr"]

# what a rule's SQL may take: ad-hoc SQL's read-only settings (adhoc.runner.Limits) with a rule's budget
RULE_LIMITS = Limits(timeout_s=10, max_rows=10_000)


class SignalError(Exception):
    """The expression could not be evaluated (the store failed, or the SQL did)."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    # facts about the value for the notification, not part of the alert's identity:
    # ``{{ $extra.NAME }}`` in annotations (e.g. a burn rate's window ``coverage``)
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Param:
    default: str
    kind: str = "duration"  # duration | choice | number | text
    choices: tuple[str, ...] = ()
    help: str = ""


@dataclass(frozen=True)
class Signal:
    name: str
    help: str
    params: dict[str, Param]
    fn: Callable[[Context, dict[str, Any], datetime], list[Sample]]
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Expr:
    text: str
    signal: str | None  # None: SQL
    params: tuple[tuple[str, Any], ...] = ()
    matchers: tuple[Matcher, ...] = ()

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass
class Context:
    client: Any
    sessions: Any = None  # metadata DB (SLO targets, GPU prices)
    weights: Any = None  # analytics.cost.TokenWeights
    cache: dict[tuple, Any] = field(default_factory=dict)  # one evaluation cycle's answers
    shared: bool = True  # False: every rule reads its own answer (the benchmark's reference)

    def new_cycle(self) -> None:
        self.cache.clear()


_CALL = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*(?:\{(.*)\})?\s*$", re.DOTALL)
_SQL = re.compile(r"^\s*(SELECT|WITH)\b", re.IGNORECASE)


def parse_expr(text: str) -> Expr:
    """Read ``signal{k="v", ...}`` or a SQL ``SELECT``; raise ``ValueError`` saying what is wrong."""
    if _SQL.match(text):
        try:  # the same statement check as ad-hoc SQL: one read-only SELECT of this store
            check(text)
        except Refused as exc:
            raise ValueError(f"the rule's SQL is refused: {exc}") from None
        return Expr(text=text.strip(), signal=None)
    m = _CALL.match(text)
    if not m:
        raise ValueError(
            f'expr {text.strip()[:60]!r}: write a built-in signal such as kv_cache_usage_max{{window="1m"}} '
            "or a ClickHouse SELECT"
        )
    name, inner = m.group(1), m.group(2) or ""
    if name not in SIGNALS:
        import difflib

        hint = difflib.get_close_matches(name, SIGNALS, n=1)
        raise ValueError(
            f"unknown signal {name!r}"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; known: {', '.join(sorted(SIGNALS))}"
        )
    signal = SIGNALS[name]
    from alerts.model import parse_matchers

    params: dict[str, Any] = {}
    matchers: list[Matcher] = []
    for matcher in parse_matchers(inner):
        if matcher.name in signal.params:
            if matcher.op != "=":
                raise ValueError(f"{name}: parameter {matcher.name} takes =, not {matcher.op}")
            params[matcher.name] = _param(name, matcher.name, signal.params[matcher.name], matcher.value)
        else:
            matchers.append(matcher)
    for key, p in signal.params.items():
        params.setdefault(key, _param(name, key, p, p.default))
    return Expr(text=text.strip(), signal=name, params=tuple(sorted(params.items())), matchers=tuple(matchers))


def _param(signal: str, key: str, p: Param, value: str) -> Any:
    if p.kind == "duration":
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"{signal}: {key}: {exc}") from None
        if seconds <= 0:
            raise ValueError(f"{signal}: {key} must be longer than 0")
        return seconds
    if p.kind == "choice":
        if value not in p.choices:
            raise ValueError(f"{signal}: {key} must be one of {', '.join(p.choices)}, not {value!r}")
        return value
    if p.kind == "number":
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{signal}: {key} must be a number, not {value!r}") from None
    return value


def evaluate(ctx: Context, expr: Expr, at: datetime) -> list[Sample]:
    """The samples of ``expr`` at ``at`` (label matchers applied); ``SignalError`` on failure."""
    key = (expr.signal, expr.params, expr.text if expr.signal is None else "", at)
    if not ctx.shared:
        ctx.cache.pop(key, None)
    if key not in ctx.cache:
        try:
            if expr.signal is None:
                ctx.cache[key] = _sql(ctx, expr.text, at)
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
    return [s for s in answer if all(m.matches(s.labels) for m in expr.matchers)]


# --- the built-in signals ----------------------------------------------------------------------

BY = Param("replica", "choice", ("replica", "model"), "group by replica or model")
BY_MODEL = Param("model", "choice", ("replica", "model"), "group by model or replica")


def _window(at: datetime, p: dict[str, Any], key: str = "window") -> tuple[datetime, datetime]:
    return at - timedelta(seconds=p[key]), at


def _frame(df: pd.DataFrame, labels: list[str], column: str) -> list[Sample]:
    out = []
    for row in df.itertuples(index=False):
        value = getattr(row, column)
        if value is None or pd.isna(value):
            continue
        out.append(Sample({k: str(getattr(row, k)) for k in labels}, float(value)))
    return out


def _gauge(metric: str, column: str) -> Callable[[Context, dict[str, Any], datetime], list[Sample]]:
    def fn(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
        from analytics.metrics import gauge_summary

        start, end = _window(at, p)
        return _frame(gauge_summary(ctx.client, metric, start, end, p["by"]), [p["by"]], column)

    return fn


def _replica_up(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.health import scrape_health

    start, end = _window(at, p)
    df = scrape_health(ctx.client, start, end)
    df["up_value"] = df["up"].astype(float)
    return _frame(df, ["replica", "instance", "job"], "up_value")


def _scrape_success(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.health import scrape_health

    start, end = _window(at, p)
    return _frame(scrape_health(ctx.client, start, end), ["replica", "instance", "job"], "up_share")


def _waiting_growth(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.metrics import gauge_summary
    from analytics.saturation import WAITING

    start, end = _window(at, p)
    middle = start + (end - start) / 2
    before = gauge_summary(ctx.client, WAITING, start, middle, p["by"])[[p["by"], "avg"]]
    after = gauge_summary(ctx.client, WAITING, middle, end, p["by"])[[p["by"], "avg"]]
    both = after.merge(before, on=p["by"], suffixes=("_after", "_before"))
    both["growth"] = both["avg_after"] - both["avg_before"]
    return _frame(both, [p["by"]], "growth")


def _preemptions(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.metrics import counter_increase
    from analytics.saturation import PREEMPTIONS

    start, end = _window(at, p)
    df = counter_increase(ctx.client, PREEMPTIONS, start, end, p["by"])
    df["rate"] = df["increase"] / p["window"]
    return _frame(df, [p["by"]], "rate")


def _stalled(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.stalls import stalls

    start, end = _window(at, p)
    found = stalls(ctx.client, start, end)
    found = found[found["ongoing"]]
    return [
        Sample({"replica": str(r.replica), "model": str(r.model)}, float(r.seconds))
        for r in found.itertuples(index=False)
    ]


def _buckets(ctx: Context, family: str, start: datetime, end: datetime, by: str = "model") -> pd.DataFrame:
    """``histogram_buckets`` of one window, read once per cycle: p99 TTFT, its p90, the SLO ratio
    and the burn rates over the same window all interpolate in the same buckets."""
    from analytics.metrics import histogram_buckets

    key = ("buckets", family, start, end, by)
    if key not in ctx.cache:
        ctx.cache[key] = histogram_buckets(ctx.client, family, start, end, by)
    return ctx.cache[key]


def _quantile(metric: str | None, q: float | None) -> Callable[[Context, dict[str, Any], datetime], list[Sample]]:
    def fn(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
        from analytics.latency import LATENCIES
        from analytics.metrics import bucket_quantile

        start, end = _window(at, p)
        buckets = _buckets(ctx, LATENCIES[metric or p["metric"]].family, start, end, p["by"])
        level = q if q is not None else p["q"]
        out = []
        for group, frame in buckets.groupby(p["by"], sort=True) if len(buckets) else ():
            counts = frame["count"].to_numpy(float)
            if counts[-1] > 0:
                out.append(Sample({p["by"]: str(group)}, bucket_quantile(level, frame["le"].to_numpy(float), counts)))
        return out

    return fn


def _targets(ctx: Context, metric: str | None = None) -> list:
    if ctx.sessions is None:
        return []
    from storage.catalog import slo_targets

    key = ("slo-targets",)
    if key not in ctx.cache:
        ctx.cache[key] = slo_targets(ctx.sessions)
    return [t for t in ctx.cache[key] if metric is None or t.metric == metric]


def min_requests_for(q: float) -> int:
    """The fewest requests whose ``q`` quantile is more than their largest value alone."""
    return 1 if q >= 1 else max(1, math.ceil(1 / (1 - q) - 1e-9))


def _over_slo(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.slo import slo_attainment

    targets = _targets(ctx, p["metric"])
    if not targets:
        return []
    start, end = _window(at, p)
    df = slo_attainment(ctx.client, targets, start, end, buckets=lambda f, s, e: _buckets(ctx, f, s, e))
    out = []
    for t, row in zip(targets, df.itertuples(index=False), strict=True):
        # the p99 of 30 requests is the slowest of them, not a p99: a window answers once it holds
        # enough observations for its percentile (1 / (1 - p): 100 for a p99), or min_requests
        # (the histogram's count: requests for TTFT and e2e, tokens for ITL and TPOT)
        need = p["min_requests"] or min_requests_for(t.percentile or t.objective)
        if need < 0:
            raise SignalError(f"min_requests must be 0 (the percentile's own) or more, not {p['min_requests']:g}")
        if row.requests and row.requests >= need and not pd.isna(row.observed):
            out.append(
                Sample(
                    {"model": t.model, "metric": t.metric, "slo": t.label}, float(row.observed) / t.threshold_seconds
                )
            )
    return out


def _burn(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.slo import burn_rates, window_coverage

    targets = _targets(ctx, None if p["metric"] == "any" else p["metric"])
    if not targets:
        return []
    # a window the data covers only in part is not that window: a young fleet's "3 days" are
    # its first minutes; below the stated coverage the signal has no answer (the rule's no_data)
    covered = window_coverage(ctx.client, at - timedelta(seconds=p["window"]), at)
    if covered < p["min_coverage"]:
        return []
    windows = (("x", timedelta(seconds=p["window"]), timedelta(seconds=p["short"]), 0.0),)
    df = burn_rates(ctx.client, targets, at, windows=windows, buckets=lambda f, s, e: _buckets(ctx, f, s, e))
    df["burn"] = df[["burn_long", "burn_short"]].min(axis=1, skipna=False)
    return [
        Sample({"model": r.model, "metric": r.metric, "slo": r.label}, float(r.burn), {"coverage": covered})
        for r in df.itertuples(index=False)
        if not pd.isna(r.burn)
    ]


def _errors(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.requests import error_ratio

    start, end = _window(at, p)
    df = error_ratio(ctx.client, start, end, (p["by"],))
    return _frame(df, [p["by"]], "error_ratio")


def _cost(ctx: Context, p: dict[str, Any], at: datetime, shift: timedelta = timedelta(0)) -> pd.DataFrame:
    from analytics.cost import cost_per_token
    from storage.catalog import gpu_prices

    if ("prices",) not in ctx.cache:
        ctx.cache[("prices",)] = gpu_prices(ctx.sessions) if ctx.sessions is not None else {}
    start, end = _window(at - shift, p)
    return cost_per_token(ctx.client, start, end, ctx.cache[("prices",)], by=p["by"], weights=ctx.weights)


def _cost_per_mtok(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    try:
        return _frame(_cost(ctx, p, at), [p["by"]], "cost_per_million_tokens")
    except KeyError:  # replicas without a gpu_type label or price: nothing to say, not an error
        return []


def _cost_change(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    try:
        now = _cost(ctx, p, at)[[p["by"], "cost_per_million_tokens"]]
        then = _cost(ctx, p, at, timedelta(seconds=p["offset"]))[[p["by"], "cost_per_million_tokens"]]
    except KeyError:  # replicas without a gpu_type label or price: nothing to say, not an error
        return []
    both = now.merge(then, on=p["by"], suffixes=("", "_then"))
    both["change"] = (both["cost_per_million_tokens"] / both["cost_per_million_tokens_then"] - 1) * 100
    both = both[both["cost_per_million_tokens_then"] > 0]
    return _frame(both, [p["by"]], "change")


def _cost_jump(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    """Percent change of cost per 1M tokens: the last ``window`` against the ``baseline`` before
    it (what there is of it: a young fleet compares with its first minutes), per model or tenant."""
    from analytics.cost_series import cost_over_time
    from storage.catalog import gpu_prices

    if ("prices",) not in ctx.cache:
        ctx.cache[("prices",)] = gpu_prices(ctx.sessions) if ctx.sessions is not None else {}
    recent_start = at - timedelta(seconds=p["window"])
    start = recent_start - timedelta(seconds=p["baseline"])
    step = max(60, int(p["window"]) // 15)
    try:
        series = cost_over_time(
            ctx.client, start, at, ctx.cache[("prices",)], by=p["by"], step=step, weights=ctx.weights
        )
    except KeyError:  # replicas without a gpu_type label or price: nothing to say, not an error
        return []
    if series.empty:
        return []
    series = series[series["ts"] < pd.Timestamp(at)]
    recent = series[series["ts"] >= pd.Timestamp(recent_start)]
    base = series[series["ts"] < pd.Timestamp(recent_start)]
    out = []
    for key, frame in recent.groupby(p["by"]):
        before = base[base[p["by"]] == key]
        if len(before) < 2 or before["tokens"].sum() <= 0 or frame["tokens"].sum() <= 0:
            continue  # too little baseline to compare with, or no tokens on a side: no data
        now_cost = frame["spend"].sum() / frame["tokens"].sum()
        then_cost = before["spend"].sum() / before["tokens"].sum()
        if then_cost > 0:
            out.append(Sample({p["by"]: str(key)}, float((now_cost / then_cost - 1) * 100)))
    return out


def _drift(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.drift import drift

    start, end = _window(at, p)
    try:
        df = drift(ctx.client, (start, end), p["reference"])
    except ValueError:  # a window without request-log rows: no data, not an error
        return []
    return [Sample({}, float(df.attrs["share_drifted"]))]


def _sql(ctx: Context, text: str, at: datetime) -> list[Sample]:
    """A rule's SQL, checked as ad-hoc SQL is (``adhoc.guard``) and run with its read-only
    settings (``readonly=1``, time, rows and memory: ``RULE_LIMITS``) on the shared client."""
    try:
        sql = check(text).sql
    except Refused as exc:
        raise SignalError(f"the rule's SQL is refused: {exc}") from None
    params = {"eval_time": at.replace(tzinfo=None).isoformat(timespec="milliseconds")} if "{eval_time" in text else None
    try:
        result = ctx.client.query(sql, parameters=params, settings=RULE_LIMITS.settings())
    except Exception as exc:  # noqa: BLE001 - ClickHouse's refusal, timeout, memory limit, bad SQL: said as is
        raise SignalError(f"SQL failed: {str(exc).strip().splitlines()[0][:300]}") from None
    if len(result.result_rows) > RULE_LIMITS.max_rows:
        raise SignalError(f"the SQL returns more than {RULE_LIMITS.max_rows:,} rows: aggregate it")
    names = list(result.column_names)
    if "value" not in names:
        raise SignalError(
            f"the SQL returns no `value` column (columns: {', '.join(names) or 'none'}); "
            "alias the number to check as value"
        )
    out = []
    i = names.index("value")
    for row in result.result_rows:
        v = row[i]
        try:
            value = float(v)
        except (TypeError, ValueError):
            raise SignalError(f"the SQL's value is not a number: {v!r}") from None
        if math.isnan(value):
            continue
        out.append(Sample({n: str(row[j]) for j, n in enumerate(names) if j != i}, value))
    return out


def _acceptance(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.specdecode import acceptance

    start, end = _window(at, p)
    df = acceptance(ctx.client, start, end, p["by"])
    df = df[df["draft_tokens"] >= p["min_draft_tokens"]]
    return _frame(df, [p["by"]], "acceptance_rate")


def _acceptance_drop(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    """The acceptance rate of the ``baseline`` before the window minus the window's (points, 0-1)."""
    from analytics.specdecode import acceptance

    start, end = _window(at, p)
    now = acceptance(ctx.client, start, end, p["by"])
    then = acceptance(ctx.client, start - timedelta(seconds=p["baseline"]), start, p["by"])
    both = now.merge(then, on=p["by"], suffixes=("", "_then"))
    both = both[(both["draft_tokens"] >= p["min_draft_tokens"]) & (both["draft_tokens_then"] >= p["min_draft_tokens"])]
    both["drop"] = both["acceptance_rate_then"] - both["acceptance_rate"]
    return [
        Sample(
            {p["by"]: str(getattr(r, p["by"]))},
            float(r.drop),
            {"before": float(r.acceptance_rate_then), "after": float(r.acceptance_rate)},
        )
        for r in both.itertuples(index=False)
    ]


def _deferred(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.adapters import deferred

    start, end = _window(at, p)
    return _frame(deferred(ctx.client, start, end), ["replica"], "deferred_avg")


def _adapter_waiting(ctx: Context, p: dict[str, Any], at: datetime) -> list[Sample]:
    from analytics.adapters import residency

    start, end = _window(at, p)
    return _frame(residency(ctx.client, start, end), ["replica", "adapter"], "blocked_share")


W = Param("1m")
W5 = Param("5m")
MIN_DRAFTS = Param("100", "number", help="draft tokens the window must hold (fewer: no value)")
SIGNALS: dict[str, Signal] = {
    s.name: s
    for s in (
        Signal(
            "replica_up",
            "1 when the target's last scrape succeeded, 0 when it failed",
            {"window": W},
            _replica_up,
            ("replica", "instance", "job"),
        ),
        Signal(
            "scrape_success_ratio",
            "share of successful scrapes per target",
            {"window": W5},
            _scrape_success,
            ("replica", "instance", "job"),
        ),
        Signal(
            "kv_cache_usage_max",
            "highest KV-cache usage (0-1)",
            {"window": W, "by": BY},
            _gauge(KV_CACHE_USAGE, "max"),
            ("replica",),
        ),
        Signal(
            "kv_cache_usage_avg",
            "mean KV-cache usage (0-1)",
            {"window": W, "by": BY},
            _gauge(KV_CACHE_USAGE, "avg"),
            ("replica",),
        ),
        Signal(
            "requests_waiting",
            "mean requests waiting in the engine's queue",
            {"window": W, "by": BY},
            _gauge(REQUESTS_WAITING, "avg"),
            ("replica",),
        ),
        Signal(
            "waiting_growth",
            "mean queue in the window's second half minus its first half",
            {"window": Param("10m"), "by": BY},
            _waiting_growth,
            ("replica",),
        ),
        Signal("preemption_rate", "preemptions per second", {"window": W5, "by": BY}, _preemptions, ("replica",)),
        Signal(
            "engine_stalled",
            "seconds a replica has held requests (running or waiting) without generating a token, "
            "while it is stalled (looked for in the window)",
            {"window": Param("10m")},
            _stalled,
            ("replica", "model"),
        ),
        Signal(
            "ttft_p99",
            "p99 time to first token (s), engine histograms",
            {"window": W5, "by": BY_MODEL},
            _quantile("ttft", 0.99),
            ("model",),
        ),
        Signal(
            "itl_p99",
            "p99 inter-token latency (s), engine histograms",
            {"window": W5, "by": BY_MODEL},
            _quantile("itl", 0.99),
            ("model",),
        ),
        Signal(
            "latency_quantile",
            "a latency quantile (s), engine histograms",
            {
                "window": W5,
                "by": BY_MODEL,
                "metric": Param("ttft", "choice", ("ttft", "itl", "tpot", "e2e", "queue")),
                "q": Param("0.99", "number"),
            },
            _quantile(None, None),
            ("model",),
        ),
        Signal(
            "latency_over_slo",
            "observed percentile / SLO threshold per model (> 1: over the SLO); none until the window "
            "holds enough requests for the percentile",
            {
                "window": W5,
                "metric": Param("ttft", "choice", ("ttft", "itl", "tpot", "e2e")),
                "min_requests": Param(
                    "0",
                    "number",
                    help="requests the window must hold; 0: 1 / (1 - percentile), 100 for a p99",
                ),
            },
            _over_slo,
            ("model", "metric", "slo"),
        ),
        Signal(
            "slo_burn_rate",
            "error-budget burn rate, the lower of the long and the short window; none until the data "
            "covers min_coverage of the long window",
            {
                "window": Param("1h"),
                "short": W5,
                "min_coverage": Param(
                    "0.5", "number", help="share of the long window the data must cover (0-1); $extra.coverage"
                ),
                "metric": Param("any", "choice", ("any", "ttft", "itl", "tpot", "e2e")),
            },
            _burn,
            ("model", "metric", "slo"),
        ),
        Signal(
            "error_ratio",
            "share of requests that failed on the server side (request log)",
            {"window": W5, "by": BY_MODEL},
            _errors,
            ("model",),
        ),
        Signal(
            "cost_per_mtok", "USD per 1M tokens", {"window": Param("1h"), "by": BY_MODEL}, _cost_per_mtok, ("model",)
        ),
        Signal(
            "cost_per_mtok_change",
            "percent change of USD per 1M tokens against the same window `offset` earlier",
            {"window": Param("1h"), "by": BY_MODEL, "offset": Param("7d")},
            _cost_change,
            ("model",),
        ),
        Signal(
            "cost_per_mtok_jump",
            "percent change of USD per 1M tokens: the last `window` against the `baseline` just before it "
            "(fires within the hour on a young fleet)",
            {"window": Param("15m"), "baseline": Param("1h"), "by": Param("model", "choice", ("model", "tenant"))},
            _cost_jump,
            ("model",),
        ),
        Signal(
            "draft_acceptance",
            "speculative decoding: accepted / proposed draft tokens (0-1), replicas that draft",
            {"window": W5, "by": BY, "min_draft_tokens": MIN_DRAFTS},
            _acceptance,
            ("replica",),
        ),
        Signal(
            "draft_acceptance_drop",
            "speculative decoding: the acceptance rate of the `baseline` before the window minus the "
            "window's (0-1); $extra.before and $extra.after",
            {"window": Param("10m"), "baseline": Param("1h"), "by": BY, "min_draft_tokens": MIN_DRAFTS},
            _acceptance_drop,
            ("replica",),
        ),
        Signal(
            "requests_deferred",
            "LoRA: mean requests a replica held back for an adapter slot (vLLM's waiting reason 'deferred')",
            {"window": W5},
            _deferred,
            ("replica",),
        ),
        Signal(
            "adapter_waiting",
            "LoRA: share of a replica's scrape intervals in which requests for the adapter waited for an "
            "adapter slot (every slot running another adapter)",
            {"window": W5},
            _adapter_waiting,
            ("replica", "adapter"),
        ),
        Signal(
            "drift_share",
            "share of request features that drifted against the reference (0-1)",
            {"window": Param("1h"), "reference": Param("trailing-day", "choice", ("trailing-day", "last-week"))},
            _drift,
            (),
        ),
    )
}
