"""GPU spend and cost per token: replica uptime x GPUs x price, idle shown on its own, shared out
by tokens, and compared with reference API prices.

In:  a client, a window ``[start, end)``, GPU prices (``{gpu_type: USD per GPU-hour}``, kept in
     the metadata DB: ``storage.catalog.gpu_prices``), ``TokenWeights``, ``Filters`` (model,
     replica; tenant/route for showback), and optionally a forced tier / retention / time.
Out: DataFrames with ``.attrs["plan"]``:
     - ``gpu_hours``: per replica ``[replica, model, gpu_type, gpu_count, up_seconds,
       busy_seconds, gpu_hours]``. A replica is up in a bucket of the tier (a minute on raw and
       1 min, an hour on 1 h) when its engine reported ``vllm:num_requests_running`` in it, and
       busy when that gauge was above 0 at some scrape of the bucket;
     - ``gpu_spend``: the same plus ``spend`` = up seconds x GPUs x price / 3600 (DESIGN.md
       section 5; idle included), ``idle_spend`` (the up-but-not-busy part) and ``busy_spend``;
     - ``cost_per_token``: per ``by`` (model or replica) and a ``(fleet)`` row: spend, idle spend,
       tokens from the engines' counters (``vllm:prompt_tokens_total``, its cached part
       ``vllm:prompt_tokens_cached_total``, ``vllm:generation_tokens_total``; reset-aware),
       ``cost_per_million_tokens`` = spend / (prompt + output tokens) x 10^6, and a price list
       per 1M ``input`` / ``cached`` / ``output`` tokens that splits the spend by the weights
       (a computed prompt token weighs ``input``, a cached one ``cached``, an output token
       ``output``);
     - ``cost_by_tenant``: showback from the request log (weighted rows): each model pool's
       spend is shared among the tenants that used it, by weighted tokens: ``direct`` (the busy
       spend), ``idle`` (the idle spend in proportion, OpenCost's idea; or one ``(idle)`` row
       with ``idle="separate"``), ``spend``, ``share`` and ``cost_per_million_tokens``; a pool
       no request-log row accounts for is an ``(unattributed)`` row. Tenant and route filters
       pick tenants after the sharing (a tenant's cost does not depend on the filter);
     - ``cost_by_adapter``: the same showback per LoRA adapter: an adapter's requests (the
       request log's ``model`` is the adapter's name) share its base model's pool with the base
       model's own requests, by weighted tokens; ``[adapter, base, requests, ..., spend,
       cost_per_million_tokens]``;
     - ``cost_views``: ``gpu_spend``, ``cost_per_token`` by model and ``cost_by_tenant`` for one
       window, the uptime read once (the Cost page);
     - ``compare_reference``: what the same tokens would cost at reference API prices per 1M
       tokens, and the ratio of our cost to it.
A GPU type without a price raises ``KeyError`` naming it: a missing price must not read as free.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import pandas as pd
from typing_extensions import Unpack

from analytics.adapters import adapter_pools, engine_filters, request_filters
from analytics.counters import series_latest
from analytics.filters import Filters
from analytics.frames import query_df
from analytics.metrics import counter_increases
from analytics.requests import request_totals
from analytics.tiers import HOUR, SIX_HOURS, between, coverage, param_time, plan
from analytics.vllm import CACHED_PROMPT_TOKENS, GENERATION_TOKENS, PROMPT_TOKENS, REQUESTS_RUNNING
from analytics.window import Scope, scope_parts
from storage.clickhouse import Client

__all__ = [
    "FLEET",
    "UP_METRIC",
    "CostViews",
    "ReferencePrice",
    "TokenWeights",
    "compare_reference",
    "cost_by_adapter",
    "cost_by_tenant",
    "cost_per_token",
    "cost_views",
    "gpu_hours",
    "gpu_spend",
]

UP_METRIC = REQUESTS_RUNNING  # every vLLM engine reports it; present while it is up
FLEET = "(fleet)"
IDLE = "(idle)"
UNATTRIBUTED = "(unattributed)"  # spend of pools no request-log row accounts for
PROMPT, CACHED, OUTPUT = PROMPT_TOKENS, CACHED_PROMPT_TOKENS, GENERATION_TOKENS


@dataclass(frozen=True)
class TokenWeights:
    """Relative cost of a computed prompt token, a cached prompt token and an output token
    (API price lists run about 1 : 0.1-0.5 : 4)."""

    input: float = 1.0
    cached: float = 0.25
    output: float = 4.0

    def __post_init__(self) -> None:
        if min(self.input, self.cached, self.output) < 0 or self.input + self.output <= 0:
            raise ValueError("token weights must be >= 0, with input + output > 0")


@dataclass(frozen=True)
class ReferencePrice:
    """A provider's list price in USD per 1M tokens (input, cached input, output)."""

    name: str
    input: float
    output: float
    cached: float | None = None  # None: priced as input


def gpu_hours(client: Client, start: datetime, end: datetime, **scope: Unpack[Scope]) -> pd.DataFrame:
    """Seconds up and busy, and GPU-hours, per replica over ``[start, end)``."""
    tier, retention, now, filters = scope_parts(scope)
    p = plan(
        start,
        end,
        now=now,
        retention=retention,
        kind="samples",
        tier=tier,
        data=coverage(client, "samples") if tier is None else None,
    )
    if p.tier is SIX_HOURS:  # uptime counts whole buckets: hours are close enough, 6 hours are not
        p = plan(start, end, now=now, retention=retention, kind="samples", tier=HOUR.name)
    # a bucket is up when a series of the replica has a sample in it, busy when one of them is > 0;
    # the buckets are counted per replica straight from the rows (see analytics.counters.sums_by_labels)
    bucket, width = ("v.ts", 3600) if p.tier is HOUR else ("toStartOfMinute(v.ts)", 60)
    peak = "v.value_max" if p.tier.rollup else "v.value"
    condition, params = filters.series() if filters else ("", {})
    series = f"({series_latest('metric')}) AS s WHERE {condition or 1}"
    sql = f"""
        SELECT m.replica AS replica, m.model AS model, m.gpu_type AS gpu_type, m.gpu_count AS gpu_count,
               t.up * {width} AS up_seconds, t.busy * {width} AS busy_seconds
        FROM (
            SELECT s.k AS k, uniqExact({bucket}) AS up, uniqExactIf({bucket}, {peak} > 0) AS busy
            FROM {p.samples} AS v
            INNER JOIN (SELECT fingerprint, cityHash64(s.replica) AS k FROM {series}) AS s
                ON s.fingerprint = v.fingerprint
            WHERE v.metric = {{metric:String}} AND {between(p.tier.rollup, "v.ts")}
            GROUP BY k
        ) AS t
        INNER JOIN (SELECT cityHash64(s.replica) AS k, s.replica AS replica, any(s.model) AS model,
                           any(s.labels['gpu_type']) AS gpu_type,
                           toUInt32OrZero(any(s.labels['gpu_count'])) AS gpu_count
                    FROM {series} GROUP BY replica) AS m ON m.k = t.k
        ORDER BY replica
    """
    params.update(metric=UP_METRIC, start=param_time(p.start), end=param_time(p.end))
    df = query_df(client, sql, parameters=params)
    # a window that is not bucket-aligned touches one bucket more than it covers
    span = (p.end - p.start).total_seconds()
    df["up_seconds"] = df["up_seconds"].clip(upper=span).astype(float)
    df["busy_seconds"] = df["busy_seconds"].clip(upper=df["up_seconds"]).astype(float)
    df["gpu_count"] = df["gpu_count"].clip(lower=1)
    df["gpu_hours"] = df["up_seconds"] * df["gpu_count"] / 3600.0
    df.attrs["plan"] = p
    return df


def gpu_spend(
    client: Client, start: datetime, end: datetime, prices: dict[str, float], **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Spend per replica over ``[start, end)``: all of it, its idle part and its busy part."""
    tier, retention, now, filters = scope_parts(scope)
    df = gpu_hours(client, start, end, filters=filters, tier=tier, retention=retention, now=now)
    unlabelled = df.loc[df["gpu_type"] == "", "replica"].tolist()
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
    per_second = df["gpu_count"] * df["gpu_type"].map(prices).astype(float) / 3600.0
    df["spend"] = df["up_seconds"] * per_second
    df["idle_spend"] = (df["up_seconds"] - df["busy_seconds"]) * per_second
    df["busy_spend"] = df["spend"] - df["idle_spend"]
    return df


def _engine_tokens(client: Client, start: datetime, end: datetime, by: str, kw: Scope) -> pd.DataFrame:
    names = {PROMPT: "prompt_tokens", CACHED: "cached_tokens", OUTPUT: "completion_tokens"}
    found = counter_increases(client, list(names), start, end, by, **kw)  # one query for the three counters
    if found.empty:
        return pd.DataFrame(columns=[by, *names.values()])
    wide = found.pivot_table(index=by, columns="metric", values="increase", aggfunc="sum")
    wide = wide.reindex(columns=list(names)).rename(columns=names).fillna(0.0)
    wide.columns.name = None
    return wide.reset_index()


def _price_list(df: pd.DataFrame, weights: TokenWeights) -> pd.DataFrame:
    computed = df["prompt_tokens"] - df["cached_tokens"]
    weighted = (
        computed * weights.input + df["cached_tokens"] * weights.cached + df["completion_tokens"] * weights.output
    )
    per_weighted = (df["spend"] / weighted).where(weighted > 0)
    billed = df["prompt_tokens"] + df["completion_tokens"]
    df["cost_per_million_tokens"] = (df["spend"] / billed * 1e6).where(billed > 0)
    df["input_per_million"] = per_weighted * weights.input * 1e6
    df["cached_per_million"] = per_weighted * weights.cached * 1e6
    df["output_per_million"] = per_weighted * weights.output * 1e6
    df["idle_share"] = (df["idle_spend"] / df["spend"]).where(df["spend"] > 0)
    return df


def cost_per_token(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    by: str = "model",
    weights: TokenWeights | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Spend, tokens served and cost per 1M tokens per ``by`` (model or replica) and for the fleet."""
    if by not in ("model", "replica"):
        raise ValueError("by must be 'model' or 'replica'")
    spend = gpu_spend(client, start, end, prices, **scope)
    return _per_token(spend, _engine_tokens(client, start, end, by, scope), by, weights or TokenWeights())


def _per_token(spend: pd.DataFrame, tokens: pd.DataFrame, by: str, weights: TokenWeights) -> pd.DataFrame:
    money = spend.groupby(by)[["spend", "idle_spend", "busy_spend", "gpu_hours"]].sum().reset_index()
    df = money.merge(tokens, on=by, how="outer").fillna(0.0)
    total = df.drop(columns=[by]).sum().to_frame().T
    total.insert(0, by, FLEET)
    df = pd.concat([df, total], ignore_index=True) if len(df) else df
    df = _price_list(df, weights)
    df.attrs.update(plan=spend.attrs["plan"], weights=weights)
    return df


def cost_by_tenant(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    weights: TokenWeights | None = None,
    idle: str = "share",
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Showback: each model pool's spend shared among the tenants that used it, by weighted
    tokens (direct: the busy spend; idle: the idle spend, in proportion or as its own row)."""
    tier, retention, now, filters = scope_parts(scope)
    if idle not in ("share", "separate"):
        raise ValueError("idle must be 'share' (in proportion to use) or 'separate' (its own row)")
    # shares are taken over every tenant of a pool; tenant and route filters only pick rows after
    spend = gpu_spend(
        client, start, end, prices, filters=_spend_filters(client, filters), tier=tier, retention=retention, now=now
    )
    return _showback(client, spend, start, end, weights or TokenWeights(), idle, scope)


def _spend_filters(client: Client, filters: Filters | None) -> Filters | None:
    """The model and replica filters as the engines see them: an adapter's name is its base model's
    pool (its spend is what the adapter shares)."""
    if not filters:
        return None
    engine = engine_filters(filters, adapter_pools(client)) if filters.model else filters
    assert engine is not None
    return Filters(model=engine.model, replica=engine.replica)


def cost_by_adapter(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    weights: TokenWeights | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Showback per LoRA adapter: its share of its base model pool's spend (idle in proportion),
    by weighted tokens; one row per adapter that had requests in the window."""
    tier, retention, now, filters = scope_parts(scope)
    pools = adapter_pools(client)
    if not pools:  # no replica serves adapters: nothing to read
        return pd.DataFrame(columns=["adapter", "base", *SHOWBACK_MEASURES])
    spend = gpu_spend(
        client, start, end, prices, filters=_spend_filters(client, filters), tier=tier, retention=retention, now=now
    )
    out = _showback(client, spend, start, end, weights or TokenWeights(), "share", scope, by="model", pools=pools)
    out = out[out["model"].isin(list(pools))].rename(columns={"model": "adapter"})
    out.insert(1, "base", out["adapter"].map(pools))
    return out.reset_index(drop=True)


def _showback(
    client: Client,
    spend: pd.DataFrame,
    start: datetime,
    end: datetime,
    weights: TokenWeights,
    idle: str,
    scope: Scope,
    by: str = "tenant",
    pools: dict[str, str] | None = None,
) -> pd.DataFrame:
    """``cost_by_tenant`` (or per requested model, ``by="model"``) from the pools' spend already
    read (``spend``: ``gpu_spend`` with the model and replica filters alone). A request for a LoRA
    adapter (``pools``: adapter -> base model; read when not given) is costed in its base model's
    pool."""
    tier, retention, now, filters = scope_parts(scope)
    pool_filters = Filters(model=filters.model, replica=filters.replica) if filters else None
    pool_spend = spend.groupby("model")[["busy_spend", "idle_spend"]].sum()
    pools = adapter_pools(client) if pools is None else pools
    asked: set[str] = set()  # the requested models, after the sharing: a base model with its adapters
    if pool_filters and pool_filters.model:  # the whole pool's rows share its spend
        asked = set(request_filters(pool_filters, pools).model)  # type: ignore[union-attr]
        base = engine_filters(pool_filters, pools)
        pool_filters = request_filters(base, pools)
    tokens = request_totals(
        client,
        start,
        end,
        by=["model", "tenant", "route"],
        tier=tier,
        retention=retention,
        now=now,
        filters=pool_filters,
    )
    plan_used = tokens.attrs["plan"]
    computed = tokens["prompt_tokens"] - tokens["cached_tokens"]
    tokens["weighted_tokens"] = (
        computed * weights.input
        + tokens["cached_tokens"] * weights.cached
        + tokens["completion_tokens"] * weights.output
    )
    tokens["pool"] = tokens["model"].map(lambda m: pools.get(m, m))
    pool_tokens = tokens.groupby("pool")["weighted_tokens"].transform("sum")
    pool_share = (tokens["weighted_tokens"] / pool_tokens).where(pool_tokens > 0, 0.0)
    tokens["direct"] = pool_share * tokens["pool"].map(pool_spend["busy_spend"]).fillna(0.0)
    pool_idle = pool_share * tokens["pool"].map(pool_spend["idle_spend"]).fillna(0.0)
    tokens["idle"] = pool_idle if idle == "share" else 0.0
    picked = bool(asked) and not asked >= set(tokens["model"])  # an adapter asked for by name: its rows
    if picked:
        tokens = tokens[tokens["model"].isin(asked)]
    if filters and (filters.tenant or filters.route):
        keep = pd.Series(True, index=tokens.index)
        if filters.tenant:
            keep &= tokens["tenant"].isin(filters.tenant)
        if filters.route:
            keep &= tokens["route"].isin(filters.route)
        tokens = tokens[keep]
    measures = ["requests", "prompt_tokens", "completion_tokens", "cached_tokens", "weighted_tokens", "direct", "idle"]
    out = tokens.groupby(by, as_index=False)[measures].sum()
    added: list[dict[str, object]] = []
    if not (filters and (filters.tenant or filters.route)) and not picked:
        used = set(tokens.loc[tokens["weighted_tokens"] > 0, "pool"])
        unused = pool_spend[~pool_spend.index.isin(used)]  # spend no request-log row accounts for
        if len(unused) and float(unused.sum().sum()) > 0:
            added.append(
                {
                    by: UNATTRIBUTED,
                    "direct": float(unused["busy_spend"].sum()),
                    "idle": float(unused["idle_spend"].sum()) if idle == "share" else 0.0,
                }
            )
        if idle == "separate" and float(spend["idle_spend"].sum()) > 0:
            added.append({by: IDLE, "direct": 0.0, "idle": float(spend["idle_spend"].sum())})
    if added:
        rows = [{**dict.fromkeys(measures, 0.0), **row} for row in added]
        out = pd.concat([out, pd.DataFrame(rows)], ignore_index=True)
    out["spend"] = out["direct"] + out["idle"]
    total = float(out["spend"].sum())
    out["share"] = out["spend"] / total if total > 0 else 0.0
    billed = out["prompt_tokens"] + out["completion_tokens"]
    out["cost_per_million_tokens"] = (out["spend"] / billed * 1e6).where(billed > 0)
    out = out[[by, *SHOWBACK_MEASURES]]
    out.attrs.update(plan=plan_used, spend_plan=spend.attrs["plan"], weights=weights)
    return out


SHOWBACK_MEASURES = [
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "weighted_tokens",
    "share",
    "direct",
    "idle",
    "spend",
    "cost_per_million_tokens",
]


class CostViews(NamedTuple):
    """What the Cost page shows, from one read of the replicas' uptime."""

    spend: pd.DataFrame  # gpu_spend
    per_model: pd.DataFrame  # cost_per_token by model, with the (fleet) row
    tenants: pd.DataFrame  # cost_by_tenant (idle shared in proportion)


def cost_views(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    weights: TokenWeights | None = None,
    **scope: Unpack[Scope],
) -> CostViews:
    """``gpu_spend``, ``cost_per_token`` by model and ``cost_by_tenant`` over the same window, the
    uptime read once (each of the three read it: a third of the Cost page's query time). The
    spend depends on the model and replica filters alone, so the showback's pools are the same."""
    tier, retention, now, filters = scope_parts(scope)
    weights = weights or TokenWeights()
    spend = gpu_spend(
        client, start, end, prices, filters=_spend_filters(client, filters), tier=tier, retention=retention, now=now
    )
    per_model = _per_token(spend, _engine_tokens(client, start, end, "model", scope), "model", weights)
    return CostViews(spend, per_model, _showback(client, spend, start, end, weights, "share", scope))


def compare_reference(row: pd.Series | dict[str, Any], references: list[ReferencePrice]) -> pd.DataFrame:
    """For one ``cost_per_token`` row: each reference's price for the same tokens, and ours."""
    computed = float(row["prompt_tokens"]) - float(row["cached_tokens"])
    cached, output, ours = float(row["cached_tokens"]), float(row["completion_tokens"]), float(row["spend"])
    rows = []
    for ref in references:
        cached_price = ref.input if ref.cached is None else ref.cached
        theirs = (computed * ref.input + cached * cached_price + output * ref.output) / 1e6
        rows.append(
            {
                "reference": ref.name,
                "input_per_million": ref.input,
                "cached_per_million": cached_price,
                "output_per_million": ref.output,
                "reference_cost": theirs,
                "our_cost": ours,
                "ratio": ours / theirs if theirs > 0 else float("nan"),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "reference",
            "input_per_million",
            "cached_per_million",
            "output_per_million",
            "reference_cost",
            "our_cost",
            "ratio",
        ],
    )
