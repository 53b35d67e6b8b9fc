"""Explain a rise in cost per 1M tokens: find its break, then attribute the change to its causes.

In:  a client, a window ``[start, end)``, GPU prices, ``Filters`` (one tenant, model, LoRA adapter
     or route is the view explained; none: the fleet), ``TokenWeights``, optionally a step and a
     time to explain (``at``: the break is taken there instead of found).
Out: a ``CostExplanation``:
     - ``series``: ``[ts, value, spend, tokens]``, the view's cost per 1M tokens per step
       (``analytics.cost_series``); ``break_at`` (the start of the rise, found as ``explain``
       finds a latency's: change points on the log, the run that stays 1.5x above the level
       before it), ``before`` / ``after`` (USD per 1M tokens over the two periods: the showback's
       figures for those periods, ``analytics.allocation``'s rule) and ``periods`` (the
       baseline's start, the break, the rise's end);
     - ``pools``: per model pool and period: spend, tokens, the view's tokens and its part of the
       spend, the pool's cost per 1M, replicas up, GPU-hours, idle and cached shares;
     - ``decomposition``: the change, after - before, as Shapley parts over the rule's factors
       (``analytics.cost_parts``: the view's own ``traffic``, one row however many pools it
       passed through; each pool's ``volume``, the other tokens it is shared with; each pool's
       ``spend``); the parts add up to the change exactly and depend on no order. Each row has
       ``usd_per_million``, ``share`` of the change and ``detail`` in words;
     - ``flows``: per tenant and pool, tokens and the tenant's share of its tokens in the pool,
       before and after (whose tokens left or arrived); ``routes``: per tenant, route and
       reason (the gateway's ``route_reason``, its numbers left out to group them), requests
       before and after; ``movers``: the tenants whose tokens changed pool, with the route and
       reason that sent them and their median prompt length before and after;
     - ``evidence``: the decomposition's rows that moved the cost, ranked by their share of the
       change; ``problems``: what could not be computed, in words; ``sentence``: one line,
       "consistent with", in dollars per 1M tokens per part.
``to_dict`` is the ``fleetscope explain --metric cost --format json`` document.

Tokens: the fleet's and a pool's from the engines' counters (as ``cost_per_token`` counts them);
a tenant's, route's or adapter's from the request log (the gateway's when it has rows: it knows
tenants, routes and why the router chose them), with its part of each pool's spend shared bucket
by bucket (``analytics.allocation``). Without a request log the fleet and its pools are explained
from the engines alone, with no tenants or routes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from analytics.adapters import adapter_pools
from analytics.allocation import TOKENS, TokenWeights, allocate, engine_tokens
from analytics.changepoints import regression
from analytics.cost_parts import Side, decompose, level
from analytics.cost_series import cost_over_time, spend_over_time
from analytics.cost_words import MOVED, Words, detail, sentence
from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.gateways import gaps
from analytics.requests import log_source
from analytics.tiers import param_time
from analytics.window import Scope
from common.timeutil import as_utc
from storage.clickhouse import Client

__all__ = ["CostExplanation", "explain_cost", "json_safe"]

MIN_STEPS = 8  # a break needs this many steps with tokens


@dataclass
class CostExplanation:
    view: str  # "the fleet", "tenant acme", "model tiny-small", "adapter support-bot", "route ..."
    source: str  # where the tokens were counted
    step: int
    series: pd.DataFrame
    break_at: datetime | None = None
    before: float = math.nan  # USD per 1M tokens
    after: float = math.nan
    periods: tuple[datetime, datetime, datetime] | None = None
    pools: pd.DataFrame = field(default_factory=pd.DataFrame)
    decomposition: pd.DataFrame = field(default_factory=pd.DataFrame)
    flows: pd.DataFrame = field(default_factory=pd.DataFrame)
    routes: pd.DataFrame = field(default_factory=pd.DataFrame)
    movers: pd.DataFrame = field(default_factory=pd.DataFrame)
    evidence: pd.DataFrame = field(default_factory=pd.DataFrame)
    problems: list[str] = field(default_factory=list)
    sentence: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (docs/analytics.md lists its keys)."""

        def frame(df: pd.DataFrame) -> list[dict[str, Any]]:
            return json_safe(df.to_dict(orient="records")) if len(df) else []

        periods = None
        if self.periods is not None:
            periods = {name: _iso(t) for name, t in zip(("baseline_start", "break", "end"), self.periods, strict=True)}
        return {
            "metric": "cost per 1M tokens",
            "view": self.view,
            "source": self.source,
            "step_s": self.step,
            "break_at": _iso(self.break_at),
            "before_usd_per_million": _num(self.before),
            "after_usd_per_million": _num(self.after),
            "change_usd_per_million": _num(self.after - self.before),
            "periods": periods,
            "sentence": self.sentence,
            "decomposition": frame(self.decomposition),
            "evidence": frame(self.evidence),
            "pools": frame(self.pools),
            "flows": frame(self.flows),
            "routes": frame(self.routes),
            "movers": frame(self.movers),
            "problems": list(self.problems),
            "series": frame(self.series),
        }


def _f(value: Any) -> float:
    """A pandas cell as a float (its declared type is every scalar pandas knows)."""
    return float(value)


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in df.to_dict(orient="records")]


def _iso(t: datetime | pd.Timestamp | None) -> str | None:
    return None if t is None or pd.isna(t) else pd.Timestamp(t).tz_convert("UTC").isoformat().replace("+00:00", "Z")


def _num(x: Any) -> float | None:
    try:
        value = _f(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) or math.isinf(value) else value


def json_safe(value: Any) -> Any:
    """Plain JSON values: timestamps as ISO strings, NaN and infinities as null."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, pd.Timestamp | datetime):
        return _iso(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return _num(value)
    return value


# --------------------------------------------------------------------------- the view


class View(NamedTuple):
    words: str  # "the fleet", "tenant acme", ...
    by: str  # the cost series' ``by``: fleet, model, tenant, route, adapter
    value: str | None  # the one picked
    column: str | None  # the payers' column that picks the view (a payer view), None for the fleet or a pool

    @property
    def payer(self) -> bool:
        return self.column is not None

    def pick(self) -> Filters | None:
        if self.value is None:
            return None
        return Filters(model=self.value) if self.by in ("model", "adapter") else Filters(**{self.by: self.value})


def _view(client: Client, filters: Filters | None) -> View:
    """The view explained: the fleet, one pool, or one payer (tenant, route, adapter)."""
    named = [(dim, getattr(filters, dim)) for dim in ("tenant", "model", "route") if filters and getattr(filters, dim)]
    if len(named) > 1 or any(len(values) > 1 for _dim, values in named) or (filters and filters.replica):
        raise ValueError(
            "explain --metric cost explains one view: the fleet, or one tenant, one model (or adapter) or one route"
        )
    if not named:
        return View("the fleet", "fleet", None, None)
    dim, values = named[0]
    value = values[0]
    if dim == "model" and value in adapter_pools(client):
        return View(f"adapter {value}", "adapter", value, "model")
    if dim == "model":
        return View(f"model {value}", "model", value, None)
    return View(f"{dim} {value}", dim, value, dim)


# --------------------------------------------------------------------------- reads


class Steps(NamedTuple):
    """Per step over the periods: each pool's spend, the engines' tokens per pool, and (with a
    request log) each payer's tokens and part of the spend."""

    pools: pd.DataFrame  # [ts, pool, spend, idle_spend, busy_spend, up_seconds]
    engine: pd.DataFrame  # [ts, model, prompt_tokens, cached_tokens, completion_tokens]
    payers: pd.DataFrame  # [ts, pool, model, tenant, route, ..., weighted_tokens, direct, idle]


def _steps(
    client: Client,
    periods: tuple[datetime, datetime, datetime],
    prices: dict[str, float],
    weights: TokenWeights | None,
    step: int,
    tier: str,
    source: str | None,
) -> Steps:
    start, end = periods[0], periods[2]
    scope = Scope(tier=tier)
    if source is not None:
        shares = allocate(client, start, end, prices, weights=weights, step=step, **scope)
        pools, payers, p = shares.pools, shares.payers, shares.plan
    else:
        spend = spend_over_time(client, start, end, prices, step=step, **scope)
        columns = ["spend", "idle_spend", "busy_spend", "up_seconds"]
        pools = spend.groupby(["ts", "model"], as_index=False)[columns].sum().rename(columns={"model": "pool"})
        payers, p = pd.DataFrame(columns=["ts", "pool", "model", "tenant", "route", *TOKENS]), spend.attrs["plan"]
    return Steps(pools, engine_tokens(client, p, "model", step, scope), payers)


def _in(df: pd.DataFrame, a: datetime, b: datetime) -> pd.DataFrame:
    if df.empty:
        return df
    ts = pd.to_datetime(df["ts"], utc=True)
    return df[(ts >= pd.Timestamp(a)) & (ts < pd.Timestamp(b))]


def _side(steps: Steps, view: View, a: datetime, b: datetime) -> tuple[Side, pd.DataFrame]:
    """One period of the view (per hour) for ``cost_parts``, and the pools' particulars."""
    hours = max((b - a).total_seconds(), 1.0) / 3600
    pools = _in(steps.pools, a, b).groupby("pool")[["spend", "idle_spend", "up_seconds"]].sum()
    engine = _in(steps.engine, a, b).groupby("model")[TOKENS].sum()
    pool_tokens = (engine["prompt_tokens"] + engine["completion_tokens"]) if len(engine) else pd.Series(dtype=float)
    payers = _in(steps.payers, a, b)
    index = sorted(set(pools.index) | set(pool_tokens.index) | set(payers["pool"] if len(payers) else []))
    table = pd.DataFrame(index=pd.Index(index, name="pool"))
    table["spend"] = pools["spend"].reindex(index).fillna(0.0) / hours
    table["pool_tokens"] = pool_tokens.reindex(index).fillna(0.0).astype(float) / hours
    if view.payer:
        mine = payers[payers[view.column] == view.value] if len(payers) else payers
        part = mine.groupby("pool")[["direct", "idle"]].sum().sum(axis=1) if len(mine) else pd.Series(dtype=float)
        own = mine.groupby("pool")["weighted_tokens"].sum() if len(mine) else pd.Series(dtype=float)
        every = payers.groupby("pool")["weighted_tokens"].sum() if len(payers) else pd.Series(dtype=float)
        raw = (mine["prompt_tokens"] + mine["completion_tokens"]).groupby(mine["pool"]).sum() if len(mine) else None
        table["view_spend"] = part.reindex(index).fillna(0.0)
        table["view_weighted"] = own.reindex(index).fillna(0.0)
        table["other_weighted"] = every.reindex(index).fillna(0.0) - table["view_weighted"]
        table["view_tokens"] = (raw.reindex(index).fillna(0.0) if raw is not None else 0.0) / hours
        table[["view_spend", "view_weighted", "other_weighted"]] /= hours
    else:
        if view.value is not None:  # one pool
            table = table[table.index == view.value]
        table["view_spend"] = table["spend"]
        table["view_weighted"] = 0.0
        table["other_weighted"] = 0.0
        table["view_tokens"] = table["pool_tokens"]
    x = _f(table["view_tokens"].sum())
    table["idle_share"] = (pools["idle_spend"] / pools["spend"]).reindex(table.index)
    table["replicas"] = (pools["up_seconds"] / (hours * 3600)).reindex(table.index).fillna(0.0)
    cached = engine["cached_tokens"] / engine["prompt_tokens"].replace(0, np.nan) if len(engine) else None
    table["cached_share"] = cached.reindex(table.index) if cached is not None else math.nan
    return Side(table, x), table


def _reason_kind(reason: str) -> str:
    """A route reason without its numbers: 'long prompt (1,100 > 1,024 tokens)' -> 'long prompt'."""
    return re.sub(r"\s*\(.*\)$", "", str(reason)).strip() or "(none)"


def _routes(client: Client, periods: tuple[datetime, datetime, datetime], source: str | None) -> pd.DataFrame:
    """Per tenant, pool, route and reason kind: requests before and after the break, an example
    reason as logged, and the median prompt."""
    columns = [
        "tenant",
        "model",
        "route",
        "reason",
        "example",
        "requests_before",
        "requests_after",
        "prompt_before",
        "prompt_after",
    ]
    if source != "gateway":
        return pd.DataFrame(columns=columns)
    where, params = request_rows(source, None)
    params.update(s=param_time(periods[0]), b=param_time(periods[1]), e=param_time(periods[2]))
    df = query_df(
        client,
        f"""
        SELECT tenant, model, route, route_reason AS example,
               sumIf(weight, ts < {{b:DateTime64(3)}}) AS requests_before,
               sumIf(weight, ts >= {{b:DateTime64(3)}}) AS requests_after,
               medianIf(prompt_tokens, ts < {{b:DateTime64(3)}}) AS prompt_before,
               medianIf(prompt_tokens, ts >= {{b:DateTime64(3)}}) AS prompt_after
        FROM requests WHERE ts >= {{s:DateTime64(3)}} AND ts < {{e:DateTime64(3)}} AND {where} AND model != ''
        GROUP BY tenant, model, route, route_reason""",
        parameters=params,
    )
    if df.empty:
        return pd.DataFrame(columns=columns)
    df["reason"] = df["example"].map(_reason_kind)
    out = (
        df.sort_values("requests_after", ascending=False)
        .groupby(["tenant", "model", "route", "reason"], as_index=False)
        .agg(
            example=("example", "first"),
            requests_before=("requests_before", "sum"),
            requests_after=("requests_after", "sum"),
            prompt_before=("prompt_before", "median"),
            prompt_after=("prompt_after", "median"),
        )
    )
    return out[columns].sort_values(["tenant", "requests_after"], ascending=[True, False], ignore_index=True)


def _flows(payers_b: pd.DataFrame, payers_a: pd.DataFrame) -> pd.DataFrame:
    """Per tenant and pool: tokens and the tenant's share of its tokens in the pool, before and after."""
    columns = ["tenant", "pool", "tokens_before", "tokens_after", "share_before", "share_after"]
    if payers_b.empty and payers_a.empty:
        return pd.DataFrame(columns=columns)
    per = {}
    for name, f in (("before", payers_b), ("after", payers_a)):
        tokens = f["prompt_tokens"] + f["completion_tokens"] if len(f) else pd.Series(dtype=float)
        per[name] = tokens.groupby([f["tenant"], f["pool"]]).sum() if len(f) else pd.Series(dtype=float)
    both = pd.concat(per, axis=1).fillna(0.0)
    both.index.names = ["tenant", "pool"]
    out = both.reset_index().rename(columns={"before": "tokens_before", "after": "tokens_after"})
    for side in ("before", "after"):
        total = out.groupby("tenant")[f"tokens_{side}"].transform("sum")
        out[f"share_{side}"] = (out[f"tokens_{side}"] / total).where(total > 0, 0.0)
    out = out[(out["tokens_before"] > 0) | (out["tokens_after"] > 0)]
    return out[columns].sort_values(["tenant", "pool"], ignore_index=True)


def _movers(flows: pd.DataFrame, routes: pd.DataFrame) -> pd.DataFrame:
    """The tenants whose tokens changed pool: per tenant, the pool it moved to, how much of its
    tokens (share before and after), the route and reason that sent them, and its prompts."""
    columns = [
        "tenant",
        "to_pool",
        "share_before",
        "share_after",
        "moved",
        "tokens_after",
        "route",
        "reason",
        "example",
        "prompt_before",
        "prompt_after",
    ]
    if flows.empty or not (flows["tokens_before"].sum() > 0 and flows["tokens_after"].sum() > 0):
        return pd.DataFrame(columns=columns)
    rows = []
    moved = flows.assign(moved=flows["share_after"] - flows["share_before"])
    for row in _records(
        moved[(moved["moved"] > MOVED) & (moved.groupby("tenant")["tokens_before"].transform("sum") > 0)]
    ):
        tenant, pool = str(row["tenant"]), str(row["pool"])
        r = routes[(routes["tenant"] == tenant) & (routes["model"] == pool)] if len(routes) else routes
        top = r.sort_values("requests_after", ascending=False).iloc[0] if len(r) else None
        rows.append(
            {
                "tenant": tenant,
                "to_pool": pool,
                "share_before": _f(row["share_before"]),
                "share_after": _f(row["share_after"]),
                "moved": _f(row["moved"]),
                "tokens_after": _f(row["tokens_after"]),
                "route": top["route"] if top is not None else "",
                "reason": top["reason"] if top is not None else "",
                "example": top["example"] if top is not None else "",
                "prompt_before": _f(r["prompt_before"].median()) if len(r) else math.nan,
                "prompt_after": _f(r["prompt_after"].median()) if len(r) else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=columns).sort_values("tokens_after", ascending=False, ignore_index=True)


# --------------------------------------------------------------------------- explain


def _periods(
    steps: pd.DataFrame, s: int, at: datetime | None
) -> tuple[tuple[datetime, datetime, datetime] | None, str]:
    """(baseline start, break, end of the rise) from the steps with tokens, or why there are none."""
    first = pd.Timestamp(steps["ts"].iloc[0]).to_pydatetime()
    last = pd.Timestamp(steps["ts"].iloc[-1]).to_pydatetime() + timedelta(seconds=s)
    if at is not None:
        t = pd.Timestamp(as_utc(at)).floor(f"{s}s").to_pydatetime()
        if not first < t < last:
            return None, f"{at:%H:%M:%S} UTC is not inside the steps that served tokens ({first:%H:%M} - {last:%H:%M})"
        return (first, t, last), ""
    values = np.log(np.maximum(steps["value"].to_numpy(float), 1e-12))
    bounds, levels, found = regression(values)
    if found is None:
        return None, "no lasting rise"
    base, start, stop = found
    # the periods begin and end with the steps that served tokens: a window reaching past the fleet's
    # first minutes must not count hours nobody was up in as cheap ones
    ts = steps["ts"]
    end = pd.Timestamp(ts.iloc[bounds[stop]]).to_pydatetime() if stop < len(levels) else last
    return (
        pd.Timestamp(ts.iloc[bounds[base]]).to_pydatetime(),
        pd.Timestamp(ts.iloc[bounds[start]]).to_pydatetime(),
        end,
    ), ""


def explain_cost(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    filters: Filters | None = None,
    weights: TokenWeights | None = None,
    step: float | None = None,
    at: datetime | None = None,
) -> CostExplanation:
    """Find the break in the view's cost per 1M tokens over ``[start, end)`` (or take it ``at`` a
    time) and attribute the change (module docstring)."""
    start, end = as_utc(start), as_utc(end)
    view = _view(client, filters)
    source = log_source(client, start, end, None)
    gateway_gaps = gaps(client, start, end, source)
    if view.payer and (source is None or (view.by == "tenant" and source != "gateway")):
        raise ValueError(
            f"no {'request log' if source is None else 'gateway request log'} between {start:%H:%M} and "
            f"{end:%H:%M} UTC: a {view.by}'s cost needs it (the gateway's log, or the engines' spans for routes "
            "and adapters)" + "".join(f". {gap}" for gap in gateway_gaps)
        )
    series = cost_over_time(client, start, end, prices, by=view.by, step=step, weights=weights, filters=view.pick())
    s, tier = int(series.attrs["step"]), series.attrs["plan"].tier.name
    if view.value is not None:
        series = series[series[view.by] == view.value]
    series = series.rename(columns={"cost_per_million_tokens": "value"})[["ts", "value", "spend", "tokens"]]
    ex = CostExplanation(
        view.words,
        f"request log ({source})" if view.payer else "engine counters",
        s,
        series.reset_index(drop=True),
    )
    ex.problems.extend(gateway_gaps)
    steps = series.dropna(subset=["value"]).reset_index(drop=True)
    needed = MIN_STEPS if at is None else 2  # a break to find, or one given: a step on each side
    if len(steps) < needed:
        ex.sentence = (
            f"not enough steps with tokens for {view.words} between {start:%H:%M} and {end:%H:%M} UTC to "
            f"{'find a' if at is None else 'compare both sides of the'} break ({len(steps)} of {needed})."
        )
        return ex
    periods, why = _periods(steps, s, at)
    if periods is None:
        ex.sentence = (
            f"Cost per 1M tokens of {view.words} shows no lasting rise between {start:%H:%M} and {end:%H:%M} UTC."
            if why == "no lasting rise"
            else f"Cost per 1M tokens of {view.words}: {why}."
        )
        return ex
    ex.break_at, ex.periods = periods[1], periods
    data = _steps(client, periods, prices, weights, s, tier, source)
    (side_b, table_b), (side_a, table_a) = (
        _side(data, view, periods[0], periods[1]),
        _side(data, view, periods[1], periods[2]),
    )
    for name, t in (("before", table_b), ("after", table_a)):
        for pool in t[(t["spend"] > 0) & (t["pool_tokens"] <= 0)].index:
            ex.problems.append(f"{pool} served no tokens {name} the break: its spend is the fleet's all the same")
    try:
        parts = decompose(side_b, side_a, shared=view.payer)
    except ValueError as exc:
        ex.problems.append(f"{exc} for {view.words}: its cost per token is undefined there")
        ex.sentence = f"Cost per 1M tokens of {view.words}: {exc}, so the change cannot be attributed."
        return ex
    ex.before, ex.after = level(side_b) * 1e6, level(side_a) * 1e6
    ex.routes = _routes(client, periods, source)
    ex.flows = _flows(_in(data.payers, periods[0], periods[1]), _in(data.payers, periods[1], periods[2]))
    ex.movers = _movers(ex.flows, ex.routes)
    ex.pools = _pool_rows(table_b, table_a)
    hours = [max((b - a).total_seconds(), 1.0) / 3600 for a, b in zip(periods, periods[1:], strict=False)]
    rates = ex.flows.assign(tokens_before=ex.flows["tokens_before"] / hours[0])
    rates["tokens_after"] = rates["tokens_after"] / hours[1]
    words = Words(view, table_b, table_a, (side_b.x, side_a.x), rates, ex.movers)
    # the view's traffic is one part, whatever pools it passed through (a move is one flow)
    traffic = parts[parts["kind"] == "traffic"]["usd_per_token"].sum()
    rows = parts[parts["kind"] != "traffic"]
    rows = pd.concat(
        [pd.DataFrame([{"kind": "traffic", "pool": "", "usd_per_token": traffic}]), rows], ignore_index=True
    )
    change = ex.after - ex.before
    rows["usd_per_million"] = (rows["usd_per_token"] * 1e6).round(10)  # float noise of exact zeros is no driver
    rows["share"] = (rows["usd_per_million"] / change).round(6) if change else math.nan
    rows["detail"] = [detail(str(k), str(p), words) for k, p in zip(rows["kind"], rows["pool"], strict=True)]
    ex.decomposition = rows.drop(columns=["usd_per_token"]).reset_index(drop=True)
    moved = ex.decomposition["usd_per_million"].abs() > 1e-9 * max(abs(change), 1e-9)
    ex.evidence = ex.decomposition[moved].sort_values("share", ascending=False, ignore_index=True)
    ex.sentence = sentence(ex, words)
    return ex


def _pool_rows(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """The pools' particulars per period, for the page and the JSON document."""
    rows = []
    for name, t in (("before", before), ("after", after)):
        x = max(_f(t["view_tokens"].sum()), 1e-12)
        for pool, r in t.iterrows():
            rows.append(
                {
                    "pool": pool,
                    "period": name,
                    "spend_per_hour": _f(r["spend"]),
                    "view_spend_per_hour": _f(r["view_spend"]),
                    "pool_tokens_per_hour": _f(r["pool_tokens"]),
                    "view_tokens_per_hour": _f(r["view_tokens"]),
                    "view_share": _f(r["view_tokens"]) / x,
                    "cost_per_million_tokens": (
                        _f(r["spend"]) / _f(r["pool_tokens"]) * 1e6 if r["pool_tokens"] > 0 else math.nan
                    ),
                    "replicas": _f(r["replicas"]),
                    "idle_share": _num(r["idle_share"]),
                    "cached_share": _num(r["cached_share"]),
                }
            )
    return pd.DataFrame(rows)
