"""Explain a rise in cost per 1M tokens: find its break, then attribute the change exactly.

In:  a client, a window ``[start, end)``, GPU prices, ``Filters`` (one tenant, model or route is
     the view explained; none: the fleet), ``TokenWeights``, optionally a step.
Out: a ``CostExplanation``:
     - ``series``: ``[ts, value, spend, tokens]``, the view's cost per 1M tokens per step
       (``analytics.cost_series``); ``break_at`` (the start of the rise, found as ``explain``
       finds a latency's: change points on the log, the run that stays 1.5x above the level
       before it), ``before`` / ``after`` (USD per 1M tokens over the two periods) and
       ``periods`` (the baseline's start, the break, the rise's end);
     - ``pools``: per model pool and period: spend, the pool's tokens, the view's tokens in it,
       the view's share ``s``, the pool's cost per 1M ``c``, replicas up, GPU-hours, idle and
       cached shares;
     - ``decomposition``: the change, after - before, as an exact shift-share (Kitagawa) sum over
       pools p of the view's token share s_p and the pool's cost per token c_p = S_p / T_p:
       ``mix`` = sum of delta-s_p x mean c_p (the view's tokens moving between pools of different
       cost) and the rate term sum of mean s_p x delta-c_p, itself split exactly by c_p = S_p x
       (1 / T_p) into ``volume`` (mean s_p x mean S_p x delta(1/T_p): the pool's spend spread over
       more or fewer tokens) and ``spend`` (mean s_p x delta-S_p x mean(1/T_p): replicas added or
       removed, more or less of the window up); for the fleet also ``idle pools`` (the spend of
       pools that served no token, over the fleet's tokens). Means are of before and after, so
       the parts add up to after - before; a pool with no tokens on one side counts as a mix
       move at its cost on the other side. Each row has ``usd_per_million``, ``share`` of the
       change and ``detail`` in words;
     - ``flows``: per tenant and pool, tokens and the tenant's share of its tokens in the pool,
       before and after (whose tokens left or arrived); ``routes``: per tenant, route and
       reason (the gateway's ``route_reason``, its numbers left out to group them), requests
       before and after; ``movers``: the tenants whose tokens changed pool, with the route and
       reason that sent them and their median prompt length before and after;
     - ``evidence``: the decomposition's rows ranked by their share of the change, with the
       router's part beside the volume rows it explains; ``problems``: what could not be
       computed, in words; ``sentence``: one line, "consistent with", with the dollars.
``to_dict`` is the ``fleetscope explain --metric cost --format json`` document.

Tokens are the request log's (weighted rows, the gateway's when it has rows: it knows tenants,
routes and why the router chose them), spend is ``analytics.cost.gpu_spend``'s; without a request
log the fleet and its pools are explained from the engines' counters, with no tenants or routes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

import numpy as np
import pandas as pd

from analytics.changepoints import regression
from analytics.cost import TokenWeights, gpu_spend
from analytics.cost_series import cost_over_time
from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.metrics import counter_increases
from analytics.requests import log_source
from analytics.tiers import param_time
from analytics.vllm import GENERATION_TOKENS, PROMPT_TOKENS
from common.timeutil import as_utc
from storage.clickhouse import Client

__all__ = ["CostExplanation", "explain_cost", "shift_share"]

KINDS = ("mix", "volume", "spend", "idle pools")
MIN_STEPS = 8  # a break needs this many steps with tokens


@dataclass
class CostExplanation:
    view: str  # "the fleet", "tenant acme", "model tiny-small", "route ..."
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


# --------------------------------------------------------------------------- the decomposition


def shift_share(before: pd.DataFrame, after: pd.DataFrame, *, idle_pools: bool = False) -> pd.DataFrame:
    """The exact decomposition of the view's cost per token (module docstring).

    ``before`` / ``after``: indexed by pool, columns ``spend`` (S_p, USD), ``pool_tokens`` (T_p)
    and ``view_tokens`` (x_p <= T_p), each per hour when the periods differ in length (the
    ``volume`` and ``spend`` parts compare rates, not totals). ``idle_pools``: the view is the fleet, so the spend
    of pools
    with no tokens is its own (it is nobody's for a tenant). Returns ``[kind, pool,
    usd_per_token]`` rows whose sum is C_after - C_before; ``ValueError`` when the view has no
    tokens on a side (its cost per token is undefined there)."""
    pools = sorted(set(before.index) | set(after.index))
    b = before.reindex(pools).fillna(0.0)
    a = after.reindex(pools).fillna(0.0)
    xb, xa = _f(b["view_tokens"].sum()), _f(a["view_tokens"].sum())
    if xb <= 0 or xa <= 0:
        raise ValueError("no tokens served " + ("before the break" if xb <= 0 else "after the break"))
    rows: list[dict[str, Any]] = []
    for p in pools:
        tb, ta = _f(b.at[p, "pool_tokens"]), _f(a.at[p, "pool_tokens"])
        sb, sa = _f(b.at[p, "view_tokens"]) / xb, _f(a.at[p, "view_tokens"]) / xa
        spend_b, spend_a = _f(b.at[p, "spend"]), _f(a.at[p, "spend"])
        if tb > 0 and ta > 0:
            cb, ca = spend_b / tb, spend_a / ta
            s_mean = (sb + sa) / 2
            rows.append({"kind": "mix", "pool": p, "usd_per_token": (sa - sb) * (cb + ca) / 2})
            rows.append(
                {"kind": "volume", "pool": p, "usd_per_token": s_mean * (spend_b + spend_a) / 2 * (1 / ta - 1 / tb)}
            )
            rows.append(
                {"kind": "spend", "pool": p, "usd_per_token": s_mean * (spend_a - spend_b) * (1 / tb + 1 / ta) / 2}
            )
        elif tb > 0 or ta > 0:  # the pool served on one side only: all of it is a move
            c = spend_b / tb if tb > 0 else spend_a / ta
            rows.append({"kind": "mix", "pool": p, "usd_per_token": (sa - sb) * c})
    if idle_pools:
        ub = _f(b.loc[b["pool_tokens"] <= 0, "spend"].sum())
        ua = _f(a.loc[a["pool_tokens"] <= 0, "spend"].sum())
        if ub or ua:
            rows.append({"kind": "idle pools", "pool": "", "usd_per_token": ua / xa - ub / xb})
    return pd.DataFrame(rows, columns=["kind", "pool", "usd_per_token"])


def view_cost(table: pd.DataFrame, *, idle_pools: bool = False) -> float:
    """The view's cost per token on one side: sum of s_p c_p (+ idle pools' spend / X)."""
    x = _f(table["view_tokens"].sum())
    served = table[table["pool_tokens"] > 0]
    cost = _f((served["view_tokens"] / x * served["spend"] / served["pool_tokens"]).sum())
    if idle_pools:
        cost += _f(table.loc[table["pool_tokens"] <= 0, "spend"].sum()) / x
    return cost


# --------------------------------------------------------------------------- reads


def _view(filters: Filters | None) -> tuple[str, str | None, str | None]:
    """(the words for the view, the series' ``by``, the value picked): one tenant, model or route."""
    if filters is None:
        return "the fleet", None, None
    named = [(dim, getattr(filters, dim)) for dim in ("tenant", "model", "route") if getattr(filters, dim)]
    if len(named) > 1 or any(len(values) > 1 for _dim, values in named) or filters.replica:
        raise ValueError("explain --metric cost explains one view: the fleet, or one tenant, one model or one route")
    if not named:
        return "the fleet", None, None
    dim, values = named[0]
    return f"{dim} {values[0]}", dim, values[0]


def _period_tables(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    source: str | None,
    dim: str | None,
    value: str | None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per pool: spend, pool tokens and view tokens, each per hour so that periods of different
    lengths compare, and the pool's particulars; per tenant and pool: tokens) over ``[start, end)``."""
    spend = gpu_spend(client, start, end, prices)
    seconds = max((end - start).total_seconds(), 1.0)
    hours = seconds / 3600
    pools = spend.groupby("model").agg(
        spend=("spend", "sum"),
        idle_spend=("idle_spend", "sum"),
        gpu_hours=("gpu_hours", "sum"),
        up_seconds=("up_seconds", "sum"),
    )
    pools["replicas"] = pools["up_seconds"] / seconds
    flows = pd.DataFrame(columns=["tenant", "model", "tokens", "cached"])
    if source is not None:
        where, params = request_rows(source, None)
        params.update(start=param_time(start), end=param_time(end))
        flows = query_df(
            client,
            f"""
            SELECT tenant, model, route, sum(weight * (prompt_tokens + completion_tokens)) AS tokens,
                   sum(weight * cached_tokens) AS cached, sum(weight * prompt_tokens) AS prompt
            FROM requests WHERE ts >= {{start:DateTime64(3)}} AND ts < {{end:DateTime64(3)}} AND {where}
                  AND model != '' AND status_code < 400
            GROUP BY tenant, model, route""",
            parameters=params,
        )
        pool_tokens = flows.groupby("model")["tokens"].sum()
        cached = flows.groupby("model")["cached"].sum() / flows.groupby("model")["prompt"].sum().replace(0, np.nan)
        view = flows if dim is None else flows[flows[dim] == value]
        view_tokens = view.groupby("model")["tokens"].sum()
    else:  # the engines' counters: the fleet and its pools only
        found = counter_increases(client, [PROMPT_TOKENS, GENERATION_TOKENS], start, end, "model")
        pool_tokens = found.groupby("model")["increase"].sum()
        cached = pd.Series(dtype=float)
        view_tokens = pool_tokens if dim is None else pool_tokens[pool_tokens.index == value]
    index = sorted(set(pools.index) | set(pool_tokens.index))
    table = pd.DataFrame(index=pd.Index(index, name="pool"))
    table["spend"] = pools["spend"].reindex(index).fillna(0.0) / hours
    table["pool_tokens"] = pool_tokens.reindex(index).fillna(0.0).astype(float) / hours
    table["view_tokens"] = view_tokens.reindex(index).fillna(0.0).astype(float) / hours
    table["idle_share"] = (pools["idle_spend"] / pools["spend"]).reindex(index)
    table["cached_share"] = cached.reindex(index)
    table["replicas"] = pools["replicas"].reindex(index).fillna(0.0)
    table["gpu_hours"] = pools["gpu_hours"].reindex(index).fillna(0.0)
    return table, flows


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


def _movers(flows_b: pd.DataFrame, flows_a: pd.DataFrame, routes: pd.DataFrame) -> pd.DataFrame:
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
    if flows_b.empty or flows_a.empty:
        return pd.DataFrame(columns=columns)
    shares = {}
    for name, f in (("before", flows_b), ("after", flows_a)):
        per = f.groupby(["tenant", "model"])["tokens"].sum()
        shares[name] = per / per.groupby(level="tenant").transform("sum")
    both = pd.concat(shares, axis=1).fillna(0.0)
    both["moved"] = both["after"] - both["before"]
    rows = []
    tokens_after = flows_a.groupby(["tenant", "model"])["tokens"].sum()
    for key, row in both[both["moved"] > 0.05].iterrows():
        tenant, pool = cast("tuple[str, str]", key)
        r = routes[(routes["tenant"] == tenant) & (routes["model"] == pool)] if len(routes) else routes
        top = r.sort_values("requests_after", ascending=False).iloc[0] if len(r) else None
        rows.append(
            {
                "tenant": tenant,
                "to_pool": pool,
                "share_before": _f(row["before"]),
                "share_after": _f(row["after"]),
                "moved": _f(row["moved"]),
                "tokens_after": _f(tokens_after.get((tenant, pool), 0.0)),
                "route": top["route"] if top is not None else "",
                "reason": top["reason"] if top is not None else "",
                "example": top["example"] if top is not None else "",
                "prompt_before": _f(r["prompt_before"].median()) if len(r) else math.nan,
                "prompt_after": _f(r["prompt_after"].median()) if len(r) else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=columns).sort_values("tokens_after", ascending=False, ignore_index=True)


# --------------------------------------------------------------------------- words


def _money(usd_per_token: float) -> str:
    value = usd_per_token * 1e6
    return f"{'+' if value >= 0 else '-'}${abs(value):,.4g}"


def _pct(before: float, after: float) -> str:
    if before <= 0:
        return "from none"
    return f"{(after / before - 1) * 100:+.0f}%"


def _detail(kind: str, pool: str, b: pd.DataFrame, a: pd.DataFrame, movers: pd.DataFrame) -> str:
    if kind == "idle pools":
        return "spend of pools that served no tokens, over the view's tokens"
    tb, ta = (_f(t.at[pool, "pool_tokens"]) if pool in t.index else 0.0 for t in (b, a))
    if kind == "mix":
        sb, sa = (
            _f(t.at[pool, "view_tokens"]) / max(_f(t["view_tokens"].sum()), 1e-9) if pool in t.index else 0.0
            for t in (b, a)
        )
        return f"the view's tokens in {pool}: {sb:.0%} -> {sa:.0%}"
    if kind == "volume":
        sb_, sa_ = (_f(t.at[pool, "spend"]) if pool in t.index else 0.0 for t in (b, a))
        text = f"{pool}'s tokens per hour {_pct(tb, ta)}, its spend per hour {_pct(sb_, sa_)}"
        per_hour = []
        moved = movers[movers["to_pool"] != pool] if len(movers) else movers
        for row in _records(moved.head(2)):
            per_hour.append(
                f"tenant {row['tenant']} moved {row['share_after']:.0%} of its tokens to {row['to_pool']}"
                + (f" (route {row['route']}: {row['example']})" if row["example"] else "")
            )
        arrived = movers[movers["to_pool"] == pool] if len(movers) else movers
        for row in _records(arrived.head(2)):
            per_hour.append(
                f"tenant {row['tenant']}'s tokens arrived from another pool"
                + (f" (route {row['route']}: {row['example']})" if row["example"] else "")
            )
        return text + ("; " + "; ".join(per_hour) if per_hour else "")
    rb, ra = (_f(t.at[pool, "replicas"]) if pool in t.index else 0.0 for t in (b, a))
    ib, ia = (_f(t.at[pool, "idle_share"]) if pool in t.index else math.nan for t in (b, a))
    idle = f", idle {ib:.0%} -> {ia:.0%}" if not (math.isnan(ib) or math.isnan(ia)) else ""
    return f"{pool}'s replicas up {rb:.1f} -> {ra:.1f}{idle}"


def _sentence(ex: CostExplanation) -> str:
    assert ex.break_at is not None
    change = ex.after - ex.before
    head = (
        f"Cost per 1M tokens of {ex.view} rose from ${ex.before:,.4g} to ${ex.after:,.4g} at "
        f"{ex.break_at:%H:%M:%S} UTC (±{ex.step}s; {_money(change / 1e6)}, {_pct(ex.before, ex.after)})"
    )
    top = ex.evidence[ex.evidence["share"] > 0.05].head(3)
    if top.empty:
        return head + "; no single driver explains it (see the decomposition)."
    parts = []
    for r in _records(top):
        pool, dollars = str(r["pool"]), _f(r["usd_per_million"])
        label = {
            "volume": f"{pool} spreading its spend over {_pct_tokens(ex, pool)} tokens",
            "spend": f"{pool}'s spend",
            "mix": f"the view's tokens moving to {pool}" if dollars > 0 else f"the view's tokens leaving {pool}",
            "idle pools": "pools that served no tokens",
        }[str(r["kind"])]
        parts.append(f"{label} ({_money(dollars / 1e6)}, {_f(r['share']):.0%} of the change)")
    why = ""
    if len(ex.movers):
        m = ex.movers.iloc[0]
        why = (
            f"; tenant {m.tenant}'s requests moved to {m.to_pool} ({m.share_before:.0%} -> {m.share_after:.0%} of its "
            f"tokens)" + (f", routed by {m.route}: {m.example}" if m.example else "")
        )
    return f"{head}. Consistent with {', '.join(parts)}{why}."


def _pct_tokens(ex: CostExplanation, pool: str) -> str:
    p = ex.pools[ex.pools["pool"] == pool].set_index("period")
    if {"before", "after"} <= set(p.index):
        tb, ta = _f(p.at["before", "pool_tokens_per_hour"]), _f(p.at["after", "pool_tokens_per_hour"])
        if tb > 0:
            return f"{abs(ta / tb - 1):.0%} {'fewer' if ta < tb else 'more'}"
    return "fewer"


# --------------------------------------------------------------------------- explain


def explain_cost(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    filters: Filters | None = None,
    weights: TokenWeights | None = None,
    step: float | None = None,
) -> CostExplanation:
    """Find the break in the view's cost per 1M tokens over ``[start, end)`` and attribute it."""
    start, end = as_utc(start), as_utc(end)
    view, dim, value = _view(filters)
    source = log_source(client, start, end, None)
    if dim in ("tenant", "route") and source is None:
        raise ValueError(
            f"no request log between {start:%H:%M} and {end:%H:%M} UTC: a {dim}'s cost needs it "
            "(the gateway's log, or the engines' spans for routes)"
        )
    by = dim or "fleet"
    pick = Filters(**{dim: value}) if dim and value else None
    series = cost_over_time(client, start, end, prices, by=by, step=step, weights=weights, filters=pick)
    s = int(series.attrs["step"])
    if dim:
        series = series[series[dim] == value]
    series = series.rename(columns={"cost_per_million_tokens": "value"})[["ts", "value", "spend", "tokens"]]
    ex = CostExplanation(
        view, f"request log ({source})" if source else "engine counters", s, series.reset_index(drop=True)
    )
    steps = series.dropna(subset=["value"]).reset_index(drop=True)
    if len(steps) < MIN_STEPS:
        ex.sentence = (
            f"not enough steps with tokens for {view} between {start:%H:%M} and {end:%H:%M} UTC to find a "
            f"break ({len(steps)} of {MIN_STEPS})."
        )
        return ex
    values = np.log(np.maximum(steps["value"].to_numpy(float), 1e-12))
    bounds, levels, found = regression(values)
    if found is None:
        ex.sentence = f"Cost per 1M tokens of {view} shows no lasting rise between {start:%H:%M} and {end:%H:%M} UTC."
        return ex
    base, first, last = found
    break_at = pd.Timestamp(steps["ts"].iloc[bounds[first]]).to_pydatetime()
    # the periods begin and end with the steps that served tokens: a window reaching past the fleet's
    # first minutes must not count hours nobody was up in as cheap ones
    baseline_start = pd.Timestamp(steps["ts"].iloc[bounds[base]]).to_pydatetime()
    after_end = (
        pd.Timestamp(steps["ts"].iloc[bounds[last]]).to_pydatetime()
        if last < len(levels)
        else pd.Timestamp(steps["ts"].iloc[-1]).to_pydatetime() + timedelta(seconds=s)
    )
    ex.break_at, ex.periods = break_at, (baseline_start, break_at, after_end)
    table_b, flows_b = _period_tables(client, baseline_start, break_at, prices, source, dim, value)
    table_a, flows_a = _period_tables(client, break_at, after_end, prices, source, dim, value)
    fleet = dim is None
    for name, t in (("before", table_b), ("after", table_a)):
        empty = t[(t["view_tokens"] <= 0) & (t["spend"] > 0) & (t["pool_tokens"] <= 0)]
        for pool in empty.index:
            ex.problems.append(
                f"no tokens served {'before' if name == 'before' else 'after'} the break on {pool}: its "
                "cost per token is undefined there (its spend counts as a pool that served nothing)"
            )
    try:
        parts = shift_share(table_b, table_a, idle_pools=fleet)
    except ValueError as exc:
        ex.problems.append(f"{exc} for {view}: its cost per token is undefined there")
        ex.sentence = f"Cost per 1M tokens of {view}: {exc}, so the change cannot be attributed."
        return ex
    ex.before, ex.after = view_cost(table_b, idle_pools=fleet) * 1e6, view_cost(table_a, idle_pools=fleet) * 1e6
    routes = _routes(client, ex.periods, source)
    ex.routes = routes
    ex.movers = _movers(flows_b, flows_a, routes)
    ex.flows = _flows(flows_b, flows_a)
    rows = []
    for name, t in (("before", table_b), ("after", table_a)):
        x = max(_f(t["view_tokens"].sum()), 1e-9)
        for pool, r in t.iterrows():
            rows.append(
                {
                    "pool": pool,
                    "period": name,
                    "spend_per_hour": _f(r["spend"]),
                    "pool_tokens_per_hour": _f(r["pool_tokens"]),
                    "view_tokens_per_hour": _f(r["view_tokens"]),
                    "view_share": _f(r["view_tokens"]) / x,
                    "cost_per_million_tokens": (
                        _f(r["spend"]) / _f(r["pool_tokens"]) * 1e6 if r["pool_tokens"] > 0 else math.nan
                    ),
                    "replicas": _f(r["replicas"]),
                    "gpu_hours": _f(r["gpu_hours"]),
                    "idle_share": _num(r["idle_share"]),
                    "cached_share": _num(r["cached_share"]),
                }
            )
    ex.pools = pd.DataFrame(rows)
    change = ex.after - ex.before
    parts["usd_per_million"] = (parts["usd_per_token"] * 1e6).round(10)  # float noise of exact zeros is no driver
    parts["share"] = (parts["usd_per_million"] / change).round(6) if change else math.nan
    parts["detail"] = [
        _detail(k, p, table_b, table_a, ex.movers) for k, p in zip(parts["kind"], parts["pool"], strict=True)
    ]
    ex.decomposition = parts.drop(columns=["usd_per_token"]).reset_index(drop=True)
    ex.evidence = ex.decomposition[ex.decomposition["usd_per_million"].abs() > 1e-9].sort_values(
        "share", ascending=False, ignore_index=True
    )
    ex.sentence = _sentence(ex)
    return ex


def _flows(flows_b: pd.DataFrame, flows_a: pd.DataFrame) -> pd.DataFrame:
    """Per tenant and pool: tokens and the tenant's share of its tokens in the pool, before and after."""
    columns = ["tenant", "pool", "tokens_before", "tokens_after", "share_before", "share_after"]
    if flows_b.empty and flows_a.empty:
        return pd.DataFrame(columns=columns)
    per = {
        name: f.groupby(["tenant", "model"])["tokens"].sum() for name, f in (("before", flows_b), ("after", flows_a))
    }
    both = pd.concat(per, axis=1).fillna(0.0)
    out = both.reset_index().rename(columns={"model": "pool", "before": "tokens_before", "after": "tokens_after"})
    for side in ("before", "after"):
        total = out.groupby("tenant")[f"tokens_{side}"].transform("sum")
        out[f"share_{side}"] = (out[f"tokens_{side}"] / total).where(total > 0, 0.0)
    return out[columns].sort_values(["tenant", "pool"], ignore_index=True)
