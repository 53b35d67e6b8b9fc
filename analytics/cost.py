"""GPU spend and cost per token: replica uptime x GPUs x price, shared out by tenants' tokens.

In:  a client, a window ``[start, end)``, GPU prices (``{gpu_type: USD per GPU-hour}``), token
     weights, and optionally a forced tier / retention / current time (``analytics.tiers``).
Out: DataFrames with ``.attrs["plan"]``:
     - ``gpu_spend``: per replica ``[replica, model, gpu_type, gpu_count, up_seconds, spend]``.
       A replica is up in a bucket of the tier (minute on raw and 1 min, hour on 1 h) when
       its engine reported ``vllm:num_requests_running`` in it; spend = up seconds x GPUs x
       price / 3600 (DESIGN.md section 5), idle time included.
     - ``cost_by_tenant``: per tenant ``[tenant, prompt_tokens, completion_tokens,
       cached_tokens, weighted_tokens, share, spend, cost_per_million_tokens]``: the whole
       spend (idle included, shared in proportion) split by weighted tokens, where a computed
       prompt token weighs ``input_weight``, a cached one ``cached_weight`` and an output
       token ``output_weight``; cost per 1M tokens = tenant spend / (prompt + output tokens).
A GPU type without a price raises ``KeyError`` naming it: a missing price must not read as free.
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd

from analytics.counters import series_latest
from analytics.requests import request_totals
from analytics.tiers import Retention, coverage, param_time, plan

__all__ = ["UP_METRIC", "cost_by_tenant", "gpu_spend"]

UP_METRIC = "vllm:num_requests_running"  # every vLLM engine reports it; present while it is up


def gpu_spend(
    client,  # noqa: ANN001
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    tier: str | None = None,
    retention: Retention | None = None,
    now: datetime | None = None,
) -> pd.DataFrame:
    """Seconds up and GPU spend per replica over ``[start, end)``."""
    p = plan(start, end, now=now, retention=retention, kind="samples", tier=tier,
             data=coverage(client, "samples") if tier is None else None)
    bucket, width = ("toStartOfHour(v.ts)", 3600) if p.tier.name == "1h" else ("toStartOfMinute(v.ts)", 60)
    sql = f"""
        SELECT s.replica AS replica, any(s.model) AS model, any(s.labels['gpu_type']) AS gpu_type,
               toUInt32OrZero(any(s.labels['gpu_count'])) AS gpu_count,
               uniqExact({bucket}) * {width} AS up_seconds
        FROM {p.samples} AS v
        INNER JOIN ({series_latest("metric")}) AS s ON s.fingerprint = v.fingerprint
        WHERE v.metric = {{metric:String}} AND v.ts >= {{start:DateTime64(3)}} AND v.ts < {{end:DateTime64(3)}}
        GROUP BY replica ORDER BY replica
    """
    df = client.query_df(sql, parameters={"metric": UP_METRIC, "start": param_time(p.start), "end": param_time(p.end)})
    unlabelled = df.loc[df["gpu_type"] == "", "replica"].tolist()
    if unlabelled:
        raise KeyError(f"no gpu_type label on {', '.join(repr(r) for r in unlabelled[:5])}: give the scrape target "
                       "gpu_type and gpu_count labels (the fleet spec does) to price it")
    missing = sorted(set(df["gpu_type"]) - set(prices))
    if missing:
        raise KeyError(f"no GPU price for {', '.join(repr(m) for m in missing)}: add one (USD per GPU-hour)")
    # a window that is not bucket-aligned touches one bucket more than it covers
    df["up_seconds"] = df["up_seconds"].clip(upper=(p.end - p.start).total_seconds())
    df["gpu_count"] = df["gpu_count"].clip(lower=1)
    df["spend"] = df["up_seconds"] * df["gpu_count"] * df["gpu_type"].map(prices) / 3600.0
    df.attrs["plan"] = p
    return df


def cost_by_tenant(
    client,  # noqa: ANN001
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    input_weight: float = 1.0,
    cached_weight: float = 0.25,
    output_weight: float = 4.0,
    tier: str | None = None,
    retention: Retention | None = None,
    now: datetime | None = None,
) -> pd.DataFrame:
    """The window's GPU spend shared out by tenants' weighted tokens; cost per 1M tokens."""
    spend = gpu_spend(client, start, end, prices, tier=tier, retention=retention, now=now)
    tokens = request_totals(client, start, end, by=["tenant"], tier=tier, retention=retention, now=now)
    computed = tokens["prompt_tokens"] - tokens["cached_tokens"]
    tokens["weighted_tokens"] = (computed * input_weight + tokens["cached_tokens"] * cached_weight
                                 + tokens["completion_tokens"] * output_weight)
    total = float(tokens["weighted_tokens"].sum())
    tokens["share"] = tokens["weighted_tokens"] / total if total > 0 else 0.0
    tokens["spend"] = tokens["share"] * float(spend["spend"].sum())
    billed = tokens["prompt_tokens"] + tokens["completion_tokens"]
    tokens["cost_per_million_tokens"] = (tokens["spend"] / billed * 1e6).where(billed > 0)
    out = tokens[["tenant", "prompt_tokens", "completion_tokens", "cached_tokens", "weighted_tokens", "share", "spend",
                  "cost_per_million_tokens"]]
    out.attrs["plan"] = tokens.attrs["plan"]
    out.attrs["spend_plan"] = spend.attrs["plan"]
    return out
