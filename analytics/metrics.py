"""Metric queries on the tier that fits the window: counter increases, gauge summaries and
histogram quantiles, grouped by a series label.

In:  a client, a metric (for histograms the family name, e.g. ``vllm:time_to_first_token_seconds``),
     a window ``[start, end)``, ``by`` (replica, model, instance, fingerprint), and optionally a
     forced tier / the retention / the current time (``analytics.tiers.plan``).
Out: DataFrames, one row per group, plus ``.attrs["plan"]`` (the tier and aligned window used):
     - ``counter_increase``: ``[by, increase]``: the sum of the stored reset-aware deltas
       (raw ``samples.delta`` or the rollups' ``increase``: the same numbers, summed earlier);
     - ``gauge_summary``: ``[by, min, max, avg, last]``: ``avg`` weights every sample equally,
       ``last`` is the mean over the group's series of each series' last value;
     - ``histogram_quantile``: ``[by, quantile, count]``: Prometheus' ``histogram_quantile`` over
       the bucket increases summed per ``le`` (linear interpolation inside the bucket; the
       highest finite bound when the rank falls in ``+Inf``; NaN without observations).
"""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pandas as pd

from analytics.counters import GROUPS, series_latest
from analytics.tiers import Plan, Retention, plan

__all__ = ["bucket_quantile", "counter_increase", "gauge_summary", "histogram_quantile"]


def _plan(start: datetime, end: datetime, tier: str | None, retention: Retention | None, now: datetime | None) -> Plan:
    return plan(start, end, now=now, retention=retention, kind="samples", tier=tier)


def _check_by(by: str) -> None:
    if by not in GROUPS:
        raise ValueError(f"by must be one of {', '.join(GROUPS)}")


def _params(metric: str, p: Plan) -> dict[str, object]:
    return {"metric": metric, "start": p.start, "end": p.end}


def _where() -> str:
    return "v.metric = {metric:String} AND v.ts >= {start:DateTime64(3)} AND v.ts < {end:DateTime64(3)}"


def counter_increase(
    client,
    metric: str,
    start: datetime,
    end: datetime,
    by: str = "replica",
    *,
    tier: str | None = None,
    retention: Retention | None = None,
    now: datetime | None = None,
) -> pd.DataFrame:
    """Reset-aware increase of counter ``metric`` per ``by`` over ``[start, end)``."""
    _check_by(by)
    p = _plan(start, end, tier, retention, now)
    column = "v.increase" if p.tier.rollup else "v.delta"
    sql = f"""
        SELECT {GROUPS[by]} AS {by}, sum({column}) AS increase
        FROM {p.samples} AS v
        INNER JOIN ({series_latest("metric")}) AS s ON s.fingerprint = v.fingerprint
        WHERE {_where()}
        GROUP BY {by} ORDER BY {by}
    """
    df = client.query_df(sql, parameters=_params(metric, p))
    df.attrs["plan"] = p
    return df


def gauge_summary(
    client,
    metric: str,
    start: datetime,
    end: datetime,
    by: str = "replica",
    *,
    tier: str | None = None,
    retention: Retention | None = None,
    now: datetime | None = None,
) -> pd.DataFrame:
    """min / max / avg / last of gauge ``metric`` per ``by`` over ``[start, end)``."""
    _check_by(by)
    p = _plan(start, end, tier, retention, now)
    if p.tier.rollup:
        per_series = f"""
            SELECT v.fingerprint AS fingerprint, min(v.value_min) AS lo, max(v.value_max) AS hi,
                   sum(v.value_sum) AS total, sum(v.value_count) AS n, max(v.value_last).2 AS last
            FROM {p.samples} AS v WHERE {_where()} GROUP BY v.fingerprint"""
    else:
        per_series = f"""
            SELECT v.fingerprint AS fingerprint, minIf(v.value, isFinite(v.value)) AS lo,
                   maxIf(v.value, isFinite(v.value)) AS hi, sumIf(v.value, isFinite(v.value)) AS total,
                   countIf(isFinite(v.value)) AS n, argMax(v.value, v.ts) AS last
            FROM samples AS v WHERE {_where()} GROUP BY v.fingerprint"""
    group = "v.fingerprint" if by == "fingerprint" else f"s.{by}"
    sql = f"""
        SELECT {group} AS {by}, min(v.lo) AS min, max(v.hi) AS max,
               if(sum(v.n) > 0, sum(v.total) / sum(v.n), nan) AS avg, avg(v.last) AS last
        FROM ({per_series}) AS v
        INNER JOIN ({series_latest("metric")}) AS s ON s.fingerprint = v.fingerprint
        WHERE v.n > 0
        GROUP BY {by} ORDER BY {by}
    """
    df = client.query_df(sql, parameters=_params(metric, p))
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
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


def histogram_quantile(
    client,
    metric: str,
    q: float,
    start: datetime,
    end: datetime,
    by: str = "model",
    *,
    tier: str | None = None,
    retention: Retention | None = None,
    now: datetime | None = None,
) -> pd.DataFrame:
    """The ``q`` quantile of histogram family ``metric`` per ``by`` over ``[start, end)``."""
    _check_by(by)
    p = _plan(start, end, tier, retention, now)
    column = "v.increase" if p.tier.rollup else "v.delta"
    sql = f"""
        SELECT {GROUPS[by]} AS {by}, s.le AS le, sum({column}) AS count
        FROM {p.samples} AS v
        INNER JOIN ({series_latest("metric")}) AS s ON s.fingerprint = v.fingerprint
        WHERE {_where()} AND NOT isNaN(s.le)
        GROUP BY {by}, le ORDER BY {by}, le
    """
    buckets = client.query_df(sql, parameters=_params(f"{metric}_bucket", p))
    rows = []
    for group, frame in buckets.groupby(by, sort=True):
        bounds, counts = frame["le"].to_numpy(float), frame["count"].to_numpy(float)
        rows.append({by: group, "quantile": bucket_quantile(q, bounds, counts), "count": float(counts[-1])})
    df = pd.DataFrame(rows, columns=[by, "quantile", "count"])
    df.attrs["plan"] = p
    return df
