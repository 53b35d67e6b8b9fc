"""Signal readers of cost: USD per 1M tokens, its change against an earlier window, its jump
against the baseline just before.

In:  a ``Context`` (the ClickHouse client, the metadata sessions for the GPU prices, the token
     weights, the cycle cache), a signal's parsed parameters and the evaluation time.
Out: the ``Sample`` list of each signal; replicas without a ``gpu_type`` label or a price give no
     samples, not an error. Every number comes from ``analytics`` (``cost``, ``cost_series``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from alerts.reading import Context, Params, Sample, frame, window

__all__ = ["cost_change", "cost_jump", "cost_per_mtok"]


def _prices(ctx: Context) -> dict[str, float]:
    """USD per GPU-hour by GPU type (metadata DB), read once per cycle."""
    from storage.catalog import gpu_prices

    if ("prices",) not in ctx.cache:
        ctx.cache[("prices",)] = gpu_prices(ctx.sessions) if ctx.sessions is not None else {}
    prices: dict[str, float] = ctx.cache[("prices",)]
    return prices


def _cost(ctx: Context, p: Params, at: datetime, shift: timedelta = timedelta(0)) -> pd.DataFrame:
    from analytics.cost import cost_per_token

    prices = _prices(ctx)
    start, end = window(at - shift, p)
    return cost_per_token(ctx.client, start, end, prices, by=p["by"], weights=ctx.weights)


def cost_per_mtok(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    try:
        return frame(_cost(ctx, p, at), [p["by"]], "cost_per_million_tokens")
    except KeyError:  # replicas without a gpu_type label or price: nothing to say, not an error
        return []


def cost_change(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    try:
        now = _cost(ctx, p, at)[[p["by"], "cost_per_million_tokens"]]
        then = _cost(ctx, p, at, timedelta(seconds=p["offset"]))[[p["by"], "cost_per_million_tokens"]]
    except KeyError:  # replicas without a gpu_type label or price: nothing to say, not an error
        return []
    both = now.merge(then, on=p["by"], suffixes=("", "_then"))
    both["change"] = (both["cost_per_million_tokens"] / both["cost_per_million_tokens_then"] - 1) * 100
    both = both[both["cost_per_million_tokens_then"] > 0]
    return frame(both, [p["by"]], "change")


def cost_jump(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    """Percent change of cost per 1M tokens: the last ``window`` against the ``baseline`` before
    it (what there is of it: a young fleet compares with its first minutes), per model or tenant."""
    from analytics.cost_series import cost_over_time

    prices = _prices(ctx)
    recent_start = at - timedelta(seconds=p["window"])
    start = recent_start - timedelta(seconds=p["baseline"])
    step = max(60, int(p["window"]) // 15)
    try:
        series = cost_over_time(ctx.client, start, at, prices, by=p["by"], step=step, weights=ctx.weights)
    except KeyError:  # replicas without a gpu_type label or price: nothing to say, not an error
        return []
    if series.empty:
        return []
    series = series[series["ts"] < pd.Timestamp(at)]
    recent = series[series["ts"] >= pd.Timestamp(recent_start)]
    base = series[series["ts"] < pd.Timestamp(recent_start)]
    out = []
    for key, part in recent.groupby(p["by"]):
        before = base[base[p["by"]] == key]
        if len(before) < 2 or before["tokens"].sum() <= 0 or part["tokens"].sum() <= 0:
            continue  # too little baseline to compare with, or no tokens on a side: no data
        now_cost = part["spend"].sum() / part["tokens"].sum()
        then_cost = before["spend"].sum() / before["tokens"].sum()
        if then_cost > 0:
            out.append(Sample({p["by"]: str(key)}, float((now_cost / then_cost - 1) * 100)))
    return out
