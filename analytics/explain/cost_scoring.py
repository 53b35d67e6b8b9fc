"""The cost explanation's arithmetic from what ``analytics.explain.cost_queries`` read: pure
pandas, no store.

In:  the cost series' steps with tokens, ``Steps`` and the ``View``, the periods.
Out: ``periods`` (baseline start, break, end of the rise: found on the log of the series, or
     taken at a given time), ``side`` (one period per hour for ``cost_parts``, with the pools'
     particulars), ``flows`` / ``movers`` (whose tokens changed pool), ``pool_rows`` (the pools'
     particulars per period) and ``decomposition`` (the Shapley parts as rows with their share
     of the change and their words).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from analytics.allocation import TOKENS
from analytics.changepoints import regression
from analytics.explain.cost_model import Steps, View, num, records, to_float
from analytics.explain.cost_parts import Side
from analytics.explain.cost_words import MOVED, Words, detail
from common.timeutil import as_utc

__all__ = ["decomposition", "flows", "in_period", "movers", "periods", "pool_rows", "side"]


def in_period(df: pd.DataFrame, a: datetime, b: datetime) -> pd.DataFrame:
    if df.empty:
        return df
    ts = pd.to_datetime(df["ts"], utc=True)
    return df[(ts >= pd.Timestamp(a)) & (ts < pd.Timestamp(b))]


def side(steps: Steps, view: View, a: datetime, b: datetime) -> tuple[Side, pd.DataFrame]:
    """One period of the view (per hour) for ``cost_parts``, and the pools' particulars."""
    hours = max((b - a).total_seconds(), 1.0) / 3600
    pools = in_period(steps.pools, a, b).groupby("pool")[["spend", "idle_spend", "up_seconds"]].sum()
    engine = in_period(steps.engine, a, b).groupby("model")[TOKENS].sum()
    pool_tokens = (engine["prompt_tokens"] + engine["completion_tokens"]) if len(engine) else pd.Series(dtype=float)
    payers = in_period(steps.payers, a, b)
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
    x = to_float(table["view_tokens"].sum())
    table["idle_share"] = (pools["idle_spend"] / pools["spend"]).reindex(table.index)
    table["replicas"] = (pools["up_seconds"] / (hours * 3600)).reindex(table.index).fillna(0.0)
    cached = engine["cached_tokens"] / engine["prompt_tokens"].replace(0, np.nan) if len(engine) else None
    table["cached_share"] = cached.reindex(table.index) if cached is not None else math.nan
    return Side(table, x), table


def flows(payers_b: pd.DataFrame, payers_a: pd.DataFrame) -> pd.DataFrame:
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


def movers(flows: pd.DataFrame, routes: pd.DataFrame) -> pd.DataFrame:
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
    for row in records(
        moved[(moved["moved"] > MOVED) & (moved.groupby("tenant")["tokens_before"].transform("sum") > 0)]
    ):
        tenant, pool = str(row["tenant"]), str(row["pool"])
        r = routes[(routes["tenant"] == tenant) & (routes["model"] == pool)] if len(routes) else routes
        top = r.sort_values("requests_after", ascending=False).iloc[0] if len(r) else None
        rows.append(
            {
                "tenant": tenant,
                "to_pool": pool,
                "share_before": to_float(row["share_before"]),
                "share_after": to_float(row["share_after"]),
                "moved": to_float(row["moved"]),
                "tokens_after": to_float(row["tokens_after"]),
                "route": top["route"] if top is not None else "",
                "reason": top["reason"] if top is not None else "",
                "example": top["example"] if top is not None else "",
                "prompt_before": to_float(r["prompt_before"].median()) if len(r) else math.nan,
                "prompt_after": to_float(r["prompt_after"].median()) if len(r) else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=columns).sort_values("tokens_after", ascending=False, ignore_index=True)


def periods(steps: pd.DataFrame, s: int, at: datetime | None) -> tuple[tuple[datetime, datetime, datetime] | None, str]:
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


def pool_rows(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """The pools' particulars per period, for the page and the JSON document."""
    rows = []
    for name, t in (("before", before), ("after", after)):
        x = max(to_float(t["view_tokens"].sum()), 1e-12)
        for pool, r in t.iterrows():
            rows.append(
                {
                    "pool": pool,
                    "period": name,
                    "spend_per_hour": to_float(r["spend"]),
                    "view_spend_per_hour": to_float(r["view_spend"]),
                    "pool_tokens_per_hour": to_float(r["pool_tokens"]),
                    "view_tokens_per_hour": to_float(r["view_tokens"]),
                    "view_share": to_float(r["view_tokens"]) / x,
                    "cost_per_million_tokens": (
                        to_float(r["spend"]) / to_float(r["pool_tokens"]) * 1e6 if r["pool_tokens"] > 0 else math.nan
                    ),
                    "replicas": to_float(r["replicas"]),
                    "idle_share": num(r["idle_share"]),
                    "cached_share": num(r["cached_share"]),
                }
            )
    return pd.DataFrame(rows)


def decomposition(parts: pd.DataFrame, change: float, words: Words) -> pd.DataFrame:
    """``cost_parts.decompose``'s rows as the explanation shows them: the view's traffic as one
    part (whatever pools it passed through: a move is one flow), each part in USD per 1M tokens,
    its share of ``change`` and its words."""
    traffic = parts[parts["kind"] == "traffic"]["usd_per_token"].sum()
    rows = parts[parts["kind"] != "traffic"]
    rows = pd.concat(
        [pd.DataFrame([{"kind": "traffic", "pool": "", "usd_per_token": traffic}]), rows], ignore_index=True
    )
    rows["usd_per_million"] = (rows["usd_per_token"] * 1e6).round(10)  # float noise of exact zeros is no driver
    rows["share"] = (rows["usd_per_million"] / change).round(6) if change else math.nan
    rows["detail"] = [detail(str(k), str(p), words) for k, p in zip(rows["kind"], rows["pool"], strict=True)]
    return rows.drop(columns=["usd_per_token"]).reset_index(drop=True)
