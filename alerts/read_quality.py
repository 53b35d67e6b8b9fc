"""Signal readers of answer quality: the refusal and truncation rates of the answers the gateway
scored, and the model router audit's agreement.

In:  a ``Context`` (the ClickHouse client), a signal's parsed parameters and the evaluation time.
Out: the ``Sample`` list of each signal. Every number comes from ``analytics``
     (``quality.quality_rates``, ``router_audit.router_audit``), as the Quality page shows it:
     - ``rate(column)``: per ``by`` group (model, an adapter being its own model; tenant; route)
       the weighted share of the evaluated answers, for groups whose window holds at least
       ``min_evaluated`` evaluated answers (a handful of samples is noise, not a page);
       ``$extra.evaluated`` (weighted evaluated answers), ``$extra.requests``;
     - ``agreement``: per route reason and direction, the audits' mean word agreement of the routed
       and the shadow answer (0-1), for those with at least ``min_audits`` audits;
       ``$extra.audits``, ``$extra.low`` (share of audits below ``analytics.router_audit.LOW_AGREEMENT``),
       ``$extra.quality_gap`` (the judge's shadow - routed score, where judged).
     A window without scored answers (or without audits) gives no sample, not an error.
"""

from __future__ import annotations

import math
from datetime import datetime

import pandas as pd

from alerts.reading import Context, Params, Reader, Sample, window

__all__ = ["agreement", "rate"]


def _rates(ctx: Context, p: Params, at: datetime) -> pd.DataFrame:
    """``quality_rates`` per ``by`` over the window, read once per cycle for every rate signal."""
    from analytics.quality import quality_rates

    start, end = window(at, p)
    key = ("quality_rates", p["by"], start, end)
    if key not in ctx.cache or not ctx.shared:
        ctx.cache[key] = quality_rates(ctx.client, start, end, by=p["by"])
    rates: pd.DataFrame = ctx.cache[key]
    return rates


def rate(column: str) -> Reader:
    """A reader of the quality rate ``column`` (``refusal_rate``, ``truncation_rate``) per ``by``."""

    def fn(ctx: Context, p: Params, at: datetime) -> list[Sample]:
        df = _rates(ctx, p, at)
        df = df[(df["evaluated"] >= p["min_evaluated"]) & df[column].notna()]
        return [
            Sample(
                {p["by"]: str(r[p["by"]])},
                float(r[column]),
                {"evaluated": float(r["evaluated"]), "requests": float(r["requests"])},
            )
            for r in df.to_dict("records")
        ]

    return fn


def agreement(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.router_audit import router_audit

    start, end = window(at, p)
    df = router_audit(ctx.client, start, end)
    df = df[(df["audits"] >= p["min_audits"]) & df["agreement"].notna()]
    out = []
    for r in df.to_dict("records"):
        extra = {"audits": float(r["audits"]), "low": float(r["agreement_low"])}
        if not math.isnan(float(r["quality_gap"])):
            extra["quality_gap"] = float(r["quality_gap"])
        out.append(
            Sample({"route_reason": str(r["reason"]), "direction": str(r["direction"])}, float(r["agreement"]), extra)
        )
    return out
