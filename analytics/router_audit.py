"""The model router's audit: shadow replays on the other model -> agreement, quality gap and the
spend the routing saved, per route reason; and the audit's own load.

In:  a client, a window ``[start, end)``, optionally GPU prices (``{gpu_type: USD per GPU-hour}``:
     then the spend saved), ``filters`` (``analytics.filters.Filters``: model, tenant, route apply
     to the audited decisions) and the usual scope.
Out: ``router_audit``: a DataFrame, one row per (``reason``, ``direction``), the reason being the
     router's rule without its numbers (``long prompt``, ``easy request``, ``high max_tokens``,
     ``tenant rule``); columns:
     - ``routed_model`` / ``shadow_model``: where the router sent the requests, and where the audit
       replayed a sample of them;
     - ``decisions``: the router's decisions with that reason and model (weighted requests of the
       users, shadows excluded); ``audits``: the shadows that answered;
     - ``agreement``: the mean word agreement of the shadow's answer with the routed one (0-1, the
       F1 of their words: ``fleet.quality.evaluators.agreement``, lexical, not semantic);
       ``agreement_low``: the share of audits below ``LOW_AGREEMENT``;
     - ``judged``: audits the judge scored (both answers); ``judge_routed`` / ``judge_shadow``: the
       mean scores (0-1) of the routed and the shadow answers; ``quality_gap`` = shadow - routed
       (> 0: the other model answers better, which for ``small_to_large`` is the quality the
       routing gives up); NaN without a judge;
     - ``tokens_per_hour``: the routed requests' tokens (prompt + completion) per hour;
       ``cost_routed`` / ``cost_other``: the cost per 1M tokens of the routed model's pool and the
       other's (``analytics.cost.cost_per_token`` over the window); ``saved_per_hour`` =
       tokens/h x (other - routed) / 1e6: what sending them to the cheaper model saved (negative:
       what sending them to the dearer one cost); NaN without prices or tokens served.
     ``.attrs``: ``shadow_share`` (the shadows' tokens / the users' tokens in the window, the
     audit's extra load as the store measured it), ``shadow_tokens``, ``user_tokens``, ``audits``,
     ``failed`` (shadows that did not answer).
Reads the gateway's request log (``source = 'gateway'``; migration 0015's audit columns): a shadow
row names the request it shadows (``audit_of``) and carries its route reason; the filters pick
the audited requests (their tenant, model, route), and so the shadows of those.
"""

from __future__ import annotations

from datetime import datetime
from typing import Unpack

import numpy as np
import pandas as pd

from analytics.errors import BadInput
from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.tiers import between, param_time
from analytics.window import Scope
from storage.clickhouse import Client

__all__ = ["LOW_AGREEMENT", "router_audit"]

LOW_AGREEMENT = 0.5
_REASON = "trim(splitByString(' (', route_reason)[1])"
_USERS = f"""
SELECT {_REASON} AS reason, model,
       sum(toFloat64(weight)) AS decisions,
       sum(toFloat64(weight) * (prompt_tokens + completion_tokens)) AS tokens
FROM requests
WHERE {{between}} AND {{condition}} AND audit_of = '' AND startsWith(route, 'model-router') AND outcome = 'ok'
GROUP BY reason, model
"""
_SHADOWS = f"""
SELECT {_REASON} AS reason, audit_direction AS direction, model AS shadow_model,
       countIf(outcome = 'ok') AS audits,
       countIf(outcome != 'ok') AS failed,
       avgIf(r.agreement, r.agreement >= 0) AS mean_agreement,
       countIf(r.agreement >= 0 AND r.agreement < {LOW_AGREEMENT}) AS low,
       countIf(r.judge_routed >= 0 AND r.judge_shadow >= 0) AS judged,
       avgIf(r.judge_routed, r.judge_routed >= 0 AND r.judge_shadow >= 0) AS mean_routed,
       avgIf(r.judge_shadow, r.judge_routed >= 0 AND r.judge_shadow >= 0) AS mean_shadow,
       sum(prompt_tokens + completion_tokens) AS shadow_tokens
FROM requests AS r
WHERE {{between}} AND source = 'gateway' AND audit_of != ''
  AND audit_of IN (SELECT trace_id FROM requests WHERE {{audited}})
GROUP BY reason, direction, shadow_model
"""
_USER_TOKENS = """
SELECT sum(toFloat64(weight) * (prompt_tokens + completion_tokens)) FROM requests
WHERE {between} AND source = 'gateway' AND audit_of = '' AND outcome = 'ok'
"""


def _costs(
    client: Client, start: datetime, end: datetime, prices: dict[str, float] | None, scope: Scope
) -> dict[str, float]:
    """Cost per 1M tokens per model pool over the window ({} without prices)."""
    if not prices:
        return {}
    from analytics.cost import cost_per_token

    df = cost_per_token(client, start, end, prices, by="model", **scope)
    return {str(m): float(c) for m, c in zip(df["model"], df["cost_per_million_tokens"], strict=True)}


def router_audit(
    client: Client,
    start: datetime,
    end: datetime,
    *,
    prices: dict[str, float] | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """The audit per route reason and direction (see the module docstring)."""
    filters: Filters | None = scope.get("filters")
    if end <= start:
        raise BadInput(f"the window must end after it starts ({start} .. {end})")
    params = {"start": param_time(start), "end": param_time(end)}
    condition, extra = request_rows("gateway", filters)
    users = query_df(client, _USERS.format(between=between(False), condition=condition), parameters={**params, **extra})
    # the audits of the decisions the filters keep (a shadow's own row is the audit's tenant)
    audited = f"{between(False)} AND {condition} AND audit_of = ''" if filters else "1"
    shadows = query_df(client, _SHADOWS.format(between=between(False), audited=audited), parameters={**params, **extra})
    user_tokens = float(
        client.query(_USER_TOKENS.format(between=between(False)), parameters=params).result_rows[0][0] or 0
    )
    hours = (end - start).total_seconds() / 3600
    rows = []
    for _, s in shadows.iterrows():
        # the routed model is the other one of the pair: the user's rows with that reason on another model
        candidates = users[(users["reason"] == s["reason"]) & (users["model"] != s["shadow_model"])]
        routed = candidates.sort_values("decisions", ascending=False).head(1)
        decisions = float(routed["decisions"].sum()) if len(routed) else 0.0
        tokens = float(routed["tokens"].sum()) if len(routed) else 0.0
        rows.append(
            {
                "reason": s["reason"],
                "direction": s["direction"],
                "routed_model": str(routed["model"].iloc[0]) if len(routed) else "",
                "shadow_model": s["shadow_model"],
                "decisions": decisions,
                "audits": int(s["audits"]),
                "failed": int(s["failed"]),
                "agreement": float(s["mean_agreement"]) if int(s["audits"]) else np.nan,
                "agreement_low": int(s["low"]) / int(s["audits"]) if int(s["audits"]) else np.nan,
                "judged": int(s["judged"]),
                "judge_routed": float(s["mean_routed"]) if int(s["judged"]) else np.nan,
                "judge_shadow": float(s["mean_shadow"]) if int(s["judged"]) else np.nan,
                "tokens_per_hour": tokens / hours if hours > 0 else np.nan,
                "shadow_tokens": float(s["shadow_tokens"]),
            }
        )
    df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=[*_COLUMNS, "shadow_tokens"])
    df = _money(df, _costs(client, start, end, prices, scope) if rows else {})
    shadow_tokens = float(df["shadow_tokens"].sum()) if len(df) else 0.0
    df.attrs.update(
        shadow_tokens=shadow_tokens,
        user_tokens=user_tokens,
        shadow_share=shadow_tokens / user_tokens if user_tokens > 0 else np.nan,
        audits=int(df["audits"].sum()) if len(df) else 0,
        failed=int(df["failed"].sum()) if len(df) else 0,
    )
    return (
        df.drop(columns=["shadow_tokens"], errors="ignore").sort_values(["direction", "reason"]).reset_index(drop=True)
    )


_COLUMNS = [
    "reason",
    "direction",
    "routed_model",
    "shadow_model",
    "decisions",
    "audits",
    "failed",
    "agreement",
    "agreement_low",
    "judged",
    "judge_routed",
    "judge_shadow",
    "tokens_per_hour",
    "quality_gap",
    "cost_routed",
    "cost_other",
    "saved_per_hour",
]


def _money(df: pd.DataFrame, costs: dict[str, float]) -> pd.DataFrame:
    """The quality gap, each pool's cost per 1M tokens and the spend saved per hour."""
    df = df.copy()
    df["quality_gap"] = df["judge_shadow"] - df["judge_routed"] if len(df) else pd.Series(dtype=float)
    df["cost_routed"] = [costs.get(m, np.nan) for m in df["routed_model"]]
    df["cost_other"] = [costs.get(m, np.nan) for m in df["shadow_model"]]
    df["saved_per_hour"] = df["tokens_per_hour"] * (df["cost_other"] - df["cost_routed"]) / 1e6
    return df[[*_COLUMNS, "shadow_tokens"]]
