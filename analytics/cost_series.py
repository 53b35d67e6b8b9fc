"""Cost over time: spend, tokens and cost per 1M tokens per step, for the fleet and by model pool,
replica, tenant, route or LoRA adapter.

In:  a client, a window ``[start, end)``, GPU prices (``{gpu_type: USD per GPU-hour}``), ``by``
     (``fleet``, ``model``, ``replica``, ``tenant``, ``route`` or ``adapter``), optionally a step
     (seconds; default about ``POINTS`` steps; always a whole number of the cost rule's grains:
     minutes, or hours on the hourly tiers), ``TokenWeights`` and the scope.
Out: ``spend_over_time``: per step and replica ``[ts, replica, model, gpu_type, gpu_count,
     up_seconds, busy_seconds, spend, idle_spend, busy_spend]`` (``analytics.allocation``'s
     uptime, priced);
     ``cost_over_time``: per step and ``by`` ``[ts, <by>, spend, idle_spend, busy_spend,
     prompt_tokens, cached_tokens, completion_tokens, tokens, cost_per_million_tokens]``
     (``tokens`` = prompt + output; ``cost_per_million_tokens`` NaN, not infinite, in a step
     without tokens: the cost of a token nobody asked for is undefined, the spend is still shown).
     ``.attrs``: ``step``, ``plan``, ``source`` (where the tokens were counted) and, for tenants,
     routes and adapters, ``unattributed`` (per step, the spend of pools no request-log row
     accounts for);
     ``cost_breaks``: per line of such a series, its lasting rise, found as ``explain`` finds one
     (``[<by>, break_at, end, before, after]``, USD per 1M tokens), what a page marks.

The rule is ``analytics.allocation``'s, so a line summed over the steps of a window is the
showback's figure for that window (``analytics.cost``). Tokens: for the fleet, pools and
replicas, the engines' own counters (reset-aware increases per step: a restart reads as a
restart, never as negative tokens); for tenants, routes and adapters, the request log, each
pool's spend shared among them bucket by bucket by weighted tokens. A replica that comes or goes
costs only for the steps it is up in, so the steps it misses are neither free nor spiky.
"""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pandas as pd
from typing_extensions import Unpack

from analytics.allocation import (
    FLEET,
    MONEY,
    TOKENS,
    TokenWeights,
    allocate,
    engine_side,
    engine_tokens,
    grain,
    picked,
    priced,
    spend_plan,
    uptime,
    whole_step,
)
from analytics.changepoints import regression
from analytics.errors import BadInput
from analytics.timeseries import auto_step
from analytics.window import Scope, rescope
from storage.clickhouse import Client

__all__ = ["BY", "MIN_STEP_S", "POINTS", "cost_breaks", "cost_over_time", "cost_step", "spend_over_time"]

BY = ("fleet", "model", "replica", "tenant", "route", "adapter")
POINTS = 90  # steps over a window: a cost per token needs a few requests per step
MIN_STEP_S = 60  # the rule's grain on the finest tiers
COLUMNS = [*MONEY, *TOKENS]


def cost_step(start: datetime, end: datetime, step: float | None, client: Client, **scope: Unpack[Scope]) -> int:
    """The step the series uses: ``step`` or about ``POINTS`` over the window, a whole number of the
    cost rule's grains on the tier read (minutes on the raw and 1-minute tiers, hours beyond)."""
    g = grain(spend_plan(client, start, end, scope))
    return whole_step(step if step else max(MIN_STEP_S, auto_step(start, end, points=POINTS)), g)


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
    s = cost_step(start, end, step, client, **scope)
    df = uptime(client, start, end, step=s, **rescope(scope, filters=engine_side(client, scope.get("filters"))))
    return priced(df, prices)


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
        raise BadInput(f"by must be one of {', '.join(BY)}, not {by!r}")
    filters = scope.get("filters")
    s = cost_step(start, end, step, client, **scope)
    if by in ("fleet", "model", "replica"):
        group = "model" if by == "fleet" else by
        spend = spend_over_time(client, start, end, prices, step=s, **scope)
        money = spend.groupby(["ts", group], as_index=False)[MONEY].sum()
        tokens = engine_tokens(
            client, spend.attrs["plan"], group, s, rescope(scope, filters=engine_side(client, filters))
        )
        df = money.merge(tokens, on=["ts", group], how="outer").fillna({c: 0.0 for c in COLUMNS})
        if by == "fleet":
            df = df.groupby("ts", as_index=False)[COLUMNS].sum().assign(fleet=FLEET)
        out = _finish(df, by)
        out.attrs.update(step=s, plan=spend.attrs["plan"], source="engine counters")
        return out
    # tenants, routes and adapters: each pool's spend shared bucket by bucket by the request log
    shares = allocate(client, start, end, prices, weights=weights, step=s, **scope)
    rows = picked(shares.payers, filters, shares.pool_of)
    column = "model" if by == "adapter" else by
    if by == "adapter":
        rows = rows[rows["model"].isin(list(shares.pool_of))]
    df = rows.groupby(["ts", column], as_index=False)[["direct", "idle", *TOKENS]].sum()
    df = df.rename(columns={"model": "adapter"}) if by == "adapter" else df
    df["spend"], df["idle_spend"], df["busy_spend"] = df["direct"] + df["idle"], df["idle"], df["direct"]
    out = _finish(df, by)
    out.attrs.update(
        step=s,
        plan=shares.plan,
        source=f"request log ({shares.source})" if shares.source else "request log",
        unattributed=shares.unattributed.groupby("ts")[["direct", "idle"]].sum().sum(axis=1),
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
