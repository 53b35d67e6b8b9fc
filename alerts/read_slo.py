"""Signal readers of the latency histograms and the SLOs: quantiles, latency over the SLO, burn
rates.

In:  a ``Context`` (the ClickHouse client, the metadata sessions for the SLO targets, the cycle
     cache), a signal's parsed parameters and the evaluation time.
Out: the ``Sample`` list of each signal; ``min_requests_for`` (the fewest requests a percentile
     needs, which ``fleetscope up`` sizes its traffic by). The histogram buckets of a window and
     the SLO targets are read once per cycle (``Context.cache``) and shared by every signal over
     them; every number comes from ``analytics`` (``metrics``, ``latency``, ``slo``).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import pandas as pd

from alerts.errors import SignalError
from alerts.reading import Context, Params, Reader, Sample, window

if TYPE_CHECKING:
    from storage.catalog import SloTarget

__all__ = ["burn", "min_requests_for", "over_slo", "quantile"]


def _buckets(ctx: Context, family: str, start: datetime, end: datetime, by: str = "model") -> pd.DataFrame:
    """``histogram_buckets`` of one window, read once per cycle: p99 TTFT, its p90, the SLO ratio
    and the burn rates over the same window all interpolate in the same buckets."""
    from analytics.metrics import histogram_buckets

    key = ("buckets", family, start, end, by)
    if key not in ctx.cache:
        ctx.cache[key] = histogram_buckets(ctx.client, family, start, end, by)
    buckets: pd.DataFrame = ctx.cache[key]
    return buckets


def quantile(metric: str | None, q: float | None) -> Reader:
    """A reader of the ``q`` quantile of latency ``metric`` (None: the ``metric`` and ``q``
    parameters) per ``by``, interpolated in the engines' histogram buckets."""

    def fn(ctx: Context, p: Params, at: datetime) -> list[Sample]:
        from analytics.latency import LATENCIES
        from analytics.metrics import bucket_quantile

        start, end = window(at, p)
        buckets = _buckets(ctx, LATENCIES[metric or p["metric"]].family, start, end, p["by"])
        level = q if q is not None else p["q"]
        out = []
        for group, part in buckets.groupby(p["by"], sort=True) if len(buckets) else ():
            counts = part["count"].to_numpy(float)
            if counts[-1] > 0:
                out.append(Sample({p["by"]: str(group)}, bucket_quantile(level, part["le"].to_numpy(float), counts)))
        return out

    return fn


def _targets(ctx: Context, metric: str | None = None) -> list[SloTarget]:
    if ctx.sessions is None:
        return []
    from storage.catalog import slo_targets

    key = ("slo-targets",)
    if key not in ctx.cache:
        ctx.cache[key] = slo_targets(ctx.sessions)
    targets: list[SloTarget] = ctx.cache[key]
    return [t for t in targets if metric is None or t.metric == metric]


def min_requests_for(q: float) -> int:
    """The fewest requests whose ``q`` quantile is more than their largest value alone."""
    return 1 if q >= 1 else max(1, math.ceil(1 / (1 - q) - 1e-9))


def over_slo(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.slo import slo_attainment

    targets = _targets(ctx, p["metric"])
    if not targets:
        return []
    start, end = window(at, p)
    df = slo_attainment(ctx.client, targets, start, end, buckets=lambda f, s, e: _buckets(ctx, f, s, e))
    out = []
    for t, row in zip(targets, df.to_dict("records"), strict=True):
        # the p99 of 30 requests is the slowest of them, not a p99: a window answers once it holds
        # enough observations for its percentile (1 / (1 - p): 100 for a p99), or min_requests
        # (the histogram's count: requests for TTFT and e2e, tokens for ITL and TPOT)
        need = p["min_requests"] or min_requests_for(t.percentile or t.objective)
        if need < 0:
            raise SignalError(f"min_requests must be 0 (the percentile's own) or more, not {p['min_requests']:g}")
        requests, observed = row["requests"], row["observed"]
        if requests and requests >= need and not pd.isna(observed):
            out.append(
                Sample({"model": t.model, "metric": t.metric, "slo": t.label}, float(observed) / t.threshold_seconds)
            )
    return out


def burn(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.slo import burn_rates, window_coverage

    targets = _targets(ctx, None if p["metric"] == "any" else p["metric"])
    if not targets:
        return []
    # a window the data covers only in part is not that window: a young fleet's "3 days" are
    # its first minutes; below the stated coverage the signal has no answer (the rule's no_data)
    covered = window_coverage(ctx.client, at - timedelta(seconds=p["window"]), at)
    if covered < p["min_coverage"]:
        return []
    windows = (("x", timedelta(seconds=p["window"]), timedelta(seconds=p["short"]), 0.0),)
    df = burn_rates(ctx.client, targets, at, windows=windows, buckets=lambda f, s, e: _buckets(ctx, f, s, e))
    df["burn"] = df[["burn_long", "burn_short"]].min(axis=1, skipna=False)
    return [
        Sample({"model": r["model"], "metric": r["metric"], "slo": r["label"]}, float(r["burn"]), {"coverage": covered})
        for r in df.to_dict("records")
        if not pd.isna(r["burn"])
    ]
