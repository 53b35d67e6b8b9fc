"""Engine metrics over time: counter rates, gauge levels and histogram quantiles per step.

In:  a client, a metric (histograms by family name), a window ``[start, end)``, a step (seconds;
     ``auto_step`` picks one for about 120 points; rounded up to whole buckets of a rollup tier),
     the window widened to whole steps (``.attrs["plan"]`` has it: every step is complete),
     ``by`` (replica, model, instance) and ``Filters`` (model, replica).
Out: long DataFrames with a ``ts`` column (the step's start, UTC) and ``.attrs["plan"]``:
     - ``counter_rate_over_time``: ``[ts, by, increase, rate]``: per step, the reset-aware
       increase (``analytics.metrics`` semantics: last value - the previous step's last value
       + the reset marks in between; on a rollup tier the sum of the buckets' stored increases)
       summed over the group's series, and per second;
     - ``gauge_over_time``: ``[ts, by, avg, max, min, replicas, series]``: each series' mean /
       max / min in the step, then ``agg`` over the group's series ("avg": mean of the means,
       "sum": sum of the means, e.g. requests waiting in a model's pool), and how many replicas
       and series reported;
     - ``histogram_quantiles_over_time``: ``[ts, by, q, value, count]``: Prometheus'
       ``histogram_quantile`` of the step's bucket increases (``bucket_quantiles``).
     - ``histogram_heatmap_over_time``: ``[ts, low, high, count]``: the observations per step
       and bucket over the fleet (a latency heatmap);
     - ``histograms``: several families from one query, each a ``Histogram`` (the quantiles per
       step and over the window, and the heatmap), for a page that shows them together.
The per-step arithmetic runs in ClickHouse (window functions over per-step aggregates);
only the final interpolation inside one bucket row per (step, group) happens in numpy.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import NamedTuple

import numpy as np
import pandas as pd
from typing_extensions import Unpack

from analytics.counters import GROUPS, LABELS, marked_increases, series_latest, sums_by_labels
from analytics.errors import BadInput
from analytics.filters import Filters
from analytics.frames import query_df
from analytics.metrics import LOOKBACK, SETTINGS, one_metric
from analytics.tiers import Plan, align, between, param_time, plan_scope
from analytics.window import Scope
from storage.clickhouse import Client

__all__ = [
    "auto_step",
    "bucket_quantiles",
    "counter_rate_over_time",
    "counter_rates_over_time",
    "gauge_over_time",
    "gauges_over_time",
    "histogram_heatmap_over_time",
    "histogram_quantiles_over_time",
    "histogram_steps_and_window",
    "histograms",
    "step_increase",
    "stepped_plan",
]


def auto_step(start: datetime, end: datetime, p: Plan | None = None, points: int = 120, minimum: float = 1.0) -> int:
    """Seconds per step: about ``points`` steps, rounded to a nice width, at least the tier's
    resolution (and a whole multiple of it)."""
    span = (end - start).total_seconds()
    raw = max(minimum, span / points)
    nice = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]
    step = next((n for n in nice if n >= raw), math.ceil(raw / 86400) * 86400)
    if p is not None and p.tier.rollup:
        res = int(p.tier.resolution.total_seconds())
        step = max(res, math.ceil(step / res) * res)
    return step


def stepped_plan(p: Plan, step: float | None) -> tuple[Plan, int]:
    """The step (rounded up to whole buckets of a rollup tier) and the plan's window widened to
    whole steps, so that every step is complete and every series shares the same grid."""
    value = int(step) if step else auto_step(p.start, p.end, p)
    if value < 1:
        raise BadInput("step must be at least 1 second")
    if p.tier.rollup:
        res = int(p.tier.resolution.total_seconds())
        value = max(res, math.ceil(value / res) * res)
    start, end = align(p.start, p.end, timedelta(seconds=value))
    return Plan(p.tier, start, end), value


def _params(
    metrics: str | list[str] | tuple[str, ...], p: Plan, step: int, filters: Filters | None
) -> tuple[str, dict[str, object]]:
    lookback = max(LOOKBACK, p.tier.resolution, timedelta(seconds=step))
    params: dict[str, object] = {
        "metrics": [metrics] if isinstance(metrics, str) else list(metrics),
        "start": param_time(p.start),
        "end": param_time(p.end),
        "lookback_start": param_time(p.start - lookback),
    }
    condition, extra = filters.series() if filters else ("", {})
    params.update(extra)
    return condition or "1", params


def step_increase(p: Plan, step: int) -> str:
    """SQL: ``[fingerprint, ts, increase]`` of every series of the ``{metrics}`` per step of the window.

    On a rollup tier, the sum of its buckets' stored increases (each from the sample before the
    bucket to its last one: migrations/clickhouse/0011_rollup_increases.sql). On the raw samples,
    each step's increase is its last value minus the previous step's last value (the step before
    the window, found up to the lookback, is the first one's base) plus the reset marks in the
    step; a series' first step without a base counts from its first value."""
    bucket = f"toStartOfInterval(ts, INTERVAL {step} SECOND)"
    if p.tier.rollup:
        return f"""
            SELECT fingerprint, toDateTime64({bucket}, 3, 'UTC') AS ts, sum(increase) AS increase
            FROM {p.samples}
            WHERE metric IN {{metrics:Array(String)}} AND ts >= {{start:DateTime64(3)}} AND ts < {{end:DateTime64(3)}}
            GROUP BY fingerprint, ts"""
    found = marked_increases(f"toDateTime64({bucket}, 3, 'UTC')", "t >= {start:DateTime64(3)}")
    return f"SELECT fingerprint, t AS ts, increase FROM ({found})"


def _finish(df: pd.DataFrame, p: Plan, step: int, filters: Filters | None) -> pd.DataFrame:
    if "ts" in df:
        df["ts"] = pd.to_datetime(df["ts"], utc=True)
    df.attrs.update(plan=p, step=step, unapplied=filters.unapplied("samples") if filters else [])
    return df


def counter_rate_over_time(
    client: Client,
    metric: str,
    start: datetime,
    end: datetime,
    by: str = "model",
    *,
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Per step: the reset-aware increase of counter ``metric`` per ``by``, and its rate per second."""
    return one_metric(counter_rates_over_time(client, [metric], start, end, by, step=step, **scope))


def counter_rates_over_time(
    client: Client,
    metrics: list[str] | tuple[str, ...],
    start: datetime,
    end: datetime,
    by: str = "model",
    *,
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """``counter_rate_over_time`` of several counters in one query: ``[metric, ts, by, increase, rate]``."""
    filters = scope.get("filters")
    p, s = stepped_plan(plan_scope(client, start, end, scope), step)
    where, params = _params(metrics, p, s, filters)
    sums = _step_sums(p, s, {"metric": "s.metric", by: LABELS[by]}, where)
    sql = f"SELECT metric, ts, {by}, total AS increase, increase / {s} AS rate FROM ({sums}) ORDER BY metric, ts, {by}"
    return _finish(query_df(client, sql, parameters=params, settings=SETTINGS), p, s, filters)


def _step_sums(p: Plan, s: int, labels: dict[str, str], series_where: str) -> str:
    """SQL: ``[ts, <labels>, total]``: the series' increases per step of ``s`` seconds summed per
    group of ``labels`` (on a rollup tier straight from its buckets' stored increases)."""
    if p.tier.rollup:  # a step of one bucket is the bucket's own start
        bucket = "v.ts" if s == p.tier.resolution.total_seconds() else f"toStartOfInterval(v.ts, INTERVAL {s} SECOND)"
        where = f"v.metric IN {{metrics:Array(String)}} AND {between(True, 'v.ts')}"
        return sums_by_labels(p.samples, "increase", labels, where=where, ts=bucket, series_where=series_where)
    return sums_by_labels(f"({step_increase(p, s)})", "increase", labels, ts="v.ts", series_where=series_where)


def gauge_over_time(
    client: Client,
    metric: str,
    start: datetime,
    end: datetime,
    by: str = "replica",
    *,
    agg: str = "avg",
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Per step: gauge ``metric``'s level per ``by`` (``agg`` of the series' means; max; min)."""
    return one_metric(gauges_over_time(client, [metric], start, end, by, agg=agg, step=step, **scope))


def gauges_over_time(
    client: Client,
    metrics: list[str] | tuple[str, ...],
    start: datetime,
    end: datetime,
    by: str = "replica",
    *,
    agg: str = "avg",
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """``gauge_over_time`` of several gauges in one query: ``[metric, ts, by, avg, max, min, replicas,
    series]`` (how many replicas, and series, reported the gauge in the step: with ``agg="avg"``,
    ``avg * series`` is what ``agg="sum"`` answers)."""
    filters = scope.get("filters")
    if agg not in ("avg", "sum"):
        raise BadInput("agg must be 'avg' or 'sum'")
    p, s = stepped_plan(plan_scope(client, start, end, scope), step)
    where, params = _params(metrics, p, s, filters)
    bucket = f"toDateTime64(toStartOfInterval(ts, INTERVAL {s} SECOND), 3, 'UTC')"
    if p.tier.rollup:
        inner = f"""
            SELECT fingerprint, {bucket} AS t, sum(value_sum) / sum(value_count) AS mean,
                   max(value_max) AS hi, min(value_min) AS lo
            FROM {p.samples} WHERE metric IN {{metrics:Array(String)}} AND {between(True)} AND value_count > 0
            GROUP BY fingerprint, t"""
    else:
        inner = f"""
            SELECT fingerprint, {bucket} AS t, avg(value) AS mean, max(value) AS hi, min(value) AS lo
            FROM samples WHERE metric IN {{metrics:Array(String)}} AND ts >= {{start:DateTime64(3)}} AND ts <
            {{end:DateTime64(3)}}
                  AND isFinite(value)
            GROUP BY fingerprint, t"""
    sql = f"""
        SELECT s.metric AS metric, v.t AS ts, {GROUPS[by]} AS {by}, {agg}(v.mean) AS avg, max(v.hi) AS max,
        min(v.lo) AS min,
               uniqExact(s.replica) AS replicas, count() AS series
        FROM ({inner}) AS v
        INNER JOIN ({series_latest("metrics", many=True)}) AS s ON s.fingerprint = v.fingerprint
        WHERE {where}
        GROUP BY metric, ts, {by} ORDER BY metric, ts, {by}"""
    return _finish(query_df(client, sql, parameters=params, settings=SETTINGS), p, s, filters)


def bucket_quantiles(q: float, bounds: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``analytics.metrics.bucket_quantile`` for many histograms at once: ``counts`` is
    (histograms x buckets) of cumulative counts at the sorted upper ``bounds`` (last ``+Inf``)."""
    counts = np.maximum.accumulate(np.asarray(counts, dtype=float), axis=1)
    n = counts.shape[0]
    out = np.full(n, math.nan)
    if not 0 <= q <= 1:
        out[:] = math.nan if math.isnan(q) else (math.inf if q > 1 else -math.inf)
        return out
    if len(bounds) < 2 or not math.isinf(bounds[-1]):
        return out
    total = counts[:, -1]
    rank = q * total
    i = np.array([np.searchsorted(row, r, side="left") for row, r in zip(counts, rank, strict=True)], dtype=int)
    i = np.minimum(i, len(bounds) - 1)
    upper = bounds[i]
    lower = np.where(i > 0, bounds[np.maximum(i - 1, 0)], 0.0)
    below = np.where(i > 0, counts[np.arange(n), np.maximum(i - 1, 0)], 0.0)
    in_bucket = counts[np.arange(n), i] - below
    with np.errstate(invalid="ignore", divide="ignore"):
        value = lower + (upper - lower) * (rank - below) / in_bucket
    value = np.where(in_bucket <= 0, math.nan, value)
    value = np.where((i == 0) & (upper <= 0), upper, value)  # Prometheus: a first bound <= 0 is the answer
    value = np.where(i == len(bounds) - 1, bounds[-2] if len(bounds) > 1 else math.nan, value)
    return np.where(total > 0, value, math.nan)


def _bucket_increases(
    client: Client, metrics: list[str], p: Plan, s: int, by: str, filters: Filters | None
) -> pd.DataFrame:
    """Per histogram family, step, ``by`` and bucket bound ``le``: the cumulative bucket count's
    increase (``[metric, ts, by, le, count]``, ``metric`` the family's name)."""
    where, params = _params([f"{m}_bucket" for m in metrics], p, s, filters)
    labels = {"metric": "substring(s.metric, 1, length(s.metric) - 7)", by: LABELS[by], "le": "s.le"}
    sums = _step_sums(p, s, labels, f"NOT isNaN(s.le) AND {where}")
    sql = f"SELECT metric, ts, {by}, le, total AS count FROM ({sums}) ORDER BY metric, ts, {by}, le"
    return query_df(client, sql, parameters=params, settings=SETTINGS)


class Histogram(NamedTuple):
    """One histogram family's answers from one read of its bucket increases."""

    steps: pd.DataFrame  # [ts, by, q, value, count]: the quantiles per step (and "(fleet)" rows with total)
    window: pd.DataFrame  # [by, q, value, count]: the quantiles over the window widened to whole steps
    heatmap: pd.DataFrame  # [ts, low, high, count]: the observations per step and bucket over every group


def histograms(
    client: Client,
    metrics: list[str] | tuple[str, ...],
    levels: list[float] | tuple[float, ...],
    start: datetime,
    end: datetime,
    by: str = "model",
    *,
    step: float | None = None,
    total: bool = False,
    **scope: Unpack[Scope],
) -> dict[str, Histogram]:
    """Histogram families -> their ``Histogram`` (per-step and window quantiles, heatmap), all
    from one query. With ``total`` the quantiles also have rows for all the groups together,
    ``by`` = ``(fleet)`` (what ``by="fleet"`` answers)."""
    filters = scope.get("filters")
    p, s = stepped_plan(plan_scope(client, start, end, scope), step)
    buckets = _bucket_increases(client, list(metrics), p, s, by, filters)
    columns = ["ts", by, "q", "value", "count"]
    out = {}
    for metric in metrics:
        part = buckets[buckets["metric"] == metric]
        if part.empty:
            out[metric] = Histogram(
                _finish(pd.DataFrame(columns=columns), p, s, filters),
                _finish(pd.DataFrame(columns=columns[1:]), p, s, filters),
                _finish(pd.DataFrame(columns=["ts", "low", "high", "count"]), p, s, filters),
            )
            continue
        wide = part.pivot_table(index=["ts", by], columns="le", values="count", aggfunc="sum", fill_value=0.0)
        fleet = wide.groupby(level="ts").sum()
        if total and by != "fleet":
            labelled = fleet.set_axis(
                pd.MultiIndex.from_arrays([fleet.index, ["(fleet)"] * len(fleet)], names=["ts", by])
            )
            wide = pd.concat([wide, labelled])
        window = wide.groupby(level=by, sort=False).sum()
        out[metric] = Histogram(
            _finish(_quantile_rows(wide, levels, columns), p, s, filters),
            _finish(_quantile_rows(window, levels, columns[1:]), p, s, filters),
            _finish(_heat_rows(fleet), p, s, filters),
        )
    return out


def _heat_rows(wide: pd.DataFrame) -> pd.DataFrame:
    """``[ts, low, high, count]`` from cumulative bucket counts per step (``wide``: ts x le)."""
    bounds = wide.columns.to_numpy(float)
    per_bucket = np.diff(wide.to_numpy(float), axis=1, prepend=0.0).clip(min=0.0)  # cumulative -> per bucket
    lows = np.concatenate([[0.0], bounds[:-1]])
    return pd.DataFrame(
        {
            "ts": np.repeat(wide.index.to_numpy(), len(bounds)),
            "low": np.tile(lows, len(wide)),
            "high": np.tile(bounds, len(wide)),
            "count": per_bucket.ravel(),
        }
    )


def histogram_heatmap_over_time(
    client: Client, metric: str, start: datetime, end: datetime, *, step: float | None = None, **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Per step and bucket of histogram family ``metric`` over the fleet (the filters applied):
    ``[ts, low, high, count]`` with ``count`` the observations that fell in ``(low, high]`` in
    that step (the last bucket's ``high`` is +Inf)."""
    return histograms(client, [metric], (), start, end, "fleet", step=step, **scope)[metric].heatmap


def histogram_quantiles_over_time(
    client: Client,
    metric: str,
    levels: list[float] | tuple[float, ...],
    start: datetime,
    end: datetime,
    by: str = "model",
    *,
    step: float | None = None,
    total: bool = False,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Per step and ``by``: the ``levels`` quantiles of histogram family ``metric``. With ``total``
    also those of all the groups together, as rows whose ``by`` is ``(fleet)`` (what ``by="fleet"``
    answers, from the same query)."""
    return histogram_steps_and_window(client, metric, levels, start, end, by, step=step, total=total, **scope)[0]


def histogram_steps_and_window(
    client: Client,
    metric: str,
    levels: list[float] | tuple[float, ...],
    start: datetime,
    end: datetime,
    by: str = "model",
    *,
    step: float | None = None,
    total: bool = False,
    **scope: Unpack[Scope],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``histogram_quantiles_over_time`` and, from the same bucket increases summed over the
    steps, the quantiles over the whole window: ``[by, q, value, count]`` (the window widened to
    whole steps, ``.attrs["plan"]``: what ``analytics.metrics.histogram_quantile`` answers for
    that window, but for a series whose previous sample lies between its 15-minute lookback
    and one step before the window, or an unmarked restart: the steps count those per step). A
    page that draws the line and shows the number reads the buckets once."""
    found = histograms(client, [metric], levels, start, end, by, step=step, total=total, **scope)[metric]
    return found.steps, found.window


def _quantile_rows(wide: pd.DataFrame, levels: list[float] | tuple[float, ...], columns: list[str]) -> pd.DataFrame:
    """Long rows (the index's columns, ``q``, ``value``, ``count``) of the cumulative bucket counts
    in ``wide`` (one column per upper bound)."""
    bounds = wide.columns.to_numpy(float)
    matrix = wide.to_numpy(float)
    frames = []
    for q in levels:
        frame = wide.index.to_frame(index=False)
        frame["q"] = float(q)
        frame["value"] = bucket_quantiles(float(q), bounds, matrix)
        frame["count"] = matrix[:, -1]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)
