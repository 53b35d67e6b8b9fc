"""SLOs: attainment, error budget, multi-window burn rates and goodput.

In:  a client, SLO targets (``storage.catalog.SloTarget``: model, metric, threshold, objective,
     window; kept in the metadata DB), a window or an evaluation time, and ``Filters``.
Out: DataFrames, one row per target (or per target and burn-rate window):
     - ``slo_attainment``: ``[model, metric, threshold_seconds, objective, requests, good,
       attainment, met, observed]``: from the engines' histograms (every request, not a sample):
       ``good`` = observations <= threshold, interpolated inside the bucket; ``observed`` = the
       histogram quantile at the target's percentile (default: its objective). A percentile
       target (``percentile`` set: "p95 <= 2 s") is ``met`` when ``observed`` <= threshold, a
       threshold target when ``attainment`` >= objective. (``itl`` histograms count token
       gaps, so its attainment is a share of gaps.) Filters: model and replica.
     - ``error_budget``: over each target's own window (``window_days``, ending at ``end``):
       ``budget`` (1 - objective), ``consumed`` (bad share / budget) and ``remaining``
       (1 - consumed; negative once overspent);
     - ``burn_rates``: per target and ``BURN_WINDOWS`` row (SRE workbook, DESIGN.md section 4):
       ``burn_long``, ``burn_short`` (bad share / budget over each window), ``factor`` and
       ``firing`` (both above the factor);
     - ``goodput``: per model, from the request log's rows (raw tier): ``requests``, ``good``
       (weighted requests that succeeded and met every target of their model), ``attainment``,
       ``goodput_per_s``, ``gpus`` (average GPUs up), ``goodput_per_gpu_s``, and ``good_tokens``
       (their prompt + output tokens);
     - ``cost_per_slo_tokens``: per model and ``(fleet)``: GPU spend / SLO-compliant tokens x 10^6
       beside spend / all tokens (both token counts from the same request log); a model's spend is
       its requests' part of their pool's (``analytics.allocation``'s rule, the minutes nobody used
       counted to the pool's model); with a tenant or route filter, their part alone.
     - ``window_coverage``: the share of a window the store holds data for (1 when its samples
       begin at or before the window's start): a burn rate over a window the data covers only
       in part is a rate over less time than it claims (a young fleet's "3 days" are minutes).
A window without observations gives NaN attainment (no data is not "met").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from typing_extensions import Unpack

from analytics.allocation import TokenWeights, allocate, picked
from analytics.cost import FLEET, gpu_hours
from analytics.errors import BadInput
from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.metrics import bucket_quantile, bucket_share_below, histogram_buckets
from analytics.tiers import Retention, param_time
from analytics.vllm import LATENCIES
from analytics.window import Scope
from storage.catalog import SloTarget
from storage.clickhouse import Client

# (histogram family, start, end) -> histogram_buckets(..., by="model") of that window
Buckets = Callable[[str, datetime, datetime], pd.DataFrame]

__all__ = [
    "BURN_WINDOWS",
    "Buckets",
    "burn_rates",
    "cost_per_slo_tokens",
    "error_budget",
    "goodput",
    "slo_attainment",
    "window_coverage",
]

# (severity, long window, short window, burn factor): page at 14.4x over 1h and 5m, page at 6x
# over 6h and 30m, ticket at 1x over 3d and 6h (a 30-day SLO)
# (severity, long window, short window, burn-rate threshold)
BurnWindow = tuple[str, timedelta, timedelta, float]
BURN_WINDOWS: tuple[BurnWindow, ...] = (
    ("page", timedelta(hours=1), timedelta(minutes=5), 14.4),
    ("page", timedelta(hours=6), timedelta(minutes=30), 6.0),
    ("ticket", timedelta(days=3), timedelta(hours=6), 1.0),
)


def _good(
    client: Client, targets: list[SloTarget], start: datetime, end: datetime, kw: Scope, fetch: Buckets | None = None
) -> pd.DataFrame:
    """Per target: requests, good, observed (one histogram query per metric)."""
    rows: list[dict[str, Any]] = []
    for metric in sorted({t.metric for t in targets}):
        family = LATENCIES[metric].family
        buckets = (
            fetch(family, start, end)
            if fetch is not None
            else histogram_buckets(client, family, start, end, "model", **kw)
        )
        by_model = {m: (f["le"].to_numpy(float), f["count"].to_numpy(float)) for m, f in buckets.groupby("model")}
        for t in (t for t in targets if t.metric == metric):
            bounds, counts = by_model.get(t.model, (np.array([]), np.array([])))
            good, total = bucket_share_below(t.threshold_seconds, bounds, counts) if len(bounds) else (0.0, 0.0)
            observed = bucket_quantile(t.percentile or t.objective, bounds, counts) if len(bounds) else math.nan
            rows.append({"model": t.model, "metric": t.metric, "requests": total, "good": good, "observed": observed})
    return pd.DataFrame(rows, columns=["model", "metric", "requests", "good", "observed"])


def slo_attainment(
    client: Client,
    targets: Iterable[SloTarget],
    start: datetime,
    end: datetime,
    *,
    buckets: Buckets | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Share of requests meeting each target over ``[start, end)``. ``buckets(family, start, end)``,
    when given, supplies ``histogram_buckets(..., by="model")`` (a caller sharing answers between
    several questions, like the alert evaluator); the filters then are the caller's."""
    targets = list(targets)
    good = _good(client, targets, start, end, scope, buckets)
    spec = pd.DataFrame(
        [
            {
                "model": t.model,
                "metric": t.metric,
                "threshold_seconds": t.threshold_seconds,
                "objective": t.objective,
                "label": t.label,
            }
            for t in targets
        ],
        columns=["model", "metric", "threshold_seconds", "objective", "label"],
    )
    out = spec.merge(good, on=["model", "metric"], how="left")
    out["attainment"] = (out["good"] / out["requests"]).where(out["requests"] > 0)
    # a percentile target ("p95 <= 2 s") is met by the observed percentile, a threshold target
    # ("99 % of requests within 2 s") by the share; without data neither is met
    percentile = pd.Series([t.percentile is not None for t in targets], index=out.index, dtype=bool)
    out["met"] = (percentile & (out["observed"] <= out["threshold_seconds"])) | (
        ~percentile & (out["attainment"] >= out["objective"])
    )
    filters = scope.get("filters")
    out.attrs["unapplied"] = filters.unapplied("samples") if filters else []
    return out


def error_budget(
    client: Client,
    targets: Iterable[SloTarget],
    end: datetime,
    *,
    filters: Filters | None = None,
    retention: Retention | None = None,
    now: datetime | None = None,
) -> pd.DataFrame:
    """Each target's error budget over its own window ending at ``end``."""
    targets = list(targets)
    frames = []
    for days in sorted({t.window_days for t in targets}):
        group = [t for t in targets if t.window_days == days]
        frames.append(
            slo_attainment(
                client, group, end - timedelta(days=days), end, filters=filters, retention=retention, now=now
            ).assign(window_days=days)
        )
    if not frames:
        return pd.DataFrame(
            columns=["model", "metric", "label", "window_days", "attainment", "budget", "consumed", "remaining"]
        )
    out = pd.concat(frames, ignore_index=True)
    out["budget"] = 1 - out["objective"]
    out["consumed"] = (1 - out["attainment"]) / out["budget"]
    out["remaining"] = 1 - out["consumed"]
    return out[["model", "metric", "label", "window_days", "requests", "attainment", "budget", "consumed", "remaining"]]


def burn_rates(
    client: Client,
    targets: Iterable[SloTarget],
    end: datetime,
    *,
    windows: tuple[BurnWindow, ...] = BURN_WINDOWS,
    filters: Filters | None = None,
    retention: Retention | None = None,
    now: datetime | None = None,
    buckets: Buckets | None = None,
) -> pd.DataFrame:
    """Multi-window burn rates at ``end`` for each target (see ``BURN_WINDOWS``)."""
    targets = list(targets)
    cache: dict[timedelta, pd.DataFrame] = {}

    def bad_share(span: timedelta) -> pd.DataFrame:
        if span not in cache:
            cache[span] = slo_attainment(
                client, targets, end - span, end, filters=filters, retention=retention, now=now, buckets=buckets
            )
        return cache[span]

    rows: list[dict[str, Any]] = []
    for severity, long, short, factor in windows:
        a_long, a_short = bad_share(long), bad_share(short)
        for i, t in enumerate(targets):
            budget = 1 - t.objective
            burn_long = (1 - float(a_long["attainment"].iloc[i])) / budget
            burn_short = (1 - float(a_short["attainment"].iloc[i])) / budget
            rows.append(
                {
                    "model": t.model,
                    "metric": t.metric,
                    "label": t.label,
                    "severity": severity,
                    "long_window": long,
                    "short_window": short,
                    "burn_long": burn_long,
                    "burn_short": burn_short,
                    "factor": factor,
                    "firing": bool(burn_long > factor and burn_short > factor),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "model",
            "metric",
            "label",
            "severity",
            "long_window",
            "short_window",
            "burn_long",
            "burn_short",
            "factor",
            "firing",
        ],
    )


def _good_condition(targets: list[SloTarget]) -> tuple[str, dict[str, object]]:
    """SQL: 1 when a row succeeded and meets every target of its model (models without targets: 1)."""
    params: dict[str, object] = {}
    branches = []
    for j, model in enumerate(sorted({t.model for t in targets})):
        checks = []
        for k, t in enumerate(t for t in targets if t.model == model):
            column = LATENCIES[t.metric].column
            params[f"g_{j}_{k}"] = t.threshold_seconds
            checks.append(f"{column} <= {{g_{j}_{k}:Float64}}")
        params[f"g_{j}"] = model
        branches.append(f"model = {{g_{j}:String}}, {' AND '.join(checks)}")
    meets = f"multiIf({', '.join(branches)}, 1)" if branches else "1"
    return f"(outcome = 'ok' AND status_code < 400 AND {meets})", params


def goodput(
    client: Client,
    targets: Iterable[SloTarget],
    start: datetime,
    end: datetime,
    *,
    by: str = "model",
    source: str | None = "gateway",
    filters: Filters | None = None,
) -> pd.DataFrame:
    """Requests per second meeting every SLO of their model (DistServe's goodput), per ``by``."""
    if by not in ("model", "tenant", "route"):
        raise BadInput("by must be model, tenant or route")
    targets = list(targets)
    good, params = _good_condition(targets)
    params.update(start=param_time(start), end=param_time(end))
    where = "ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}"
    condition, extra = request_rows(source, filters)
    where += f" AND {condition}"
    params.update(extra)
    sql = f"""
        SELECT {by}, sum(weight) AS requests, sumIf(weight, {good}) AS good,
               sumIf(weight * (prompt_tokens + completion_tokens), {good}) AS good_tokens,
               sum(weight * (prompt_tokens + completion_tokens)) AS tokens
        FROM requests WHERE {where} GROUP BY {by} ORDER BY {by}"""
    out = query_df(client, sql, parameters=params)
    seconds = (end - start).total_seconds()
    out["attainment"] = (out["good"] / out["requests"]).where(out["requests"] > 0)
    out["goodput_per_s"] = out["good"] / seconds
    if by == "model":
        hours = gpu_hours(client, start, end, filters=filters)
        gpus = (hours.groupby("model")["gpu_hours"].sum() * 3600 / seconds) if len(hours) else pd.Series(dtype=float)
        out["gpus"] = out["model"].map(gpus)
        out["goodput_per_gpu_s"] = (out["goodput_per_s"] / out["gpus"]).where(out["gpus"] > 0)
    return out


def cost_per_slo_tokens(
    client: Client,
    targets: Iterable[SloTarget],
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    source: str | None = "gateway",
    filters: Filters | None = None,
    weights: TokenWeights | None = None,
) -> pd.DataFrame:
    """Per model and ``(fleet)``: spend / tokens of the requests that met every SLO x 10^6, beside
    the plain cost per 1M tokens of the same request log: what missed SLOs cost on top. A model's
    spend is its requests' part of their pool's (``analytics.allocation``, as the showback shares
    it), the pool's minutes nobody used counted to the pool's own model; with a tenant or route
    filter, their part alone."""
    good = goodput(client, targets, start, end, source=source, filters=filters)
    shares = allocate(client, start, end, prices, weights=weights, filters=filters)
    payers = picked(shares.payers, filters, shares.pool_of)
    spend = payers.groupby("model")[["direct", "idle"]].sum().sum(axis=1)
    if not (filters and (filters.tenant or filters.route)):
        unused = shares.unattributed.groupby("pool")[["direct", "idle"]].sum().sum(axis=1)
        spend = spend.add(unused, fill_value=0.0)
    df = good[["model", "requests", "good", "tokens", "good_tokens"]].copy()
    df["spend"] = df["model"].map(spend).fillna(0.0)
    fleet = df.drop(columns=["model"]).sum().to_frame().T
    fleet.insert(0, "model", FLEET)
    df = pd.concat([df, fleet], ignore_index=True) if len(df) else df
    df["cost_per_million_tokens"] = (df["spend"] / df["tokens"] * 1e6).where(df["tokens"] > 0)
    df["cost_per_million_slo_tokens"] = (df["spend"] / df["good_tokens"] * 1e6).where(df["good_tokens"] > 0)
    return df


def window_coverage(client: Client, start: datetime, end: datetime) -> float:
    """Share of ``[start, end)`` after the store's first sample, 0 to 1: 1 when the data begins at
    or before ``start``, 0 when the store holds none before ``end``. The first sample is the
    earliest any tier holds, a rollup's counted from its first bucket's end (the sample lies
    somewhere in that bucket: never earlier than it was). Answered from ``tiers.coverage``
    (cached for a minute): cheap enough for every evaluation. It counts from the first sample
    on, so a store that holds an earlier run's data counts it."""
    from analytics.tiers import TIERS, coverage

    span = (end - start).total_seconds()
    found = [t + TIERS[name].resolution for name, t in coverage(client, "samples").items() if t is not None]
    if span <= 0 or not found:
        return 0.0
    first = max(min(found), start)
    return float(min(1.0, max(0.0, (end - first).total_seconds() / span)))
