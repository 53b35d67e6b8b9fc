"""Every read ``explain_cost`` makes of the store beyond the cost series: the view asked for,
the periods' spend and tokens per step, and the gateway's routes.

In:  a client, ``Filters``, the periods (baseline start, break, end), prices, token weights, the
     step and tier of the cost series, and the request-log source.
Out: ``view`` (a ``View``), ``steps`` (``Steps``: each pool's spend, the engines' tokens, the
     payers' tokens and parts per step), ``routes`` (per tenant, pool, route and reason kind:
     requests and median prompt before and after the break), ``scaling`` (the autoscaler's
     scale-outs and scale-ins in the periods, each with its signal and its replica's ready and
     serving times: ``scale_events``).
"""

from __future__ import annotations

import re
from datetime import datetime

import pandas as pd

from analytics.adapters import adapter_pools
from analytics.allocation import TOKENS, TokenWeights, allocate, engine_tokens
from analytics.cost_series import spend_over_time
from analytics.errors import BadInput
from analytics.explain.cost_model import Steps, View
from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.tiers import param_time
from analytics.window import Scope
from storage.clickhouse import Client

__all__ = ["SCALING_COLUMNS", "reason_kind", "routes", "scaling", "steps", "view"]


def view(client: Client, filters: Filters | None) -> View:
    """The view explained: the fleet, one pool, or one payer (tenant, route, adapter)."""
    named = [(dim, getattr(filters, dim)) for dim in ("tenant", "model", "route") if filters and getattr(filters, dim)]
    if len(named) > 1 or any(len(values) > 1 for _dim, values in named) or (filters and filters.replica):
        raise BadInput(
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


def steps(
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


def reason_kind(reason: str) -> str:
    """A route reason without its numbers: 'long prompt (1,100 > 1,024 tokens)' -> 'long prompt'."""
    return re.sub(r"\s*\(.*\)$", "", str(reason)).strip() or "(none)"


def routes(client: Client, periods: tuple[datetime, datetime, datetime], source: str | None) -> pd.DataFrame:
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
    df["reason"] = df["example"].map(reason_kind)
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


SCALING_COLUMNS = [
    "pool",
    "kind",
    "decided_at",
    "from_replicas",
    "to_replicas",
    "signal",
    "value",
    "threshold",
    "crossed_at",
    "replica",
    "ready_at",
    "serving_at",
    "removed_at",
    "decision_id",
]


def scaling(client: Client, periods: tuple[datetime, datetime, datetime]) -> pd.DataFrame:
    """The scale-outs and scale-ins decided in the periods, or whose replica became ready or was removed
    in them (a decision just before the baseline whose replica joined inside it): per decision its pool,
    sizes, signal (value, threshold, when it crossed) and its replica's ready, serving and removed times
    (NaT where it has not happened). Empty where the store has no scale events."""
    params = {"s": param_time(periods[0]), "e": param_time(periods[2])}
    df = query_df(
        client,
        """
        SELECT pool, kind, ts, decision_id, replica, from_replicas, to_replicas, signal, value, threshold, crossed_at
        FROM scale_events
        WHERE decision_id IN (
            SELECT decision_id FROM scale_events
            WHERE kind IN ('scale_out', 'scale_in', 'ready', 'removed')
              AND ts >= {s:DateTime64(3)} AND ts < {e:DateTime64(3)})
        ORDER BY ts""",
        parameters=params,
    )
    if df.empty:
        return pd.DataFrame(columns=SCALING_COLUMNS)
    df["ts"] = pd.to_datetime(df["ts"], utc=True)
    decided = df[df["kind"].isin(["scale_out", "scale_in"])].drop_duplicates("decision_id")
    steps = df[df["kind"].isin(["ready", "serving", "removed"])]
    first = steps.groupby(["decision_id", "kind"])["ts"].min().unstack("kind")
    named = steps[steps["replica"] != ""].groupby("decision_id")["replica"].first()
    out = decided.rename(columns={"ts": "decided_at"}).set_index("decision_id")
    for kind in ("ready", "serving", "removed"):
        out[f"{kind}_at"] = first[kind].reindex(out.index) if kind in first else pd.NaT
        out[f"{kind}_at"] = pd.to_datetime(out[f"{kind}_at"], utc=True)
    out["replica"] = out["replica"].where(out["replica"] != "", named.reindex(out.index)).fillna("")
    out["crossed_at"] = pd.to_datetime(out["crossed_at"], utc=True)
    return out.reset_index()[SCALING_COLUMNS].sort_values(["pool", "decided_at"], ignore_index=True)
