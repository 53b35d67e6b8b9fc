"""Cost over time: spend, tokens and cost per 1M tokens per step, for the fleet and by model pool,
replica, tenant or route.

In:  a client, a window ``[start, end)``, GPU prices (``{gpu_type: USD per GPU-hour}``), ``by``
     (``fleet``, ``model``, ``replica``, ``tenant`` or ``route``), optionally a step (seconds;
     default about ``POINTS`` steps, at least ``MIN_STEP_S``), ``TokenWeights`` and the scope.
Out: ``spend_over_time``: per step and replica ``[ts, replica, model, gpu_type, gpu_count,
     up_seconds, busy_seconds, spend, idle_spend, busy_spend]`` (a replica costs while its engine
     reports ``vllm:num_requests_running``, idle included: ``analytics.cost``'s rule, per step;
     up from sample to sample, the span its token counters' increases cover, so that a replica's
     first or last step is neither a spike nor a dip in cost per token);
     ``cost_over_time``: per step and ``by`` ``[ts, <by>, spend, idle_spend, busy_spend,
     prompt_tokens, cached_tokens, completion_tokens, tokens, cost_per_million_tokens]``
     (``tokens`` = prompt + output; ``cost_per_million_tokens`` NaN, not infinite, in a step
     without tokens: the cost of a token nobody asked for is undefined, the spend is still shown).
     ``.attrs``: ``step``, ``plan``, ``source`` (where the tokens were counted) and, for tenants
     and routes, ``unattributed`` (per step, the spend of pools no request-log row accounts for);
     ``cost_breaks``: per line of such a series, its lasting rise, found as ``explain`` finds one
     (``[<by>, break_at, end, before, after]``, USD per 1M tokens), what a page marks.

Tokens: for the fleet, pools and replicas, the engines' own counters (reset-aware increases per
step: a restart reads as a restart, never as negative tokens); for tenants and routes, the
request log (weighted rows; the gateway's when it has rows), and each pool's spend in a step is
shared among the tenants (routes) that used it by weighted tokens, as showback does
(``analytics.cost.cost_by_tenant``). A replica that comes or goes costs only for the steps it is
up in, so the steps it misses are neither free nor spiky.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from typing_extensions import Unpack

from analytics.adapters import adapter_pools, engine_filters, request_filters
from analytics.changepoints import regression
from analytics.cost import FLEET, TokenWeights
from analytics.counters import series_latest
from analytics.filters import Filters
from analytics.frames import query_df
from analytics.requests import log_source, request_totals
from analytics.tiers import HOUR, SIX_HOURS, Plan, align, between, coverage, param_time, plan
from analytics.timeseries import auto_step, counter_rates_over_time
from analytics.vllm import CACHED_PROMPT_TOKENS, GENERATION_TOKENS, PROMPT_TOKENS, REQUESTS_RUNNING
from analytics.window import Scope, scope_parts
from storage.clickhouse import Client

__all__ = ["BY", "MIN_STEP_S", "POINTS", "cost_breaks", "cost_over_time", "spend_over_time"]

BY = ("fleet", "model", "replica", "tenant", "route")
POINTS = 90  # steps over a window: a cost per token needs a few requests per step
MIN_STEP_S = 30
COLUMNS = ["spend", "idle_spend", "busy_spend", "prompt_tokens", "cached_tokens", "completion_tokens"]


def cost_step(start: datetime, end: datetime, step: float | None, client: Client, **scope: Unpack[Scope]) -> int:
    """The step the series uses: ``step`` or about ``POINTS`` over the window, a whole number of the
    uptime buckets of the tier read (minutes on the raw and 1-minute tiers, hours beyond)."""
    return _step_and_plan(start, end, step, client, scope)[0]


def _step_and_plan(
    start: datetime, end: datetime, step: float | None, client: Client, scope: Scope
) -> tuple[int, Plan]:
    """``cost_step`` and the samples' read plan it was chosen on (one coverage query for both)."""
    tier, retention, now, _filters = scope_parts(scope)
    p = plan(
        start,
        end,
        now=now,
        retention=retention,
        kind="samples",
        tier=tier,
        data=coverage(client, "samples") if tier is None else None,
    )
    value = int(step) if step else max(MIN_STEP_S, auto_step(start, end, points=POINTS))
    if value < 1:
        raise ValueError(f"step must be at least 1 second, got {step}")
    width = 3600 if p.tier in (HOUR, SIX_HOURS) else 60
    if value >= width or p.tier.rollup:
        value = max(width, math.ceil(value / width) * width)
    return value, p


def spend_over_time(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Per step and replica: seconds up and busy, and the spend (see the module docstring)."""
    _tier, retention, now, filters = scope_parts(scope)
    s, p = _step_and_plan(start, end, step, client, scope)
    if p.tier is SIX_HOURS:  # a gap inside a bucket counts as up: hours are close enough, 6 hours are not
        p = plan(start, end, now=now, retention=retention, kind="samples", tier=HOUR.name)
    width = 3600 if p.tier is HOUR else (60 if p.tier.rollup or s >= 60 else s)
    a, b = align(p.start, p.end, timedelta(seconds=s))
    if p.tier.rollup:
        per_bucket = "max(value_max) AS peak, min(value_first).1 AS first_t, max(value_last).1 AS last_t"
    else:
        per_bucket = "max(value) AS peak, min(ts) AS first_t, max(ts) AS last_t"
    condition, params = filters.series() if filters else ("", {})
    # a bucket is up from the previous bucket's last sample (its first sample when the replica was
    # not up in the bucket before) to its own last one: the span the token counters' increases cover
    sql = f"""
        SELECT toDateTime64(toStartOfInterval(u.b, INTERVAL {s} SECOND), 3, 'UTC') AS ts, s.replica AS replica,
               any(s.model) AS model, any(s.labels['gpu_type']) AS gpu_type,
               toUInt32OrZero(any(s.labels['gpu_count'])) AS gpu_count,
               sum(u.up) AS up_seconds, sumIf(u.up, u.peak > 0) AS busy_seconds
        FROM (
            SELECT fingerprint, b, peak,
                   greatest(0, dateDiff('millisecond', if(prev_b = b - INTERVAL {width} SECOND, prev_t, first_t),
                                        last_t) / 1000) AS up
            FROM (
                SELECT fingerprint, b, peak, first_t, last_t,
                       lagInFrame(b, 1, toDateTime64(0, 3, 'UTC')) OVER w AS prev_b,
                       lagInFrame(last_t, 1, toDateTime64(0, 3, 'UTC')) OVER w AS prev_t
                FROM (SELECT fingerprint, toDateTime64(toStartOfInterval(ts, INTERVAL {width} SECOND), 3, 'UTC') AS b,
                             {per_bucket}
                      FROM {p.samples}
                      WHERE metric = {{metric:String}}
                            AND {between(p.tier.rollup, start="lookback")}
                      GROUP BY fingerprint, b)
                WINDOW w AS (PARTITION BY fingerprint ORDER BY b ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)
            )
            WHERE b >= {{start:DateTime64(3)}}
        ) AS u
        INNER JOIN ({series_latest("metric")}) AS s ON s.fingerprint = u.fingerprint
        WHERE {condition or 1}
        GROUP BY ts, replica ORDER BY ts, replica
    """
    params.update(
        metric=REQUESTS_RUNNING,
        start=param_time(a),
        end=param_time(b),
        lookback=param_time(a - timedelta(seconds=width)),
    )
    df = query_df(client, sql, parameters=params)
    df["ts"] = pd.to_datetime(df["ts"], utc=True).astype("datetime64[ns, UTC]")
    unlabelled = sorted(set(df.loc[df["gpu_type"] == "", "replica"]))
    if unlabelled:
        raise KeyError(
            f"no gpu_type label on {', '.join(repr(r) for r in unlabelled[:5])}: give the scrape target "
            "gpu_type and gpu_count labels (the fleet spec does) to price it"
        )
    missing = sorted(set(df["gpu_type"]) - set(prices))
    if missing:
        raise KeyError(
            f"no GPU price for {', '.join(repr(m) for m in missing)}: add one (USD per GPU-hour, fleetscope prices set)"
        )
    df["up_seconds"] = df["up_seconds"].clip(upper=s).astype(float)
    df["busy_seconds"] = df["busy_seconds"].clip(upper=df["up_seconds"]).astype(float)
    df["gpu_count"] = df["gpu_count"].clip(lower=1)
    per_second = df["gpu_count"] * df["gpu_type"].map(prices).astype(float) / 3600.0
    df["spend"] = df["up_seconds"] * per_second
    df["idle_spend"] = (df["up_seconds"] - df["busy_seconds"]) * per_second
    df["busy_spend"] = df["spend"] - df["idle_spend"]
    df.attrs.update(step=s, plan=p)
    return df


def _engine_tokens(client: Client, start: datetime, end: datetime, by: str, step: int, scope: Scope) -> pd.DataFrame:
    names = {
        PROMPT_TOKENS: "prompt_tokens",
        CACHED_PROMPT_TOKENS: "cached_tokens",
        GENERATION_TOKENS: "completion_tokens",
    }
    rates = counter_rates_over_time(client, list(names), start, end, by, step=step, **scope)
    if rates.empty:  # typed, so that it merges with the spend's steps
        return pd.DataFrame(
            {
                "ts": pd.Series(dtype="datetime64[ns, UTC]"),
                by: pd.Series(dtype=object),
                **{name: pd.Series(dtype=float) for name in names.values()},
            }
        )
    wide = rates.pivot_table(index=["ts", by], columns="metric", values="increase", aggfunc="sum")
    wide = wide.reindex(columns=list(names)).rename(columns=names).fillna(0.0).clip(lower=0.0)
    wide.columns.name = None
    out = wide.reset_index()
    out["ts"] = pd.to_datetime(out["ts"], utc=True).astype("datetime64[ns, UTC]")
    return out


def _finish(df: pd.DataFrame, by: str) -> pd.DataFrame:
    for column in COLUMNS:
        df[column] = df[column].astype(float) if column in df else 0.0
    df["tokens"] = df["prompt_tokens"] + df["completion_tokens"]
    df["cost_per_million_tokens"] = (df["spend"] / df["tokens"] * 1e6).where(df["tokens"] > 0)
    return df[["ts", by, *COLUMNS, "tokens", "cost_per_million_tokens"]].sort_values(["ts", by], ignore_index=True)


def cost_over_time(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    by: str = "fleet",
    step: float | None = None,
    weights: TokenWeights | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Spend, tokens and cost per 1M tokens per step and ``by`` (see the module docstring)."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, not {by!r}")
    tier, retention, now, filters = scope_parts(scope)
    weights = weights or TokenWeights()
    pools = adapter_pools(client)  # a LoRA adapter's requests share its base model's pool
    spend_filters = engine_filters(filters, pools)
    spend = spend_over_time(
        client, start, end, prices, step=step, tier=tier, retention=retention, now=now, filters=spend_filters
    )
    s = int(spend.attrs["step"])
    a, b = align(start, end, timedelta(seconds=s))
    if by in ("fleet", "model", "replica"):
        group = "model" if by == "fleet" else by
        money = spend.groupby(["ts", group], as_index=False)[["spend", "idle_spend", "busy_spend"]].sum()
        tokens = _engine_tokens(client, a, b, group, s, scope)
        df = money.merge(tokens, on=["ts", group], how="outer").fillna({c: 0.0 for c in COLUMNS})
        if by == "fleet":
            df = df.groupby("ts", as_index=False)[COLUMNS].sum().assign(fleet=FLEET)
        out = _finish(df, by)
        out.attrs.update(step=s, plan=spend.attrs["plan"], source="engine counters")
        return out
    # tenants and routes: each pool's spend per step shared by the request log's weighted tokens
    source = log_source(client, a, b, filters)
    pool_filters = (
        request_filters(Filters(model=spend_filters.model, replica=spend_filters.replica), pools)
        if spend_filters
        else None
    )
    rows = request_totals(
        client,
        a,
        b,
        by=["model", by],
        source=source,
        step=s,
        tier=tier,
        retention=retention,
        now=now,
        filters=pool_filters,
    )
    rows["ts"] = pd.to_datetime(rows["ts"], utc=True) if len(rows) else rows.get("ts")
    rows["pool"] = [pools.get(m, m) for m in rows["model"]]  # an adapter's requests: its base model's pool
    computed = rows["prompt_tokens"] - rows["cached_tokens"]
    rows["weighted"] = (
        computed * weights.input + rows["cached_tokens"] * weights.cached + rows["completion_tokens"] * weights.output
    )
    money = spend.groupby(["ts", "model"])[["spend", "idle_spend", "busy_spend"]].sum()
    pool_weight = rows.groupby(["ts", "pool"])["weighted"].transform("sum")
    share = (rows["weighted"] / pool_weight).where(pool_weight > 0, 0.0)
    keys = pd.MultiIndex.from_frame(rows[["ts", "pool"]]) if len(rows) else pd.MultiIndex.from_arrays([[], []])
    for column in ("spend", "idle_spend", "busy_spend"):
        pool_value = money[column].reindex(keys).to_numpy(float) if len(rows) else np.array([])
        rows[column] = share.to_numpy(float) * np.nan_to_num(pool_value)
    used = set(zip(rows.loc[rows["weighted"] > 0, "ts"], rows.loc[rows["weighted"] > 0, "pool"], strict=True))
    unused = money[[key not in used for key in money.index]]
    if filters and filters.model:  # the models asked for (a base model with its adapters), after the sharing
        rows = rows[rows["model"].isin(request_filters(filters, pools).model)]  # type: ignore[union-attr]
    if filters and (filters.tenant if by == "tenant" else filters.route):
        rows = rows[rows[by].isin(filters.tenant if by == "tenant" else filters.route)]
    df = rows.groupby(["ts", by], as_index=False)[COLUMNS].sum()
    out = _finish(df, by)
    out.attrs.update(
        step=s,
        plan=spend.attrs["plan"],
        source=f"request log ({source})" if source else "request log",
        unattributed=unused.groupby(level="ts")["spend"].sum(),
    )
    return out


def cost_breaks(series: pd.DataFrame, by: str = "fleet", min_steps: int = 8) -> pd.DataFrame:
    """Each line's lasting rise in cost per 1M tokens: change points on the log, the run that stays
    1.5x above the level before it (``analytics.changepoints``); lines without one are left out."""
    rows = []
    for key, line in series.groupby(by, sort=True):
        steps = line.dropna(subset=["cost_per_million_tokens"]).sort_values("ts").reset_index(drop=True)
        if len(steps) < min_steps:
            continue
        values = np.log(np.maximum(steps["cost_per_million_tokens"].to_numpy(float), 1e-12))
        bounds, levels, found = regression(values)
        if found is None:
            continue
        base, first, last = found
        end = steps["ts"].iloc[bounds[last]] if last < len(levels) else steps["ts"].iloc[-1]
        rows.append(
            {
                by: key,
                "break_at": steps["ts"].iloc[bounds[first]],
                "end": end,
                "before": math.exp(levels[base]),
                "after": float(np.exp(values[bounds[first] : bounds[last]].mean())),
            }
        )
    return pd.DataFrame(rows, columns=[by, "break_at", "end", "before", "after"])
