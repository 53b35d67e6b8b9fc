"""Metric queries on the tier that fits the window: counter increases, gauge summaries and
histogram quantiles, grouped by a series label.

In:  a client, a metric (for histograms the family name, e.g. ``vllm:time_to_first_token_seconds``),
     a window ``[start, end)``, ``by`` (replica, model, instance, fingerprint), and optionally a
     forced tier / the retention / the current time (``analytics.tiers.plan``).
Out: DataFrames, one row per group, plus ``.attrs["plan"]`` (the tier and aligned window used):
     - ``counter_increase``: ``[by, increase]``: per series, the last value in the window minus
       the last one before it (looked up to ``LOOKBACK`` back; without one, the series' first
       value in the window), plus the values before counter resets (``samples.reset``):
       Prometheus' ``increase()`` without extrapolation. On a rollup tier, the sum of the
       buckets' stored increases, which the collector computed the same way sample by sample
       (the ``increase`` it inserts into ``samples_ingest``, migration 0016), so raw rows and
       rollups give the same numbers;
       when a drop nobody marked (the collector was away across an engine restart) would make
       the total negative, the series counts from zero at the window's end value instead (the
       part before the drop is lost; a marked reset loses nothing);
     - ``gauge_summary``: ``[by, min, max, avg, last, replicas, samples]``: ``avg`` weights every
       sample equally (``samples`` of them), ``last`` is the mean over the group's series of each
       series' last value;
     - ``histogram_quantile``: ``[by, quantile, count]``: Prometheus' ``histogram_quantile`` over
       the bucket increases summed per ``le`` (linear interpolation inside the bucket; the
       highest finite bound when the rank falls in ``+Inf``; NaN without observations).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from typing_extensions import Unpack

from analytics.counters import GROUPS, LABELS, marked_increases, series_latest, sums_by_labels
from analytics.errors import BadInput
from analytics.filters import Filters
from analytics.frames import query_df
from analytics.tiers import Plan, between, param_time, plan_scope, time_param
from analytics.window import Scope
from storage.clickhouse import Client

__all__ = [
    "LOOKBACK",
    "bucket_quantile",
    "bucket_share_below",
    "counter_increase",
    "counter_increases",
    "gauge_summaries",
    "gauge_summary",
    "histogram_buckets",
    "histogram_quantile",
    "one_metric",
    "series_increase",
]

LOOKBACK = timedelta(minutes=15)  # how far before a window its "previous sample" is looked for
# per-series aggregation follows the tables' sort key (metric, fingerprint, ts): stream it
SETTINGS = {"optimize_aggregation_in_order": 1}


def _check_by(by: str) -> None:
    if by not in GROUPS:
        raise BadInput(f"by must be one of {', '.join(GROUPS)}")


def _params(metrics: str | list[str] | tuple[str, ...], p: Plan) -> dict[str, object]:
    lookback = max(LOOKBACK, p.tier.resolution)
    return {
        "metrics": [metrics] if isinstance(metrics, str) else list(metrics),
        "start": param_time(p.start),
        "end": param_time(p.end),
        "lookback_start": param_time(p.start - lookback),
    }


def _series_filter(filters: Filters | None, params: dict[str, object]) -> tuple[str, dict[str, object]]:
    """(condition on the joined series ``s``, parameters): ``1`` without filters."""
    condition, extra = filters.series() if filters else ("", {})
    return condition or "1", {**params, **extra}


def series_increase(p: Plan) -> str:
    """SQL: ``[fingerprint, increase]`` of every series of the ``{metrics}`` over the plan's window.

    On a rollup tier, the sum of the window's buckets' stored increases (each from the sample
    before the bucket to its last one: migrations/clickhouse/0011_rollup_increases.sql)."""
    if p.tier.rollup:
        return f"""
            SELECT fingerprint, sum(increase) AS increase
            FROM {p.samples} WHERE {_where("", rollup=True)} GROUP BY fingerprint"""
    # the window is one bucket, the lookback before it the other (its last value the base)
    found = marked_increases(f"ts >= {time_param('start', False)}", "t = 1")
    return f"SELECT fingerprint, increase FROM ({found}) WHERE NOT isNaN(increase)"


def _window_sums(p: Plan, labels: dict[str, str], series_where: str) -> str:
    """SQL: ``[<labels>, total]``: the series' increases over the plan's window summed per group
    of ``labels`` (on a rollup tier straight from its buckets' stored increases)."""
    if p.tier.rollup:
        return sums_by_labels(p.samples, "increase", labels, where=_where(rollup=True), series_where=series_where)
    return sums_by_labels(f"({series_increase(p)})", "increase", labels, series_where=series_where)


def _where(alias: str = "v.", rollup: bool = False) -> str:
    return f"{alias}metric IN {{metrics:Array(String)}} AND {between(rollup, f'{alias}ts')}"


def counter_increase(
    client: Client, metric: str, start: datetime, end: datetime, by: str = "replica", **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Reset-aware increase of counter ``metric`` per ``by`` over ``[start, end)``."""
    df = counter_increases(client, [metric], start, end, by, **scope)
    return one_metric(df)


def counter_increases(
    client: Client,
    metrics: list[str] | tuple[str, ...],
    start: datetime,
    end: datetime,
    by: str = "replica",
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """``counter_increase`` of several counters in one query: ``[metric, by, increase]``."""
    _check_by(by)
    p = plan_scope(client, start, end, scope)
    series_where, params = _series_filter(scope.get("filters"), _params(metrics, p))
    sums = _window_sums(p, {"metric": "s.metric", by: LABELS[by]}, series_where)
    sql = f"SELECT metric, {by}, total AS increase FROM ({sums}) ORDER BY metric, {by}"
    df = query_df(client, sql, parameters=params, settings=SETTINGS)
    df.attrs["plan"] = p
    return df


def one_metric(df: pd.DataFrame) -> pd.DataFrame:
    """A one-metric answer of the many-metric functions (here and in ``analytics.timeseries``)
    without its ``metric`` column, its ``.attrs`` kept."""
    out = df.drop(columns=["metric"]).reset_index(drop=True)
    out.attrs.update(df.attrs)
    return out


def gauge_summary(
    client: Client, metric: str, start: datetime, end: datetime, by: str = "replica", **scope: Unpack[Scope]
) -> pd.DataFrame:
    """min / max / avg / last of gauge ``metric`` per ``by`` over ``[start, end)``."""
    df = gauge_summaries(client, [metric], start, end, by, **scope)
    return one_metric(df)


def gauge_summaries(
    client: Client,
    metrics: list[str] | tuple[str, ...],
    start: datetime,
    end: datetime,
    by: str = "replica",
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """``gauge_summary`` of several gauges in one query: ``[metric, by, min, max, avg, last,
    replicas, samples]`` (``replicas``: how many replicas reported the gauge; ``samples``: how many
    samples ``avg`` is the mean of)."""
    _check_by(by)
    p = plan_scope(client, start, end, scope)
    series_where, params = _series_filter(scope.get("filters"), _params(metrics, p))
    if p.tier.rollup:
        per_series = f"""
            SELECT v.fingerprint AS fingerprint, min(v.value_min) AS lo, max(v.value_max) AS hi,
                   sum(v.value_sum) AS total, sum(v.value_count) AS n,
                   argMax(v.value_last.2, v.value_last.1) AS last
            FROM {p.samples} AS v WHERE {_where(rollup=True)} GROUP BY v.fingerprint"""
    else:
        per_series = f"""
            SELECT v.fingerprint AS fingerprint, minIf(v.value, isFinite(v.value)) AS lo,
                   maxIf(v.value, isFinite(v.value)) AS hi, sumIf(v.value, isFinite(v.value)) AS total,
                   countIf(isFinite(v.value)) AS n, argMaxIf(v.value, v.ts, NOT isNaN(v.value)) AS last
            FROM samples AS v WHERE {_where()} GROUP BY v.fingerprint"""
    group = GROUPS[by]
    sql = f"""
        SELECT s.metric AS metric, {group} AS {by}, min(v.lo) AS min, max(v.hi) AS max,
               if(sum(v.n) > 0, sum(v.total) / sum(v.n), nan) AS avg, avg(v.last) AS last,
               uniqExact(s.replica) AS replicas, sum(v.n) AS samples
        FROM ({per_series}) AS v
        INNER JOIN ({series_latest("metrics", many=True)}) AS s ON s.fingerprint = v.fingerprint
        WHERE v.n > 0 AND {series_where}
        GROUP BY metric, {by} ORDER BY metric, {by}
    """
    df = query_df(client, sql, parameters=params, settings=SETTINGS)
    df.attrs["plan"] = p
    return df


def bucket_quantile(q: float, bounds: np.ndarray, counts: np.ndarray) -> float:
    """Prometheus' ``histogram_quantile`` for cumulative ``counts`` at upper ``bounds`` (sorted,
    the last one ``+Inf``)."""
    if not 0 <= q <= 1:
        return math.nan if math.isnan(q) else (math.inf if q > 1 else -math.inf)
    if len(bounds) < 2 or not math.isinf(bounds[-1]):
        return math.nan
    counts = np.maximum.accumulate(counts)  # tolerate non-monotone sums (float noise)
    total = counts[-1]
    if total <= 0:
        return math.nan
    rank = q * total
    i = int(np.searchsorted(counts, rank, side="left"))
    if i == len(bounds) - 1:
        return float(bounds[-2])
    upper = float(bounds[i])
    lower, below = (0.0, 0.0) if i == 0 else (float(bounds[i - 1]), float(counts[i - 1]))
    if i == 0 and upper <= 0:
        return upper
    in_bucket = counts[i] - below
    if in_bucket <= 0:  # q = 0 on an empty first bucket: 0/0 in Prometheus too
        return math.nan
    return float(lower + (upper - lower) * (rank - below) / in_bucket)


def histogram_buckets(
    client: Client, metric: str, start: datetime, end: datetime, by: str = "model", **scope: Unpack[Scope]
) -> pd.DataFrame:
    """``[by, le, count]``: histogram family ``metric``'s bucket increases over ``[start, end)``
    summed per ``by`` and upper bound (cumulative, as exposed)."""
    _check_by(by)
    p = plan_scope(client, start, end, scope)
    series_where, params = _series_filter(scope.get("filters"), _params(f"{metric}_bucket", p))
    sums = _window_sums(p, {by: LABELS[by], "le": "s.le"}, f"NOT isNaN(s.le) AND {series_where}")
    sql = f"SELECT {by}, le, total AS count FROM ({sums}) ORDER BY {by}, le"
    buckets = query_df(client, sql, parameters=params, settings=SETTINGS)
    buckets.attrs["plan"] = p
    return buckets


def bucket_share_below(threshold: float, bounds: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """(observations <= ``threshold``, all observations) of cumulative ``counts`` at ``bounds``,
    interpolating linearly inside the bucket the threshold falls in (as ``histogram_quantile``
    does in the other direction)."""
    counts = np.maximum.accumulate(np.asarray(counts, dtype=float))
    total = float(counts[-1]) if len(counts) else 0.0
    if total <= 0:
        return 0.0, 0.0
    i = int(np.searchsorted(bounds, threshold, side="left"))  # the first bound >= threshold
    if i >= len(bounds):
        return total, total
    if math.isinf(bounds[i]):  # above the highest finite bound: the +Inf bucket's share is unknown, not good
        return (float(counts[i - 1]) if i > 0 else 0.0), total
    if bounds[i] == threshold:
        return float(counts[i]), total
    lower, below = (0.0, 0.0) if i == 0 else (float(bounds[i - 1]), float(counts[i - 1]))
    upper = float(bounds[i])
    if upper <= lower:
        return below, total
    return below + (counts[i] - below) * (threshold - lower) / (upper - lower), total


def histogram_quantile(
    client: Client, metric: str, q: float, start: datetime, end: datetime, by: str = "model", **scope: Unpack[Scope]
) -> pd.DataFrame:
    """The ``q`` quantile of histogram family ``metric`` per ``by`` over ``[start, end)``."""
    buckets = histogram_buckets(client, metric, start, end, by, **scope)
    rows = []
    for group, frame in buckets.groupby(by, sort=True) if len(buckets) else ():
        bounds, counts = frame["le"].to_numpy(float), frame["count"].to_numpy(float)
        rows.append({by: group, "quantile": bucket_quantile(q, bounds, counts), "count": float(counts[-1])})
    df = pd.DataFrame(rows, columns=[by, "quantile", "count"])
    df.attrs["plan"] = buckets.attrs["plan"]
    return df
