"""GPU spend and cost per token over a window: replica uptime x GPUs x price, idle shown on its
own, shared out by tokens, and compared with reference API prices.

In:  a client, a window ``[start, end)``, GPU prices (``{gpu_type: USD per GPU-hour}``, kept in
     the metadata DB: ``storage.catalog.gpu_prices``), ``TokenWeights``, ``Filters`` (model,
     replica; tenant/route for showback), and optionally a forced tier / retention / time.
Out: DataFrames with ``.attrs["plan"]`` (the window answered: whole grains of
     ``analytics.allocation``, the one cost rule these figures are sums of):
     - ``gpu_hours``: per replica ``[replica, model, gpu_type, gpu_count, replicas, up_seconds,
       busy_seconds, gpu_hours]`` (``analytics.allocation.uptime`` over the window);
     - ``gpu_spend``: the same plus ``spend`` = up seconds x GPUs x price / 3600 (DESIGN.md
       section 5; idle included), ``idle_spend`` (the up-but-not-busy part) and ``busy_spend``;
     - ``cost_per_token``: per ``by`` (model or replica) and a ``(fleet)`` row: spend, idle spend,
       tokens from the engines' counters (``vllm:prompt_tokens_total``, its cached part
       ``vllm:prompt_tokens_cached_total``, ``vllm:generation_tokens_total``; reset-aware),
       ``cost_per_million_tokens`` = spend / (prompt + output tokens) x 10^6, and a price list
       per 1M ``input`` / ``cached`` / ``output`` tokens that splits the spend by the weights
       (a computed prompt token weighs ``input``, a cached one ``cached``, an output token
       ``output``);
     - ``cost_by_tenant``: showback from the request log (weighted rows; the gateway's when it has
       rows, else the engines' spans): each model pool's spend, bucket by bucket, shared among the
       tenants that used it by weighted tokens (``analytics.allocation.allocate``): ``direct``
       (the busy spend), ``idle`` (the idle spend in proportion, OpenCost's idea; or one
       ``(idle)`` row with ``idle="separate"``), ``spend``, ``share`` and
       ``cost_per_million_tokens``; the spend of buckets no request-log row accounts for is an
       ``(unattributed)`` row. Tenant and route filters pick tenants after the sharing (a
       tenant's cost does not depend on the filter);
     - ``cost_by_adapter``: the same showback per LoRA adapter: an adapter's requests (the
       request log's ``model`` is the adapter's name) share its base model's pool with the base
       model's own requests, by weighted tokens; ``[adapter, base, requests, ..., spend,
       cost_per_million_tokens]``;
     - ``cost_views``: ``gpu_spend``, ``cost_per_token`` by model, ``cost_by_tenant`` and
       ``cost_by_adapter`` for one window (the Cost page);
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

from analytics.adapters import adapter_pools
from analytics.allocation import (
    FLEET,
    IDLE,
    MONEY,
    UNATTRIBUTED,
    UP_METRIC,
    Shares,
    TokenWeights,
    allocate,
    engine_side,
    engine_tokens,
    picked,
    priced,
    uptime,
    weighted,
)
from analytics.errors import BadInput
from analytics.filters import Filters
from analytics.frames import sum_by
from analytics.window import Scope, rescope
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


GPU_HOURS = ["replica", "model", "gpu_type", "gpu_count", "replicas", "up_seconds", "busy_seconds", "gpu_hours"]


@dataclass(frozen=True)
class ReferencePrice:
    """A provider's list price in USD per 1M tokens (input, cached input, output)."""

    name: str
    input: float
    output: float
    cached: float | None = None  # None: priced as input


def gpu_hours(client: Client, start: datetime, end: datetime, **scope: Unpack[Scope]) -> pd.DataFrame:
    """Seconds up and busy, and GPU-hours, per replica over ``[start, end)``."""
    df = uptime(client, start, end, **rescope(scope, filters=engine_side(client, scope.get("filters"))))
    df["gpu_hours"] = df["up_seconds"] * df["gpu_count"] / 3600.0
    return df[GPU_HOURS]


def gpu_spend(
    client: Client, start: datetime, end: datetime, prices: dict[str, float], **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Spend per replica over ``[start, end)``: all of it, its idle part and its busy part."""
    return priced(gpu_hours(client, start, end, **scope), prices)


def _price_list(df: pd.DataFrame, weights: TokenWeights) -> pd.DataFrame:
    w = weighted(df, weights)
    per_weighted = (df["spend"] / w).where(w > 0)
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
        raise BadInput("by must be 'model' or 'replica'")
    spend = gpu_spend(client, start, end, prices, **scope)
    return _per_token(client, spend, by, weights or TokenWeights(), scope)


def _per_token(client: Client, spend: pd.DataFrame, by: str, weights: TokenWeights, scope: Scope) -> pd.DataFrame:
    """``cost_per_token`` from the spend already read: the engines' tokens over the same window."""
    # the tokens on the spend's tier (``engine_tokens`` reads ``spend.attrs["plan"]``'s)
    tokens = engine_tokens(
        client, spend.attrs["plan"], by, None, rescope(scope, filters=engine_side(client, scope.get("filters")))
    )
    money = spend.groupby(by)[[*MONEY, "gpu_hours"]].sum().reset_index()
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
    """Showback: each model pool's spend shared among the tenants that used it, bucket by bucket,
    by weighted tokens (direct: the busy spend; idle: the idle spend, in proportion or as its own
    row)."""
    if idle not in ("share", "separate"):
        raise BadInput("idle must be 'share' (in proportion to use) or 'separate' (its own row)")
    shares = allocate(client, start, end, prices, weights=weights, **scope)
    return showback(shares, scope.get("filters"), idle=idle)


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
    if not adapter_pools(client):  # no replica serves adapters: nothing to read
        return pd.DataFrame(columns=["adapter", "base", *SHOWBACK_MEASURES])
    shares = allocate(client, start, end, prices, weights=weights, **scope)
    return adapter_showback(shares, scope.get("filters"))


def adapter_showback(shares: Shares, filters: Filters | None) -> pd.DataFrame:
    """``cost_by_adapter`` from an allocation already made."""
    out = showback(shares, filters, by="model")
    out = out[out["model"].isin(list(shares.pool_of))].rename(columns={"model": "adapter"})
    out.insert(1, "base", out["adapter"].map(shares.pool_of))
    return out.reset_index(drop=True)


def showback(shares: Shares, filters: Filters | None, *, by: str = "tenant", idle: str = "share") -> pd.DataFrame:
    """Per ``by`` (tenant, route, model) over the allocation's window: its share of the spend, the
    unattributed spend and (``idle="separate"``) the idle spend as rows of their own."""
    payers = picked(shares.payers, filters, shares.pool_of)
    measures = ["requests", "prompt_tokens", "completion_tokens", "cached_tokens", "weighted_tokens", "direct", "idle"]
    out = sum_by(payers[payers[by].notna()], [by], measures)
    if idle == "separate":
        out["idle"] = 0.0
    added: list[dict[str, object]] = []
    named = filters is not None and any(m in shares.pool_of for m in filters.model)  # an adapter asked for
    if not (filters and (filters.tenant or filters.route)) and not named:  # the pools' own spend: all of it
        free = shares.unattributed
        direct, idle_free = float(free["direct"].sum()), float(free["idle"].sum())
        if direct + (idle_free if idle == "share" else 0.0) > 0:
            added.append({by: UNATTRIBUTED, "direct": direct, "idle": idle_free if idle == "share" else 0.0})
        all_idle = float(shares.pools["idle_spend"].sum())
        if idle == "separate" and all_idle > 0:
            added.append({by: IDLE, "direct": 0.0, "idle": all_idle})
    if added:
        rows = [{**dict.fromkeys(measures, 0.0), **row} for row in added]
        out = pd.concat([out, pd.DataFrame(rows)], ignore_index=True)
    out["spend"] = out["direct"] + out["idle"]
    total = float(out["spend"].sum())
    out["share"] = out["spend"] / total if total > 0 else 0.0
    billed = out["prompt_tokens"] + out["completion_tokens"]
    out["cost_per_million_tokens"] = (out["spend"] / billed * 1e6).where(billed > 0)
    out = out[[by, *SHOWBACK_MEASURES]]
    out.attrs.update(plan=shares.plan, spend_plan=shares.plan, weights=shares.weights, source=shares.source)
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
    """What the Cost page shows over one window."""

    spend: pd.DataFrame  # gpu_spend
    per_model: pd.DataFrame  # cost_per_token by model, with the (fleet) row
    tenants: pd.DataFrame  # cost_by_tenant (idle shared in proportion)
    adapters: pd.DataFrame  # cost_by_adapter (empty where no replica serves adapters)


def cost_views(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    weights: TokenWeights | None = None,
    **scope: Unpack[Scope],
) -> CostViews:
    """``gpu_spend``, ``cost_per_token`` by model, ``cost_by_tenant`` and ``cost_by_adapter`` over
    the same window (the showbacks from one allocation)."""
    weights = weights or TokenWeights()
    shares = allocate(client, start, end, prices, weights=weights, replicas=True, **scope)
    assert shares.replicas is not None
    spend = shares.replicas
    spend["gpu_hours"] = spend["up_seconds"] * spend["gpu_count"] / 3600.0
    spend = spend[[*GPU_HOURS, *MONEY]]
    spend.attrs.update(plan=shares.plan)
    per_model = _per_token(client, spend, "model", weights, scope)
    filters = scope.get("filters")
    adapters = (
        adapter_showback(shares, filters)
        if shares.pool_of
        else pd.DataFrame(columns=["adapter", "base", *SHOWBACK_MEASURES])
    )
    return CostViews(spend, per_model, showback(shares, filters), adapters)


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
